"""The sync counter (sjd/bench/syncs.py): what it counts as a host sync, and the counts of SJD and AR on the toy."""

import torch

from sjd.bench.syncs import SyncCounter, count_decode, report_row, sync_purposes
from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.harness.prompts import load_prompt_file

PROMPTS = load_prompt_file("sjd/assets/prompts/toy.tsv")[:2]
DRAFTED_PAC = (("csjd_pac_drafter_c2", 3), ("csjd_pac_heads", 1))  # SJD-PAC with a continuation, at a batch size


def test_reads_of_device_tensors_are_syncs_and_reads_of_host_tensors_are_not():
    weight = torch.randn(4, 4)
    counter = SyncCounter([weight])
    with counter:
        x = weight @ torch.ones(4, device="cpu")  # a device weight times a device vector: on the device
        host = torch.tensor([1, 2, 3])  # built on the host: reading it stalls nothing
        x.sum().item()
        host.tolist()
        int(host[0])
        _ = x[x > 0]  # a boolean mask: the result's size is known only on the device
        x[x > 0] = 0.0  # assigning through a mask is not
        n = len(x.tolist())
    where = {site.split(" at ")[0]: count for (_, site), count in counter.counts.syncs.items()}
    assert where == {"item": 1, "__getitem__": 1, "tolist": 1} and n == 4
    assert counter.counts.ops_outside_forward > 0 and not hasattr(weight, "_would_be_on_device")


def test_a_host_tensor_moved_to_the_models_device_is_a_device_tensor_and_the_host_one_stays_host():
    """`.to(adapter.device)` is a no-op when the model runs here, yet on a GPU its result lives there: reading it
    is a sync, and so is the move itself (a copy from pageable host memory). The host tensor it came from (a
    layout's, say) stays a host tensor; `.to("cpu")` is the host."""
    host = torch.tensor([1, -1, 2])
    counter = SyncCounter([])
    with counter:
        moved = host.to(torch.device("cpu"))  # a copy of host data to the device: a sync
        bool(moved[0] >= 0)  # a sync: moved lives on the model's device
        bool(host[0] >= 0)  # not one
        moved.to("cpu")  # a copy to the host: a sync
        n = len(host.tolist())
    assert sum(counter.counts.syncs.values()) == 3 and counter.counts.copies_to_device == 1 and n == 3
    assert not hasattr(host, "_would_be_on_device") and torch.equal(moved, host) and moved is not host


def test_every_copy_of_host_data_to_the_device_is_a_sync_but_a_non_blocking_one_from_pinned_memory():
    """Host lists and host tensors reaching the device (made there, moved there, used there as an index or a value)
    block the host on a GPU; `sjd.core.staging`'s pinned non-blocking copies do not. A Python number or a 0-d host
    tensor rides in a kernel's arguments: no copy."""
    from sjd.core.staging import device_ints, to_device

    weight = torch.zeros(4, 3)
    counter = SyncCounter([weight])
    counter.mark(weight)  # a network's weight (what `watching` marks)
    cpu = torch.device("cpu")
    with counter:
        torch.tensor([1, 2], device=cpu)  # 1
        torch.as_tensor([0, 1], device=cpu)  # 2
        weight.new_tensor([1.0, 2.0, 3.0])  # 3
        weight.copy_(torch.ones(4, 3))  # 4
        _ = weight[[0, 1]]  # 5: a list index is copied over
        _ = weight[torch.tensor([0, 2])]  # 6: so is a host index tensor
        weight[0] = torch.tensor([1.0, 2.0, 3.0])  # 7: a host value written into a device tensor
        weight[1, 2] = 5.0  # a number: a kernel argument, no copy
        _ = weight[torch.tensor(1)]  # a 0-d host tensor: no copy
        staged = device_ints([3, 4], cpu)  # non-blocking from pinned memory: no sync ...
        rows = to_device(torch.tensor([[1], [2]]), cpu)
        _ = weight[staged[0]] + rows  # ... and the results are device tensors (no copy when used)
    syncs = counter.counts.syncs
    assert sum(syncs.values()) == counter.counts.copies_to_device == 7, syncs
    assert all(site.startswith("host-to-device copy") for _, site in syncs)
    assert counter.is_device(staged) and counter.is_device(rows)


