"""The adapter contract: what every model adapter owes the decoders (sjd/models/base.py), written once.

Each adapter's test file subclasses these classes with a tiny random config of the real architecture;
pytest collects the `test_*` methods through the subclasses (`Test...`), never from the bases here.

- `AdapterContract` (every adapter): cached windows against fresh, uncached logits (CFG rows
  included; on both kinds of KV cache), ragged truncation and rewinds, `forward_at` (the `custom_mask`
  capability), greedy AR against the arg-max of fresh guided logits, image decoding, `code_embeddings`, and
  the weights hash.
- `DecodersOnAdapterContract`: greedy lossless decoders equal greedy AR, and sampled decoders keep
  the grammar, commit every token once and do not depend on their batch.
- `LibraryGenerateContract`: greedy AR equals the library's own `generate`.
- `LoadsWeightsContract`: missing weights name the model, the path and the config key.

A subclass provides an `adapter` fixture, `prompts` (of different lengths, where the model's rows can
differ) and the hooks `fresh_logits`, `image_size` and `codebook`; the mixins add their own hooks.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.decoders.base import Decoder, DecodeResult
from sjd.models.base import ModelAdapter
from sjd.models.causal_lm import CACHES
from sjd.models.loading import networks_sha
from sjd.types import CODE_EMBEDDINGS, CUSTOM_MASK, Prompt


def gens(prompts: Sequence[Prompt], seed: int = 0) -> list[torch.Generator]:
    return make_generators(seed, [p.prompt_id for p in prompts], torch.device("cpu"))


@torch.no_grad()
def fresh_causal_lm(model, row: Sequence[int], generated: torch.Tensor, positions=None) -> torch.Tensor:
    """Uncached logits of a causal LM over ids for one unpadded prompt row + generated tokens (at
    generated `positions`, by default 0, 1, ...): output i predicts generated position i."""
    T = len(row)
    ids = torch.cat([torch.as_tensor(row), generated])[None]
    at = torch.arange(len(generated)) if positions is None else torch.as_tensor(positions)
    out = model(input_ids=ids, position_ids=torch.cat([torch.arange(T), T + at])[None])
    return out.logits[0, T - 1 :].float()


def random_codes(layout, batch: int, seed: int) -> torch.Tensor:
    """[batch, n_tokens] token streams: random free ids, the forced id wherever the layout forces one."""
    free = layout.free_token_ids
    pick = torch.randint(len(free), (batch, layout.n_tokens), generator=torch.Generator().manual_seed(seed))
    return torch.where(layout.forced >= 0, layout.forced, free[pick])


def assert_grammar(tokens: torch.Tensor, layout) -> None:
    forced = layout.forced >= 0
    assert (tokens[:, forced] == layout.forced[forced]).all(), "a forced position lost its forced token"
    assert layout.free_tokens[tokens[:, ~forced]].all(), "a free position holds an id the layout does not allow"


@dataclass(frozen=True)
class WindowPlan:
    """Cache moves scaled to the image: a first window from 0, a truncation to two different lengths
    (holes in a rectangular cache), a window from there, then row 0 rewinds into its last window
    while row 1 continues. Scaled so every position stays inside the image (the micro model has 8)."""

    first: int
    kept: tuple[int, int]
    second: int
    rewind: tuple[int, int]
    third: int

    @classmethod
    def for_image(cls, n_tokens: int) -> WindowPlan:
        first = min(12, n_tokens - 2)
        kept = (first * 5 // 12, first * 9 // 12)
        second = first // 2
        rewind = (kept[0] + second // 3, kept[1] + second)
        return cls(first, kept, second, rewind, min(first // 3, n_tokens - rewind[1]))


class AdapterContract:
    prompts: Sequence[Prompt]
    greedy = SamplingConfig(cfg_scale=3.0, temperature=0.0)
    atol = 2e-4  # cached against fresh logits: float32 rounding of a different summation order
    min_distinct_codes = 2  # greedy AR must not collapse to one repeated code (the tiny model steers)

    # -- hooks -----------------------------------------------------------------------------------
    def fresh_logits(
        self, adapter: ModelAdapter, row: int, generated: torch.Tensor, positions: Sequence[int] | None = None
    ) -> torch.Tensor:
        """Uncached float logits [1 + len(generated), V] of CFG-batch row `row` (conditional rows 0..B-1
        for `self.prompts`, then their unconditional rows), built from scratch without padding: output
        0 predicts generated position 0, output i + 1 the token after generated[i], which sits at
        generated position positions[i] (default 0, 1, 2, ...)."""
        raise NotImplementedError

    def image_size(self, adapter: ModelAdapter) -> tuple[int, int]:
        """Pixels (height, width) of one decoded image."""
        raise NotImplementedError

    def codebook(self, adapter: ModelAdapter) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [n_codes], entries [n_codes, D]): the vocabulary id of each VQ code and its codebook entry."""
        raise NotImplementedError

    def decode(self, adapter: ModelAdapter, tokens: torch.Tensor) -> np.ndarray:
        return adapter.decode_images(tokens)

    # -- helpers ---------------------------------------------------------------------------------
    def assert_rows_match(self, adapter, out, start: Sequence[int], generated: Sequence[torch.Tensor]) -> None:
        """out (a window from generated position start[b] of row b) equals fresh logits for every
        conditional and unconditional row; generated[b] holds row b's tokens through the window."""
        B = len(self.prompts)
        for b in range(B):
            width = len(generated[b]) - start[b]
            for branch, row in ((out.cond, b), (out.uncond, B + b)):
                ref = self.fresh_logits(adapter, row, generated[b])[start[b] + 1 : start[b] + 1 + width]
                torch.testing.assert_close(branch[b], ref, atol=self.atol, rtol=0, msg=lambda m, r=row: f"row {r}: {m}")

    def stream(self, adapter, length: int, seed: int) -> torch.Tensor:
        free = adapter.layout.free_token_ids
        g = torch.Generator().manual_seed(seed)
        return free[torch.randint(len(free), (len(self.prompts), length), generator=g)]

    @pytest.fixture(params=CACHES)
    def cache(self, adapter, request):
        """The tests that drive the KV cache run on each kind (sjd/models/cache.py, sjd/models/static_cache.py)."""
        adapter.use_cache(request.param)
        yield request.param
        adapter.use_cache("dynamic")

    # -- the contract ----------------------------------------------------------------------------
    @torch.no_grad()
    @pytest.mark.usefixtures("cache")
    def test_prefill_and_a_window_match_fresh_logits(self, adapter):
        B, plan = len(self.prompts), WindowPlan.for_image(adapter.layout.n_tokens)
        seq = self.stream(adapter, plan.first, seed=0)
        first = adapter.prefill(self.prompts, with_uncond=True)
        assert first.cond.shape[:2] == (B, 1) and first.uncond.shape[:2] == (B, 1)
        for b in range(B):
            none = seq[b, :0]
            torch.testing.assert_close(first.cond[b, 0], self.fresh_logits(adapter, b, none)[0], atol=self.atol, rtol=0)
            ref = self.fresh_logits(adapter, B + b, none)[0]
            torch.testing.assert_close(first.uncond[b, 0], ref, atol=self.atol, rtol=0)
        out = adapter.forward(seq, [0] * B)
        self.assert_rows_match(adapter, out, [0] * B, list(seq))

    @torch.no_grad()
    @pytest.mark.usefixtures("cache")
    def test_ragged_truncation_and_rewind_match_fresh_logits(self, adapter):
        B, plan = len(self.prompts), WindowPlan.for_image(adapter.layout.n_tokens)
        assert B == 2, "the plan moves two rows"
        n = adapter.layout.n_tokens
        seq = self.stream(adapter, n, seed=1)
        adapter.prefill(self.prompts, with_uncond=True)
        adapter.forward(seq[:, : plan.first], [0, 0])
        adapter.truncate(list(plan.kept))  # row 0 keeps fewer positions than row 1: a ragged batch
        window = torch.stack([seq[b, n - plan.second :] for b in range(B)])  # tokens unlike the dropped ones
        out = adapter.forward(window, list(plan.kept))
        generated = [torch.cat([seq[b, : plan.kept[b]], window[b]]) for b in range(B)]
        self.assert_rows_match(adapter, out, list(plan.kept), generated)

        nxt = self.stream(adapter, plan.third, seed=2)
        out = adapter.forward(nxt, list(plan.rewind))
        generated = [torch.cat([generated[b][: plan.rewind[b]], nxt[b]]) for b in range(B)]
        self.assert_rows_match(adapter, out, list(plan.rewind), generated)

    @torch.no_grad()
    @pytest.mark.usefixtures("cache")
    def test_forward_at_matches_fresh_logits(self, adapter):
        """Row 0: two segments, the second at later positions seeing only the first one's committed
        anchor (PJD's window); row 1: one causal segment and a padding slot."""
        if CUSTOM_MASK not in adapter.capabilities:
            with pytest.raises(NotImplementedError, match=CUSTOM_MASK):
                adapter.forward_at(*[torch.zeros(1, 1, dtype=torch.long)] * 2, None, None)
            return
        B, n = len(self.prompts), adapter.layout.n_tokens
        assert B == 2
        gap = min(9, n - 3)
        tok = self.stream(adapter, 7, seed=3)
        positions = torch.tensor([[0, 1, 2, 3, gap, gap + 1, gap + 2], [0, 1, 2, 3, 4, 5, -1]])
        segment = torch.tensor([[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0, -1]])
        committed = torch.zeros(2, 7, dtype=torch.bool)
        committed[:, 0] = True
        idx = torch.arange(7)
        own = (segment[:, :, None] == segment[:, None, :]) & (idx[:, None] >= idx[None, :]) & (segment[:, :, None] >= 0)
        mask = own | (committed[:, None, :] & (positions[:, None, :] < positions[:, :, None]))
        adapter.prefill(self.prompts, with_uncond=True)
        out = adapter.forward_at(tok, positions, torch.zeros(2, n, dtype=torch.bool), mask)
        for branch, offset in ((out.cond, 0), (out.uncond, B)):
            ref = self.fresh_logits(adapter, offset, tok[0, :4])
            torch.testing.assert_close(branch[0, :4], ref[1:], atol=self.atol, rtol=0)
            ref = self.fresh_logits(adapter, offset, tok[0, [0, 4, 5, 6]], [0, gap, gap + 1, gap + 2])
            torch.testing.assert_close(branch[0, 4:], ref[2:], atol=self.atol, rtol=0)
            ref = self.fresh_logits(adapter, offset + 1, tok[1, :6])
            torch.testing.assert_close(branch[1, :6], ref[1:], atol=self.atol, rtol=0)

    @pytest.mark.slow
    @torch.no_grad()
    def test_compiled_windows_match_eager_with_no_graph_break_or_recompile(self, adapter):
        """compile=true on this architecture: windows of one width (padded up to a power of two) compile once, into
        one graph without a break, and give the eager static cache's logits; more windows of widths in the same
        bucket compile nothing more."""
        from torch._dynamo.utils import counters

        B, n = len(self.prompts), adapter.layout.n_tokens
        widths = [3, 3, 4] if n >= 10 else [1, 1, 1]  # one bucket: 4 (3 padded), or 1 on the micro model's 8 tokens
        starts = [0, widths[0], widths[0] + widths[1]]
        seq = self.stream(adapter, sum(widths), seed=4)

        def windows() -> list[torch.Tensor]:
            adapter.prefill(self.prompts, with_uncond=True)
            outs = []
            for start, width in zip(starts, widths):
                out = adapter.forward(seq[:, start : start + width], [start] * B)
                outs += [out.cond, out.uncond]
            return outs

        adapter.use_cache("static")
        eager = windows()
        torch._dynamo.reset()
        breaks, graphs = sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"]
        # compile_windows raises dynamo's process-wide recompile limit; the patch puts it back afterwards
        with torch._dynamo.config.patch(recompile_limit=torch._dynamo.config.recompile_limit):
            try:
                adapter.compile_windows(None)
                compiled = windows()
            finally:
                adapter.uncompile()
                adapter.use_cache("dynamic")
        assert sum(counters["graph_break"].values()) == breaks, dict(counters["graph_break"])
        assert counters["stats"]["unique_graphs"] - graphs == 1  # one bucket, one graph, no recompile
        # a compiled window computes the image codes' columns only (what decoding reads); the others are 0
        codes = torch.zeros(eager[0].shape[-1], dtype=torch.bool)
        codes[adapter.layout.free_columns(torch.device("cpu"))] = True
        for c, e in zip(compiled, eager):
            torch.testing.assert_close(c[..., codes], e[..., codes], atol=self.atol, rtol=0)
            assert not c[..., ~codes].any()

    @torch.no_grad()
    @pytest.mark.usefixtures("cache")
    def test_greedy_ar_takes_the_arg_max_of_fresh_guided_logits(self, adapter):
        """A plain greedy loop written out: at every position, uncond + s * (cond - uncond) from
        logits computed from scratch, restricted to the ids the layout allows there, arg-max. Fed
        AR's own tokens (one fresh forward per row: the model is causal, so output t sees exactly
        the loop's prefix), each of AR's tokens, decoded through prefill and the ragged batched
        cache, must be that arg-max; by induction the loop gives AR's tokens."""
        layout, B, s = adapter.layout, len(self.prompts), self.greedy.cfg_scale
        ar = ARDecoder().generate(adapter, self.prompts, self.greedy, gens(self.prompts)).tokens
        allowed = layout.allowed_table(torch.device("cpu"))[: layout.n_tokens]
        for b in range(B):
            cond = self.fresh_logits(adapter, b, ar[b])[:-1]
            uncond = self.fresh_logits(adapter, B + b, ar[b])[:-1]
            guided = (uncond + s * (cond - uncond)).masked_fill(~allowed, float("-inf"))
            assert torch.equal(guided.argmax(-1), ar[b]), self.prompts[b].prompt_id
        codes = ar[:, layout.forced < 0]
        assert all(len(set(row.tolist())) >= self.min_distinct_codes for row in codes), "a degenerate image"

    def test_decode_images_gives_uint8_pixels_of_the_image_size(self, adapter):
        tokens = random_codes(adapter.layout, 3, seed=4)
        images = self.decode(adapter, tokens)
        assert images.shape == (3, *self.image_size(adapter), 3) and images.dtype == np.uint8
        assert images.std() > 0 and not np.array_equal(images[0], images[1])  # the codes are read

    @torch.no_grad()
    def test_the_weights_hash_covers_each_network_the_adapter_holds(self, adapter):
        """Runs record networks_sha(adapter.networks()) as the weights they decoded with: a change to any network's
        parameters must change it."""
        networks = adapter.networks()
        assert networks, "no network found: keep them as attributes or override networks()"
        before = networks_sha(networks)
        assert networks_sha(networks) == before
        for name, net in networks.items():
            param = next(p for p in net.parameters() if p.numel())
            kept = param.detach().clone()
            param.view(-1)[0] += 1.0
            try:
                assert networks_sha(networks) != before, name
            finally:
                param.copy_(kept)
        assert networks_sha(networks) == before

    def test_code_embeddings_are_the_vq_codebook_at_the_free_ids(self, adapter):
        if CODE_EMBEDDINGS not in adapter.capabilities:
            with pytest.raises(NotImplementedError, match=CODE_EMBEDDINGS):
                adapter.code_embeddings()
            return
        layout = adapter.layout
        ids, entries = self.codebook(adapter)
        table = adapter.code_embeddings()
        assert table.dtype == torch.float32 and table.shape == (layout.vocab_size, entries.shape[1])
        assert sorted(ids.tolist()) == layout.free_token_ids.tolist()
        assert torch.equal(table[ids], entries.detach().float())
        assert table[~layout.free_tokens].abs().sum() == 0


