"""PJD on the toy model and on a micro model without end-of-line tokens: its layout rules, the
draft anchor of a row whose row above is unfinished, a cache that never keeps a stale slot,
greedy exactness where it must hold, and its errors."""

import pytest
import torch

from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.decoders.pjd import PJDDecoder, RowState
from sjd.decoders.zipar import ZipARDecoder
from sjd.harness.prompts import load_prompt_file
from sjd.models.micro import MicroAdapter
from sjd.types import WINDOW, ImageLayout

PROMPTS = load_prompt_file("sjd/assets/prompts/toy.tsv")[:4]
GREEDY = SamplingConfig(cfg_scale=3.0, temperature=0.0)
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0)


def gens(prompts, seed=0):
    return make_generators(seed, [p.prompt_id for p in prompts], torch.device("cpu"))


@pytest.mark.parametrize("window,init", [(4, "random"), (8, "vertical"), (12, "random")])
def test_greedy_pjd_with_full_row_context_equals_greedy_ar(toy, window, init):
    """With context = the row width a row starts only when the row above is complete, so every
    token sees the whole raster past: PJD must then equal greedy AR token for token."""
    ar = ARDecoder().generate(toy, PROMPTS, GREEDY, gens(PROMPTS))
    pjd = PJDDecoder(window=window, context=toy.layout.width, init=init)
    res = pjd.generate(toy, PROMPTS, GREEDY, gens(PROMPTS, seed=5))
    assert torch.equal(ar.tokens, res.tokens)
    assert all(n < toy.layout.n_tokens for n in res.n_forward)


def test_pjd_rows_overlap_and_keep_the_grammar(toy):
    full = PJDDecoder(context=toy.layout.width).generate(toy, PROMPTS, SAMPLED, gens(PROMPTS))
    res = PJDDecoder(window=8, context=4).generate(toy, PROMPTS, SAMPLED, gens(PROMPTS))
    forced = toy.layout.forced
    assert (res.tokens[:, forced >= 0] == forced[forced >= 0]).all()
    assert toy.layout.free_tokens[res.tokens[:, forced < 0]].all()
    assert [sum(a) for a in res.accepted] == [toy.layout.n_tokens] * len(PROMPTS)
    # Rows decoded in parallel need fewer forwards than rows decoded one after another.
    assert sum(res.n_forward) < sum(full.n_forward)


def test_pjd_needs_the_custom_mask_capability():
    micro = MicroAdapter()
    micro.capabilities = frozenset({WINDOW})
    with pytest.raises(ValueError, match=r"'pjd' needs model capabilities \['custom_mask'\].*'micro'"):
        PJDDecoder(context=1).check(micro)


def test_pjd_refuses_layouts_it_cannot_anchor(toy):
    with pytest.raises(ValueError, match="decoder.context=13 exceeds the 12 codes"):
        PJDDecoder(context=13).check(toy)
    micro = MicroAdapter()
    layout = micro.layout
    # Rows of `width` tokens, yet the end-of-line tokens are still in the stream: they fall outside the grid.
    micro.layout = type(layout)(**{**vars(layout), "row_stride": layout.width})
    with pytest.raises(ValueError, match="outside the code grid of model 'micro' to be grammar-forced"):
        PJDDecoder(context=1).check(micro)
    micro.layout = type(layout)(**{**vars(layout), "row_stride": layout.width + 2})
    with pytest.raises(ValueError, match="rows of 4 tokens for 2 codes"):
        PJDDecoder(context=1).check(micro)


# -- layouts without end-of-line tokens (LlamaGen, Janus, Anole) -----------------------------------
def no_eol_micro(height: int = 4, width: int = 5, n_codes: int = 3, seed: int = 0) -> MicroAdapter:
    """The micro model with Anole's grammar: begin-of-image, height x width codes, end-of-image."""
    micro = MicroAdapter(height=height, width=width, n_codes=n_codes, seed=seed, name="micro_no_eol")
    n = 1 + height * width + 1
    forced = torch.full((n,), -1, dtype=torch.long)
    forced[0], forced[-1] = micro.boi, micro.eoi
    lay = micro.layout
    micro.layout = ImageLayout(n, height, width, width, 1, forced, lay.free_tokens, lay.vocab_size)
    return micro


@pytest.fixture(scope="module")
def no_eol(one_thread):
    return no_eol_micro()


def pos(layout, r, c):
    return layout.first_code + r * layout.row_stride + c


@pytest.mark.parametrize("window,init", [(2, "random"), (4, "vertical"), (8, "random")])
def test_no_eol_greedy_pjd_with_full_row_context_equals_greedy_ar(no_eol, window, init):
    ar = ARDecoder().generate(no_eol, PROMPTS, GREEDY, gens(PROMPTS))
    res = PJDDecoder(window=window, context=no_eol.layout.width, init=init).generate(
        no_eol, PROMPTS, GREEDY, gens(PROMPTS, seed=5)
    )
    assert torch.equal(ar.tokens, res.tokens)
    assert [sum(a) for a in res.accepted] == [no_eol.layout.n_tokens] * len(PROMPTS)