def test_only_the_staging_module_asks_for_a_non_blocking_copy():
    """The counter takes a non-blocking copy for one from pinned memory, which sjd.core.staging makes; anywhere else
    a non-blocking copy could be from pageable memory (a sync the counter would miss)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "sjd"
    askers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if "non_blocking=True" in p.read_text())
    assert askers == ["core/staging.py"]


def test_sjd_on_the_toy_syncs_once_an_iteration_and_never_in_the_pipeline(toy):
    """On the static cache SJD syncs once an iteration (the read of the accepted lengths) and AR never; the dynamic
    cache keeps its bookkeeping on the host and copies it to the device in every forward (the published code's
    engine), which the counter counts as the forward's syncs."""
    sampling_cfg = SamplingConfig(cfg_scale=3.0)

    def count(decoder, cache: str):
        gens = make_generators(0, [p.prompt_id for p in PROMPTS], toy.device)
        toy.use_cache(cache)
        try:
            with torch.no_grad():
                counts = count_decode(lambda: decoder.generate(toy, PROMPTS, sampling_cfg, gens), toy, {})
        finally:
            toy.use_cache("dynamic")
        return counts, report_row([counts])

    counts, row = count(SJDDecoder(window=16), "static")
    reads = sum(n for (where, site), n in counts.syncs.items() if " read" in site and where == "decoder")
    assert reads == counts.forwards == row["iterations"]  # one read of the accepted lengths (and NaN flags) a forward
    assert row["pipeline_syncs_per_iter"] == 0 and row["forward_syncs_per_iter"] == 0
    assert row["decoder_syncs_per_iter"] == row["syncs_per_iter"] == 1  # that read; the rest is once a decode
    assert row["copies_to_device_per_iter"] == 0 and row["syncs_once_per_decode"] > 0  # the prefill's ids, ...
    assert "base.py read: the accepted lengths" in sync_purposes(row["decoder_sync_sites"])
    _, dynamic = count(SJDDecoder(window=16), "dynamic")
    assert dynamic["forward_syncs_per_iter"] >= 1 and dynamic["copies_to_device_per_iter"] >= 1
    _, ar = count(ARDecoder(), "static")
    assert ar["syncs_per_iter"] == 0  # nothing a step: the prefill's NaN guard and the result, once a decode


def test_sjd_pac_syncs_once_an_iteration_its_branch_plan_read_with_the_accepted_lengths(toy, one_thread):
    """The tree window's shape depends on how many siblings each row's carried drafts can have: their room comes to
    the host in the one copy of the accepted lengths and siblings, for every chain slot's next draft and for the
    drafts a drafter's or heads' continuation drew before that copy. Nothing else a step, at batch 1 and 3; the
    continuation's first drafts, before the loop, are read once a decode."""
    from decoder_on_model import fitted, resolved_decoder

    from sjd.decoders.sjd_pac import SJDPACDecoder

    toy_prompts = load_prompt_file("sjd/assets/prompts/toy.tsv")
    cases = [(SJDPACDecoder(window=16), toy_prompts[:1]), (SJDPACDecoder(window=16), toy_prompts[:3])]
    cases += [(fitted(resolved_decoder(name, "toy"), toy), toy_prompts[:b]) for name, b in DRAFTED_PAC]
    for decoder, prompts in cases:
        gens = make_generators(0, [p.prompt_id for p in prompts], toy.device)
        toy.use_cache("static")
        try:
            with torch.no_grad():
                counts = count_decode(
                    lambda d=decoder, p=prompts, g=gens: d.generate(toy, p, SamplingConfig(cfg_scale=3.0), g), toy, {}
                )
        finally:
            toy.use_cache("dynamic")
        row = report_row([counts])
        per_site = {(where, site.split(" at ")[1].split(" ", 1)[1]): n for (where, site), n in counts.syncs.items()}
        assert per_site[("decoder", "read")] == counts.forwards, decoder.name  # once every iteration
        assert row["syncs_per_iter"] == row["decoder_syncs_per_iter"] == 1, (decoder.name, row["decoder_sync_sites"])
        assert row["copies_to_device_per_iter"] == 0, decoder.name
        assert per_site.get(("once", "read"), 0) == (decoder.redrafts and decoder.siblings_from_q), decoder.name
        assert "not yet explained" not in sync_purposes(row["decoder_sync_sites"])