class DecodersOnAdapterContract:
    """Decoders on the real adapter. `greedy_decoders` must equal greedy AR at temperature 0 (lossless,
    or lossy decoders at settings where they are exact); `sampled_decoders` run with `sampled`."""

    sampled = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=20)
    greedy_decoders: dict[str, Decoder] = {}
    sampled_decoders: dict[str, Decoder] = {}

    def check_speed(self, name: str, sampling: SamplingConfig, result: DecodeResult, n_tokens: int) -> None:
        """Per model: evidence that decoder `name` committed several tokens per forward at `sampling`
        (how much a tiny random model allows differs by model)."""

    def pytest_generate_tests(self, metafunc):
        for arg, cases in (("greedy_name", self.greedy_decoders), ("sampled_name", self.sampled_decoders)):
            if arg in metafunc.fixturenames:
                metafunc.parametrize(arg, list(cases), ids=list(cases))

    @pytest.mark.usefixtures("cache")
    def test_greedy_decoder_equals_greedy_ar(self, adapter, greedy_name):
        decoder = self.greedy_decoders[greedy_name]
        decoder.check(adapter)
        n = adapter.layout.n_tokens
        ar = ARDecoder().generate(adapter, self.prompts, self.greedy, gens(self.prompts))
        res = decoder.generate(adapter, self.prompts, self.greedy, gens(self.prompts, seed=7))
        assert torch.equal(ar.tokens, res.tokens)
        assert [sum(a) for a in res.accepted] == [n] * len(self.prompts)
        self.check_speed(greedy_name, self.greedy, res, n)

    def test_sampled_decoder_keeps_the_grammar_and_ignores_the_batch(self, adapter, sampled_name):
        """Left padding, caption masks and ragged caches depend on the batch; the tokens must not."""
        decoder = self.sampled_decoders[sampled_name]
        decoder.check(adapter)
        n = adapter.layout.n_tokens
        res = decoder.generate(adapter, self.prompts, self.sampled, gens(self.prompts))
        assert_grammar(res.tokens, adapter.layout)
        assert [sum(a) for a in res.accepted] == [n] * len(self.prompts)
        self.check_speed(sampled_name, self.sampled, res, n)
        for i, prompt in enumerate(self.prompts):
            alone = decoder.generate(adapter, [prompt], self.sampled, gens([prompt])).tokens
            assert torch.equal(alone[0], res.tokens[i]), prompt.prompt_id