def blank_state(layout, done, started) -> RowState:
    """A state whose rows have their first `done` codes committed and written (each the first image code)."""
    pjd = PJDDecoder()
    s = pjd._initial_state(layout, layout.forced[:1], torch.device("cpu"))
    s.done, s.started = list(done), list(started)
    for r, d in enumerate(done):
        span = slice(pos(layout, r, 0), pos(layout, r, d))
        s.tokens[span] = layout.free_token_ids[0]
        s.committed[span] = True
    s.written = s.committed.clone()
    return s


def test_a_row_under_an_unfinished_row_is_anchored_on_a_draft_only_it_sees(no_eol):
    lay = no_eol.layout
    pjd = PJDDecoder(window=8, context=2)
    # Row 0 complete, row 1 has 2 of 5 codes, row 2 started with none: row 1's last code P is not committed.
    s = blank_state(lay, done=[5, 2, 0, 0], started=[True, True, True, False])
    plan = pjd.plan(s, lay, torch.Generator().manual_seed(0))
    P = pos(lay, 1, 4)
    assert [seg.row for seg in plan] == [1, 2]
    row1, row2 = plan
    assert row1.positions == list(range(pos(lay, 1, 1), P + 1)) and row1.anchor_draft is None
    assert row2.positions == [P, pos(lay, 2, 0), pos(lay, 2, 1)]
    assert row2.n_committed == 0 and row2.anchor_draft == row1.drafts[-1]  # row 1's own draft of P

    tokens, positions, mask = pjd.window_inputs([plan], [s], lay.n_tokens, torch.device("cpu"))
    anchor = len(row1.positions)  # row 2's first slot
    assert positions[0].tolist() == row1.positions + row2.positions
    assert tokens[0, anchor] == row2.anchor_draft and not s.committed[P]
    # Only row 2's own slots see its anchor; row 2 sees row 1's committed anchor, never row 1's drafts.
    assert mask[0, :, anchor].tolist() == [False] * anchor + [True] * 3
    assert mask[0, anchor:, 0].all() and not mask[0, anchor:, 1:anchor].any()
    assert not mask[0, :anchor, anchor:].any()

    # Row 1 commits through its last code in this forward: P sat twice in the window, so it is not written
    # (a later forward rewrites it, which drops both cached slots), while row 1's other codes are.
    s.tokens[pos(lay, 1, 2) : P + 1] = row1.drafts
    s.committed[pos(lay, 1, 2) : P + 1] = True
    holds = [True] * len(row1.positions) + [False] * len(row2.positions)  # row 1's drafts all committed as they were
    PJDDecoder.mark_written(s, plan, positions[0], holds)
    assert not s.written[P]
    assert s.written[pos(lay, 1, 1) : P].all()
    assert not s.written[pos(lay, 2, 0) : -1].any()  # rows 2 and 3 hold no written code yet

    # Next iteration: row 1 is finished and its last code is row 2's committed anchor, listed once.
    s.done[1] = 5
    plan = pjd.plan(s, lay, torch.Generator().manual_seed(0))
    assert [seg.row for seg in plan] == [2]
    assert plan[0].positions[0] == P and plan[0].n_committed == 1 and plan[0].anchor_draft is None


def test_a_draft_anchor_comes_from_the_carried_drafts_or_fresh(no_eol):
    lay = no_eol.layout
    pjd = PJDDecoder(window=1, context=2, init="vertical")
    s = blank_state(lay, done=[5, 2, 0, 0], started=[True, True, True, False])
    s.carried[1] = torch.tensor([5, 6, 7])  # drafts of row 1's columns 2, 3, 4
    plan = pjd.plan(s, lay, torch.Generator().manual_seed(0))
    assert plan[0].drafts.tolist() == [5] and plan[1].anchor_draft == 7  # carried, beyond row 1's window

    # No draft of column 4: a fresh one, drafted from column 3 on; vertical copies row 0's committed code.
    s.carried[1] = torch.tensor([6])
    s.tokens[pos(lay, 0, 4)] = 7
    plan = pjd.plan(s, lay, torch.Generator().manual_seed(0))
    assert plan[1].anchor_draft == 7

    # Row 3 under row 2 under an unfinished row 1: the codes above row 2's last columns are not committed, so
    # the fresh anchor never copies them; it repeats row 2's own last draft (horizontal) instead.
    s = blank_state(lay, done=[5, 3, 2, 0], started=[True] * 4)
    plan = pjd.plan(s, lay, torch.Generator().manual_seed(0))
    assert [seg.row for seg in plan] == [1, 2, 3]
    assert plan[1].positions == [pos(lay, 2, 1), pos(lay, 2, 2)]  # row 2 drafts column 2 only
    assert plan[-1].anchor_draft == plan[-2].drafts[-1]
    assert plan[-1].positions[0] == pos(lay, 2, 4)

    # Once a row has a code of its own, that code is its (committed) anchor.
    s = blank_state(lay, done=[5, 5, 3, 2], started=[True] * 4)
    plan = pjd.plan(s, lay, torch.Generator().manual_seed(0))
    assert plan[-1].row == 3 and plan[-1].n_committed == 1 and plan[-1].anchor_draft is None


