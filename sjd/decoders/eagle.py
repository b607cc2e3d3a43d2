"""EAGLE-2 (Li et al., EMNLP 2024) and EAGLE-1 (ICML 2024): a trained drafter grows a draft tree, one target
forward verifies the whole tree (docs/algorithms.md §12).

Each iteration:
1. draft: the drafter (sjd.drafters) has caught up on every committed token; it grows a tree under the root,
   the last committed token, which the target has not seen yet (sjd.drafters.tree);
2. forward: root and nodes go through the target in one `forward_at`, each node seeing the committed tokens,
   its ancestors and itself (the custom-mask capability); node slots are transient;
3. verify: from the root, descend while a child is accepted (sjd.core.tree_verify): `eagle` tests its
   deterministic top-k children with q = 1 (accept x iff u < p(x), else remove x from p), EAGLE-2's rule,
   which is exact for any child set chosen without the verification coins; `eagle_sampled` draws children
   from q without replacement and tests them by recursive rejection sampling (EAGLE-1's rule);
4. commit: the accepted path and the next token; the target keeps the path's keys and values (`keep_slots`),
   and the drafter catches up on the pairs (f_root, t_1) .. (f_last, next token), whose features the
   target's forward just computed.

Batch > 1: every row has its own tree, its own accepted length and its own caches' lengths, and draws its
uniforms from its own generator, so a row's tokens do not depend on its batch.

Settings (conf/decoder/eagle.yaml): `tree` (`dynamic`, or a static shape such as `mc_sim_7b_63`), `depth`,
`top_k` and `total_tokens` (EAGLE-2's; the target forward is `total_tokens` wide: the root and the nodes),
`children` (`top_k` or `sampled`), and `drafter.weights` (sjd.drafters.checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from sjd.core.sampling import SamplingConfig, logits_to_probs
from sjd.core.tree_verify import TreeWalk, sample_and_descend, walk_tree
from sjd.core.verify import recursive_rejection
from sjd.decoders.base import DecodeCall, Decoder, DecodeResult, ForwardClock
from sjd.decoders.drafter_part import DrafterPart
from sjd.drafters.checkpoint import drafter_settings, load_drafter
from sjd.drafters.drafter import DrafterRun
from sjd.drafters.tree import CHILDREN, STATIC_SHAPES, DraftTree, check_static_shape, child_q, grow
from sjd.models.base import ModelAdapter
from sjd.types import CUSTOM_MASK, FEATURES, WINDOW, Prompt


@dataclass(eq=False, kw_only=True)
class EagleDecoder(DrafterPart, Decoder):
    requires = frozenset({WINDOW, CUSTOM_MASK, FEATURES})

    name: str = "eagle"
    drafter: dict | None = None
    tree: str = "dynamic"
    depth: int = 7
    top_k: int = 10
    total_tokens: int = 60
    children: str = "top_k"

    def __post_init__(self) -> None:
        self.drafter = drafter_settings(self.drafter, self.name, "full")  # the published drafters run the full head
        if self.tree != "dynamic":
            check_static_shape(self.tree)
        if self.children not in CHILDREN:
            raise ValueError(f"decoder.children must be one of {CHILDREN}, got {self.children!r}")
        if self.lossless and self.tree == "dynamic" and self.children == "sampled":
            # A dynamic tree keeps a sampled child by its score, which depends on the child's own token, so
            # whether it is there to be tested depends on its value and recursive rejection no longer gives p
            # (docs/algorithms.md §12.4 has a counterexample).
            raise ValueError(
                f"decoder {self.name!r}: decoder.children=sampled with decoder.tree=dynamic is not exact (a dynamic "
                "tree keeps a sampled child only if its own score, which depends on its token, passes a cut); use a "
                "static tree (decoder.tree=mc_sim_7b_63, as eagle_sampled does) or decoder.children=top_k"
            )
        if self.depth < 1 or self.top_k < 1 or self.total_tokens < 2:
            raise ValueError(
                f"decoder.depth and decoder.top_k must be >= 1 and decoder.total_tokens >= 2, got {self.depth}, "
                f"{self.top_k}, {self.total_tokens}"
            )

    # -- the loop ---------------------------------------------------------------------------------------
    def generate(
        self,
        adapter: ModelAdapter,
        prompts: Sequence[Prompt],
        sampling: SamplingConfig,
        generators: Sequence[torch.Generator],
    ) -> DecodeResult:
        call = DecodeCall(adapter, ForwardClock(adapter), sampling, generators)
        clock, layout, device, B = call.clock, call.layout, call.device, len(prompts)
        N = layout.n_tokens
        tokens = torch.zeros(B, N, dtype=torch.long, device=device)
        tokens[:, 0] = clock.start(prompts, sampling, generators)
        run = DrafterRun(
            load_drafter(adapter, self.drafter["weights"]),
            adapter,
            sampling,
            B,
            self.scratch(),
            clock.lap,
            code_head=self.drafter["head"] == "codes",
        )
        run.start(clock.prefill_features, tokens[:, 0])
        committed = torch.ones(B, dtype=torch.long, device=device)
        accepted, n_forward = [[1] for _ in range(B)], [1] * B
        clock.defer_finite_check = True  # commit reads the rows' counts and the NaN/inf flags in one copy
        done = [1] * B  # committed, on the host (from the counts commit reads)

        while any(n < N for n in done):
            active = committed < N
            tree = self.draft(run, committed - 1, generators)
            clock.lap("draft")
            p, features = self.forward(clock, tokens, committed - 1, tree, active, call)
            clock.lap("pipeline")
            walk = self.verify(adapter, p, tree, generators)
            clock.lap("verify")
            took = self.commit(adapter, run, tokens, committed, tree, walk, features, active, clock.read)
            clock.lap("commit")
            for b, take in enumerate(took):
                if take:
                    accepted[b].append(take)
                    n_forward[b] += 1
                    done[b] += take

        return self.finish(clock, tokens, n_forward, accepted, run)

    def finish(
        self, clock: ForwardClock, tokens: torch.Tensor, n_forward: list[int], accepted: list[list[int]], run
    ) -> DecodeResult:
        """The decode's result, with the drafter's forwards per row read to the host once, after the loop."""
        result = clock.finish(tokens, n_forward, accepted)
        result.extras["drafter_forwards"] = run.row_forwards.tolist()
        result.extras["window_inputs"] = [(n - 1) * self.total_tokens for n in n_forward]
        return result

    # -- phases -----------------------------------------------------------------------------------------
    def scratch(self) -> int:
        """Drafter cache slots a tree needs: one per expanded node."""
        if self.tree == "dynamic":
            return self.top_k * self.depth
        return max(1, len({tuple(p[:-1]) for p in STATIC_SHAPES[self.tree]} - {()}))

    def levels(self) -> int:
        """Verification levels: the tree's deepest node plus the draw after it."""
        if self.tree == "dynamic":
            return self.depth + 2
        return max(len(p) for p in STATIC_SHAPES[self.tree]) + 1

    def draft(self, run: DrafterRun, root_pos: torch.Tensor, generators) -> DraftTree:
        """The draft tree of every row under its root (the last committed token)."""
        return grow(run, root_pos, self.tree, self.depth, self.top_k, self.total_tokens, self.children, generators,
                    self.keeps_node_q())  # fmt: skip

    def keeps_node_q(self) -> bool:
        """Whether verification reads the q each node's children were drawn from (sampled children do)."""
        return self.children == "sampled"

    def forward(
        self, clock: ForwardClock, tokens: torch.Tensor, root_pos: torch.Tensor, tree: DraftTree, active, call
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Root and nodes through the target; p at every node [B, n, V] and the target's hidden states."""
        layout, device = call.layout, call.device
        rows = torch.arange(len(root_pos), device=device)
        window = tree.tokens.clone()
        window[:, 0] = tokens[rows, root_pos.clamp(max=layout.n_tokens - 1)]
        live = tree.present & active[:, None]
        positions = torch.where(live, root_pos[:, None] + tree.depth, -1)
        keep = torch.arange(layout.n_tokens, device=device)[None, :] < root_pos[:, None]
        logits = clock.forward_at(window, positions, keep, tree.mask, tree.depth > 0)
        predicted = torch.where(positions >= 0, positions + 1, layout.n_tokens).clamp(max=layout.n_tokens)
        p = logits_to_probs(logits, predicted, layout, call.sampling)
        return p, logits.features.hidden

    def verify(self, adapter: ModelAdapter, p: torch.Tensor, tree: DraftTree, generators) -> TreeWalk:
        """Descend the tree (sjd.core.tree_verify) with each row's own uniforms."""
        L, K = self.levels(), self.top_k
        u = torch.stack([torch.rand(L * (K + 1), generator=g, device=p.device) for g in generators])
        accept_u, sample_u = u[:, : L * K].view(-1, L, K), u[:, L * K :]
        rule = self.node_rule(adapter)
        return walk_tree(p, tree.tokens, tree.children, tree.depth, tree.mask, self.candidate_q(tree), accept_u,
                         sample_u, rule)  # fmt: skip

    def candidate_q(self, tree: DraftTree) -> torch.Tensor:
        """[B, N, K, V] what each child of each node was drawn from: one-hot for top-k children, q without the
        earlier draws for sampled ones."""
        return child_q(tree, drawn=self.children == "sampled")

    def node_rule(self, adapter: ModelAdapter):
        """The per-node test on this model: for top-k children EAGLE-2's rule in its one-draw form
        (`sample_and_descend`), for sampled children recursive rejection sampling; relaxed decoders replace it."""
        return sample_and_descend if self.children == "top_k" else recursive_rejection

    def commit(
        self,
        adapter: ModelAdapter,
        run: DrafterRun,
        tokens: torch.Tensor,
        committed: torch.Tensor,
        tree: DraftTree,
        walk: TreeWalk,
        features: torch.Tensor,
        active: torch.Tensor,
        read: Callable[[torch.Tensor], list[int]],
    ) -> list[int]:
        """Write the accepted path and the next token; keep the path in the target's cache; let the drafter
        catch up. Returns how many tokens each row committed, read to the host by `read` (the clock's, which
        brings the forwards' NaN/inf flags in the same copy): the one host sync of an iteration."""
        N, B = tokens.shape[1], tokens.shape[0]
        device = tokens.device
        root_pos = committed - 1
        A = walk.path.shape[1]
        offsets = torch.arange(A, device=device)
        on_path = (offsets[None, :] <= walk.n_accepted[:, None]) & active[:, None]  # root and accepted nodes
        path_nodes = walk.path.clamp(min=0)
        drafted = tree.tokens.gather(1, path_nodes)  # [B, A]: path tokens (root first)
        ends = root_pos + 1 + walk.n_accepted  # where the next token goes
        write_pos = root_pos[:, None] + offsets[None, :]  # slot a holds the token at root_pos + a
        write = on_path & (offsets[None, :] >= 1)
        has_next = active & (ends < N)
        # Both writes go through one scatter into the tokens and a spare last column, where every entry that
        # writes nothing lands: masked indexing would ask the host how many entries there are.
        at = torch.cat([torch.where(write, write_pos, N), torch.where(has_next, ends, N)[:, None]], 1)
        values = torch.cat([drafted, walk.next_token[:, None]], 1)
        spare = torch.cat([tokens, tokens.new_zeros(B, 1)], 1).scatter_(1, at, values)
        tokens.copy_(spare[:, :N])
        take = torch.where(active, walk.n_accepted + has_next.long(), 0)
        keep = torch.zeros_like(tree.present)
        keep.scatter_(1, path_nodes, on_path & (offsets[None, :] >= 1))
        adapter.keep_slots(keep)
        # The drafter's pairs: (feature at path node a, the token after it) for a = 0 .. n_accepted.
        gen_pos = (root_pos[:, None] + 1 + offsets[None, :]).clamp(max=N - 1)
        count = torch.where(has_next, walk.n_accepted + 1, 0)
        pair_tokens = torch.where(offsets[None, :] < count[:, None], tokens.gather(1, gen_pos), 0)
        hidden = features.gather(1, run.to_rows(path_nodes)[..., None].expand(-1, -1, features.shape[-1]))
        committed += take
        counts = read(torch.cat([take, has_next.any()[None].long(), walk.complete[None].long()]))
        if not counts[B + 1]:
            raise ValueError(f"decoder {self.name!r}: the verification levels ({self.levels()}) are fewer than the "
                             "draft tree's depth + 1")  # fmt: skip
        if counts[B]:  # a row goes on: the drafter takes the committed pairs
            run.catch_up(hidden, pair_tokens, gen_pos, count)
        return counts[:B]
