"""The speculative rule: exact in distribution, deterministic under greedy, vectorised."""

import torch

from sjd.core.sampling import sample_from
from sjd.core.verify import accepted_prefix, residual, stop_slot, verify


def _one_draft_trial(p_target, q_draft, n, seed):
    """n independent one-draft verifications: returns the committed first token of each."""
    g = torch.Generator().manual_seed(seed)
    V = len(p_target)
    drafts = sample_from(q_draft.expand(n, V), torch.rand(n, generator=g))[:, None]
    p = p_target.expand(n, 2, V)
    q = q_draft.expand(n, 1, V)
    n_drafts = torch.ones(n, dtype=torch.long)
    res = verify(p, drafts, q, n_drafts, torch.rand(n, 1, generator=g), torch.rand(n, generator=g))
    return torch.where(res.n_accepted == 1, drafts[:, 0], res.next_token)


def test_first_token_is_distributed_as_the_target_for_any_draft_distribution():
    p = torch.tensor([0.1, 0.4, 0.0, 0.3, 0.2])
    for q in (torch.tensor([0.5, 0.1, 0.2, 0.1, 0.1]), torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0])):
        n = 400_000
        tokens = _one_draft_trial(p, q, n, seed=1)
        freq = torch.bincount(tokens, minlength=5).float() / n
        # 5 sigma of a binomial at n = 400k is < 4e-3.
        torch.testing.assert_close(freq, p, atol=4e-3, rtol=0)


def test_greedy_accepts_exactly_the_matching_prefix_and_commits_the_argmax():
    V = 6
    targets = torch.tensor([[2, 3, 1, 5]])  # argmax of p at each window slot
    p = torch.nn.functional.one_hot(targets, V).float()
    drafts = torch.tensor([[2, 3, 4]])  # third draft is wrong
    q = torch.nn.functional.one_hot(drafts, V).float()
    res = verify(p, drafts, q, torch.tensor([3]), torch.rand(1, 3), torch.rand(1))
    assert res.n_accepted.item() == 2 and res.next_token.item() == 1
    res = verify(
        p,
        torch.tensor([[2, 3, 1]]),
        torch.nn.functional.one_hot(torch.tensor([[2, 3, 1]]), V).float(),
        torch.tensor([3]),
        torch.rand(1, 3),
        torch.rand(1),
    )
    assert res.n_accepted.item() == 3 and res.next_token.item() == 5  # bonus token


def test_rows_verify_only_their_own_drafts():
    V = 4
    p = torch.nn.functional.one_hot(torch.tensor([[1, 1, 1], [1, 2, 3]]), V).float()
    drafts = torch.tensor([[1, 1], [1, 0]])
    q = torch.nn.functional.one_hot(drafts, V).float()
    res = verify(p, drafts, q, torch.tensor([2, 1]), torch.rand(2, 2), torch.rand(2))
    # Row 1 has one real draft (accepted); its bonus comes from slot 1, not its padding draft.
    assert res.n_accepted.tolist() == [2, 1] and res.next_token.tolist() == [1, 2]


def test_residual_falls_back_to_target_when_it_has_no_mass():
    p = torch.tensor([[0.25, 0.75]])
    torch.testing.assert_close(residual(p, p.clone()), p)
    torch.testing.assert_close(residual(p, torch.tensor([[1.0, 0.0]])), torch.tensor([[0.0, 1.0]]))


def test_the_accepted_prefix_stops_at_the_first_failed_or_absent_draft():
    passed = torch.tensor([[True, True, False, True], [True, True, True, True], [False, True, True, True]])
    accepted, n = accepted_prefix(passed, torch.tensor([4, 2, 4]))
    assert n.tolist() == [2, 2, 0]
    assert accepted.tolist() == [[True, True, False, True], [True, True, False, False], [False, True, True, True]]


def test_the_stop_slot_holds_the_rejected_drafts_q_or_nothing_at_the_bonus_slot():
    p = torch.arange(2 * 3 * 2, dtype=torch.float).reshape(2, 3, 2)  # [B, D+1, V]
    q = -torch.arange(2 * 2 * 2, dtype=torch.float).reshape(2, 2, 2) - 1  # [B, D, V]
    p_at, q_at, has_draft = stop_slot(p, q, torch.tensor([1, 2]), torch.tensor([2, 2]))
    assert torch.equal(p_at, torch.stack([p[0, 1], p[1, 2]]))
    assert torch.equal(q_at, torch.stack([q[0, 1], torch.zeros(2)]))  # row 1 passed both: the bonus slot
    assert has_draft.tolist() == [True, False]
    p_at, q_at, has_draft = stop_slot(p[:, :1], q[:, :0], torch.tensor([0, 0]), torch.tensor([0, 0]))  # no drafts
    assert torch.equal(p_at, p[:, 0]) and not q_at.any() and not has_draft.any()