class CacheWatch:
    """Records every forward_at and checks the adapter's real cache: each cached generated position has
    one live slot, written by a committed (never a draft-anchor) input holding the token committed there."""

    def __init__(self, adapter, decoder):
        self.adapter, self.decoder = adapter, decoder
        self.slots: list[dict[int, list[tuple[int, bool]]]] = []  # per batch row: position -> (token, draft anchor)
        self.kept: list[list[tuple[int, int, int]]] = []  # (row, position, token) of every cached slot reused
        self.anchor_windows = self.doubled_commits = 0
        forward_at, window_inputs = adapter.forward_at, decoder.window_inputs

        def watched_inputs(plans, states, n_tokens, device):
            self.plans = plans
            return window_inputs(plans, states, n_tokens, device)

        def watched_forward(tokens, positions, keep, window_mask, *rest):
            B, W = positions.shape
            if not self.slots:
                self.slots = [{} for _ in range(B)]
            for b in range(B):
                flags, i = [], 0
                for seg in self.plans[b]:
                    flags += [seg.anchor_draft is not None] + [False] * (len(seg.positions) - 1)
                self.anchor_windows += any(flags)
                for p in list(self.slots[b]):
                    if not keep[b, p] or p in positions[b]:
                        del self.slots[b][p]
                for p, entries in self.slots[b].items():
                    assert len(entries) == 1, f"position {p} cached {len(entries)} times"
                    assert not entries[0][1], f"position {p} cached from a draft anchor"
                    self.kept.append((b, p, entries[0][0]))
                for i, p in enumerate(positions[b].tolist()):
                    if p >= 0:
                        self.slots[b].setdefault(p, []).append((int(tokens[b, i]), flags[i]))
                dup = [p for p, e in self.slots[b].items() if len(e) > 1]
                self.doubled_commits += len(dup)
            out = forward_at(tokens, positions, keep, window_mask, *rest)
            cache = adapter._cache  # the real one: no position twice among the slots kept from before
            gen = cache.slot_pos[:B, :-W] - cache.prompt_len[:B, None]
            for b in range(B):
                live = gen[b][(cache.slot_pos[b, :-W] >= 0) & (gen[b] >= 0)].tolist()
                assert len(live) == len(set(live)), f"row {b}: duplicate cached positions {sorted(live)}"
            return out

        adapter.forward_at, decoder.window_inputs = watched_forward, watched_inputs

    def check_tokens(self, tokens: torch.Tensor) -> None:
        for b, p, token in self.kept:
            assert tokens[b, p] == token, f"row {b}: cached token at {p} is not the committed one"


@pytest.mark.parametrize(
    "decoder",
    [PJDDecoder(window=3, context=2), PJDDecoder(window=8, context=1, init="vertical"), ZipARDecoder(context=2)],
    ids=["pjd-w3-c2", "pjd-w8-c1-vertical", "zipar-c2"],
)
def test_no_eol_rows_overlap_and_the_cache_never_keeps_a_stale_slot(decoder):
    micro = no_eol_micro()
    watch = CacheWatch(micro, decoder)
    res = decoder.generate(micro, PROMPTS, SAMPLED, gens(PROMPTS, seed=1))
    lay = micro.layout
    forced = lay.forced
    assert (res.tokens[:, forced >= 0] == forced[forced >= 0]).all()
    assert lay.free_tokens[res.tokens[:, forced < 0]].all()
    assert [sum(a) for a in res.accepted] == [lay.n_tokens] * len(PROMPTS)
    watch.check_tokens(res.tokens)
    assert watch.anchor_windows > 0 and len(watch.kept) > 0
    if decoder.window:  # a row's draft of its last code and the next row's anchor shared a window
        assert watch.doubled_commits > 0
    # Rows decoded in parallel need fewer forwards than AR's one per code.
    assert all(n < lay.n_tokens - 1 for n in res.n_forward)


def test_pjd_config_errors_come_before_any_model_is_loaded():
    for kwargs, key in (
        ({"window": 0}, "decoder.window"),
        ({"keep_threshold": 1.5}, "decoder.keep_threshold"),
        ({"init": "diagonal"}, "decoder.init"),
    ):
        with pytest.raises(ValueError, match=key):
            PJDDecoder(**kwargs)