def test_the_row_decoders_sync_at_most_once_an_iteration_and_copy_nothing_to_the_device(toy, one_thread):
    """PJD, ZipAR and SSD plan from what the host decided itself (which positions are committed, which have their
    K/V, which have a feature) and send their layouts over in non-blocking copies: no copy of host data to the
    device. PJD and ZipAR read every row segment's outcome (with the NaN/inf flags) in one copy an iteration; SSD
    reads only where a block ends, once for the blocks that end together unless one of them decides its row's
    next draws (the token after it): on the static cache, at batch 3."""
    from decoder_on_model import fitted, resolved_decoder

    from sjd.decoders.zipar import ZipARDecoder

    prompts = load_prompt_file("sjd/assets/prompts/toy.tsv")[:3]
    decoders = [fitted(resolved_decoder("pjd", "toy"), toy), ZipARDecoder(context=2)]
    decoders.append(fitted(resolved_decoder("ssd", "toy"), toy))
    for decoder in decoders:
        gens = make_generators(0, [p.prompt_id for p in prompts], toy.device)
        toy.use_cache("static")
        try:
            with torch.no_grad():
                counts = count_decode(
                    lambda d=decoder, g=gens: d.generate(toy, prompts, SamplingConfig(cfg_scale=3.0), g),
                    toy,
                    decoder.networks(toy),
                )
        finally:
            toy.use_cache("dynamic")
        row = report_row([counts])
        reads = sum(n for (where, site), n in counts.syncs.items() if where == "decoder" and site.endswith(" read"))
        assert row["syncs_per_iter"] == row["decoder_syncs_per_iter"] == reads / counts.forwards, decoder.name
        assert row["copies_to_device_per_iter"] == 0 and row["forward_syncs_per_iter"] == 0, decoder.name
        if decoder.name == "ssd":
            assert 0 < reads < counts.forwards, row["decoder_sync_sites"]  # blocks in their first round read nothing
        else:
            assert reads == counts.forwards, (decoder.name, row["decoder_sync_sites"])
        assert "not yet explained" not in sync_purposes(row["decoder_sync_sites"]), decoder.name


def test_the_drafter_and_coupled_decoders_sync_once_an_iteration(toy):
    """EAGLE-2's tree, LANTERN's relaxed walk, SJD with drafter drafts and coupled SJD (whose fresh drafts read the
    grammar on the host): the committed counts (with the forwards' NaN/inf flags and whether the tree walk
    finished) in one copy an iteration, nothing else; on the static cache."""
    from decoder_on_model import fitted, resolved_decoder

    for name in ("eagle", "lantern", "sjd_drafter", "csjd", "csjd_drafter"):
        decoder = fitted(resolved_decoder(name, "toy"), toy)
        gens = make_generators(0, [p.prompt_id for p in PROMPTS], toy.device)
        toy.use_cache("static")
        try:
            with torch.no_grad():
                counts = count_decode(lambda d=decoder, g=gens: d.generate(toy, PROMPTS, SamplingConfig(), g), toy, {})
        finally:
            toy.use_cache("dynamic")
        row = report_row([counts])
        per_site = {site.split(" at ")[1].split(" ", 1)[1]: n for (_, site), n in counts.syncs.items()}
        assert per_site["read"] == counts.forwards, name
        assert row["pipeline_syncs_per_iter"] == 0 and row["forward_syncs_per_iter"] == 0, name
        assert row["decoder_syncs_per_iter"] < 1.2, (name, row["decoder_sync_sites"])  # + once a decode
        assert "not yet explained" not in sync_purposes(row["decoder_sync_sites"]), name


def test_the_forward_op_constants_are_the_stand_ins_count():
    """FORWARD_OPS_FIXED and FORWARD_OPS_PER_LAYER are what the sync counter counts in one forward of
    transformers' Chameleon (the calibrated stand-in's network), as `scripts/count_syncs.py --forward-ops`."""
    from sjd.bench.bookkeeping import build_model, prompt_batches
    from sjd.bench.syncs import forward_op_counts
    from sjd.core import cost

    adapter, _ = build_model("standin_lumina_512_cal")
    (group,) = prompt_batches("standin_lumina_512_cal", 1, 1)
    fixed, per_layer, layers = forward_op_counts(adapter, [p for p, _ in group])
    assert layers == 2 and (fixed, per_layer) == (cost.FORWARD_OPS_FIXED, cost.FORWARD_OPS_PER_LAYER)
