"""The batch's top-up (sjd.decoders.top_up) gives every row what the per-row functions of sjd.core.drafts give it
alone, and leaves its generator where they leave it: on layouts with and without end-of-line slots and grammar
prefixes, for every scheme, with and without forced drafts, with Gumbel vectors and with the generator's draws."""

import random

import pytest
import torch

from sjd.core.drafts import DISTRIBUTION_SCHEMES, SCHEMES, distribution_drafts, fresh_drafts, one_hot
from sjd.decoders.top_up import top_up_rows
from sjd.decoders.window_state import WindowState
from sjd.types import ImageLayout


def layout_of(height: int, width: int, end_of_line: bool, prefix: int, V: int = 12) -> ImageLayout:
    stride = width + end_of_line
    n = prefix + height * stride + 1
    forced = torch.full((n,), -1, dtype=torch.long)
    forced[:prefix] = torch.arange(prefix)  # begin-of-image and size tokens
    if end_of_line:
        forced[prefix + width : n - 1 : stride] = V - 1
    forced[n - 1] = V - 2  # end of image
    free = torch.zeros(V, dtype=torch.bool)
    free[prefix : V - 2] = True
    return ImageLayout(n, height, width, stride, prefix, forced, free, V)


def random_state(layout: ImageLayout, B: int, rng: random.Random, g: torch.Generator, noise: bool) -> WindowState:
    N, V, S = layout.n_tokens, layout.vocab_size, layout.row_stride
    state = WindowState.empty(B, N, V, torch.device("cpu"), S)
    state.tokens = torch.randint(0, V, (B, N), generator=g)
    for b in range(B):
        state.committed[b] = rng.randint(1, N)
        carried = rng.randint(0, N - state.committed[b])
        state.carried[b] = torch.randint(0, V, (carried,), generator=g)
        state.carried_q[b] = torch.softmax(torch.randn(carried, V, generator=g), -1)
        state.last_p[b] = torch.softmax(torch.randn(V, generator=g), -1) if rng.random() < 0.8 else None
    mass = torch.rand(B, S, V, generator=g) * (torch.rand(B, S, V, generator=g) < 0.6)
    mass[..., 0] += 0.01  # every committed p has mass somewhere
    state.committed_p = mass / mass.sum(-1, keepdim=True)
    if noise:
        state.noise = -torch.log(-torch.log(torch.rand(B, N + 1, V, generator=g)))
    return state


def one_row(scheme: str, force: bool, state: WindowState, b: int, need: int, layout, generator):
    """What the decoder drew for row b before the batch's top-up: the per-row functions, as it called them."""
    n = state.committed[b]
    d, dq = state.carried[b][:need], state.carried_q[b][:need]
    if d.shape[0] == need:
        return d, dq
    known = torch.cat([state.tokens[b, :n], d])
    start, count = n + d.shape[0], need - d.shape[0]
    if scheme in DISTRIBUTION_SCHEMES:
        noise = state.noise[b] if state.noise is not None else None
        new, new_q = distribution_drafts(known, start, count, layout, generator, n, state.committed_p[b], noise, force)
    else:
        left = dq[-1] if d.shape[0] else state.last_p[b]
        new = fresh_drafts(scheme, known, start, count, layout, generator, left, force)
        new_q = one_hot(new, layout.vocab_size)
    return torch.cat([d, new]), torch.cat([dq, new_q])


@pytest.mark.parametrize("scheme", [*SCHEMES, *DISTRIBUTION_SCHEMES])
def test_the_batch_top_up_draws_what_each_row_draws_alone(scheme):
    rng, g = random.Random(0), torch.Generator().manual_seed(0)
    rows = 0
    for trial in range(60):
        layout = layout_of(rng.randint(1, 5), rng.randint(1, 5), rng.random() < 0.5, rng.randint(0, 3))
        B = rng.randint(1, 6)
        state = random_state(layout, B, rng, g, noise=trial % 2 == 0)
        needs = [rng.randint(0, layout.n_tokens - n) for n in state.committed]
        force = rng.random() < 0.7
        seeds = [rng.randint(0, 10**6) for _ in range(B)]
        batch_gens = [torch.Generator().manual_seed(s) for s in seeds]
        row_gens = [torch.Generator().manual_seed(s) for s in seeds]
        batch = top_up_rows(scheme, force, state, needs, layout, batch_gens)
        for b in range(B):
            ids, q = one_row(scheme, force, state, b, needs[b], layout, row_gens[b])
            assert torch.equal(batch[b][0], ids) and torch.equal(batch[b][1], q), (trial, b)
            assert batch[b][1].dtype == q.dtype
            assert torch.equal(batch_gens[b].get_state(), row_gens[b].get_state()), (trial, b)
            rows += needs[b] > len(state.carried[b][: needs[b]])
    assert rows > 50  # most trials top up some row with fresh drafts


def test_an_unknown_scheme_is_named():
    layout = layout_of(2, 2, False, 1)
    state = WindowState.empty(1, layout.n_tokens, layout.vocab_size, torch.device("cpu"))
    with pytest.raises(ValueError, match="decoder.init must be one of"):
        top_up_rows("diagonal", True, state, [1], layout, [torch.Generator()])