class LibraryGenerateContract:
    """Greedy AR against the model library's own generation loop (transformers' `generate`)."""

    def library_greedy(self, adapter: ModelAdapter, sampling: SamplingConfig) -> torch.Tensor:
        """[B, n_tokens] the library's greedy tokens for `self.prompts` with CFG at sampling.cfg_scale."""
        raise NotImplementedError

    def test_greedy_ar_equals_the_librarys_generate(self, adapter):
        ar = ARDecoder().generate(adapter, self.prompts, self.greedy, gens(self.prompts)).tokens
        library = self.library_greedy(adapter, self.greedy)
        assert library.shape == ar.shape
        for b, prompt in enumerate(self.prompts):
            assert torch.equal(library[b].cpu(), ar[b]), prompt.prompt_id


@dataclass(frozen=True)
class MissingWeights:
    """Constructor arguments naming a checkpoint that is not there, and what the error must name."""

    kwargs: dict
    path: str | Path  # the missing file or directory (or hub id)
    key: str  # the config key to set
    detail: str | None = None  # a further regex the message must match


class LoadsWeightsContract:
    adapter_class: type
    model_name: str
    empty_checkpoint_detail: str | None = None  # what the error says of a directory without a checkpoint

    def missing_weights(self, tmp_path: Path, monkeypatch) -> list[MissingWeights]:
        """Default: an absent weights directory, then one that exists but holds no checkpoint."""
        missing = tmp_path / f"{self.model_name}-weights"
        key = "model.adapter.weights"
        empty = tmp_path / "empty"
        empty.mkdir()
        return [
            MissingWeights({"weights": str(missing)}, missing, key),
            MissingWeights({"weights": str(empty)}, empty, key, self.empty_checkpoint_detail),
        ]

    def test_missing_weights_name_the_model_the_path_and_the_config_key(self, tmp_path, monkeypatch):
        cases = self.missing_weights(tmp_path, monkeypatch)
        assert cases
        for case in cases:
            with pytest.raises(FileNotFoundError) as err:
                self.adapter_class(name=self.model_name, **case.kwargs)
            msg = str(err.value)
            assert repr(self.model_name) in msg and str(case.path) in msg and case.key in msg, msg
            if case.detail:
                assert re.search(case.detail, msg), msg
