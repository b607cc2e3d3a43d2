"""Parallel draft heads: from one target feature, drafts for several positions at once.

A drafter (sjd.drafters.drafter) drafts one position per forward of its own layer, so a chain of k drafts costs k
sequential forwards. Heads cost one call whatever they draft: head j is a residual block on the target's last
feature (after the final norm, what `Logits.features` carries) that predicts the feature `offsets[j]` positions
further on,

    h_j = f + W_j silu(U_j f + b_j),

and the target's own frozen LM head turns every h_j into logits, then the shared logits pipeline into q (CFG mix,
grammar, temperature, top-k / top-p), exactly as p is made. With a feature that predicts position t (the target's
own next token), head j drafts position t + offsets[j]: offsets 1, 2, ... draft along the row (horizontal, as
Hawk's and Medusa's heads), an offset of the row's width drafts the code below (vertical, Hawk's and SSD's).
W_j starts at zero, so an untrained head repeats the target's next-token distribution one position further on.

Token-aware heads (`tokens: true` in heads.json) also read the token their feature predicts, as EAGLE's drafter reads
the sampled token beside the feature: with e the target's own (frozen) embedding of that token,

    h_j = f + W_j silu(U_j f + T_j e + b_j).

The feature after the final norm has not seen the token it predicts; at draft time that token is committed (the
heads draft after the last committed token, from the feature that predicted it), so q still depends only on
committed tokens.

A heads directory holds `heads.json` (the hidden size, the offsets, whether they read tokens, the target it was
trained on and, for our recipe, the training record) and `heads.safetensors`; `decoder.heads.weights` names one, or
`random` / `random:SEED` for seeded random heads (tests, random models), `random_tokens` / `random_tokens:SEED` for
seeded random token-aware ones. Exactness never depends on the heads: every draft is
a sample of the q it is recorded with, and q depends only on the committed tokens' features.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from sjd.core.sampling import SamplingConfig, logits_to_probs, sample_from
from sjd.core.staging import device_ints
from sjd.drafters.checkpoint import check_draft_head, random_seed, resolve
from sjd.models.base import ModelAdapter

HEADS_KEY = "decoder.heads.weights"
CONFIG_FILE = "heads.json"
WEIGHTS_FILE = "heads.safetensors"
DEFAULT_OFFSETS = (1, 2, 3, 4)
RANDOM_TOKENS = "random_tokens"  # `random_tokens` / `random_tokens:SEED`: seeded random token-aware heads
_LOADED: dict[tuple, tuple[weakref.ref, DraftHeads]] = {}


@dataclass(frozen=True)
class HeadsConfig:
    hidden_size: int
    offsets: tuple[int, ...]  # head j drafts offsets[j] positions after the one the feature predicts
    tokens: bool = False  # each head also reads the embedding of the token its feature predicts

    def __post_init__(self) -> None:
        if not self.offsets or any(int(d) < 1 for d in self.offsets) or len(set(self.offsets)) != len(self.offsets):
            raise ValueError(f"heads offsets must be distinct integers >= 1, got {list(self.offsets)}")

    def to_dict(self) -> dict:
        # `tokens` only where set: the heads.json of heads that read none is what it was before token-aware heads
        out = {"hidden_size": self.hidden_size, "offsets": list(self.offsets)}
        return {**out, "tokens": True} if self.tokens else out


class DraftHeads(nn.Module):
    """One residual block per offset, batched: features [..., H] (and, for token-aware heads, the embeddings [..., H]
    of the tokens they predict) -> predicted features [..., K, H]."""

    def __init__(self, config: HeadsConfig) -> None:
        super().__init__()
        self.config = config
        K, H = len(config.offsets), config.hidden_size
        self.up = nn.Parameter(torch.empty(K, H, H))
        self.bias = nn.Parameter(torch.zeros(K, H))
        self.down = nn.Parameter(torch.zeros(K, H, H))
        nn.init.normal_(self.up, std=H**-0.5)
        if config.tokens:  # drawn after `up`, so the feature-only part starts as a feature-only head's does
            self.token_up = nn.Parameter(torch.empty(K, H, H))
            nn.init.normal_(self.token_up, std=H**-0.5)

    @property
    def offsets(self) -> tuple[int, ...]:
        return self.config.offsets

    def forward(self, features: torch.Tensor, embeddings: torch.Tensor | None = None) -> torch.Tensor:
        inner = torch.einsum("...h,khj->...kj", features, self.up) + self.bias
        if self.config.tokens:
            if embeddings is None:
                raise ValueError("token-aware heads (heads.json `tokens`) need the embeddings of the tokens their "
                                 "features predict")  # fmt: skip
            inner = inner + torch.einsum("...h,khj->...kj", embeddings, self.token_up)
        inner = nn.functional.silu(inner)
        return features.unsqueeze(-2) + torch.einsum("...kj,kjh->...kh", inner, self.down)

    def one(self, features: torch.Tensor, offset: int) -> torch.Tensor:
        """The head at `offset` alone: features [..., H] -> the predicted features `offset` positions on
        [..., H]. Applied to its own output it predicts further on (SSD's chained latent prediction), so only heads
        that read features alone have it."""
        if self.config.tokens:
            raise ValueError("token-aware heads read the predicted token beside the feature: a chained prediction "
                             "(SSD's) has no token to give them; use heads trained without heads.tokens")  # fmt: skip
        k = self.offsets.index(offset)
        inner = nn.functional.silu(features @ self.up[k] + self.bias[k])
        return features + inner @ self.down[k]


def random_heads(hidden_size: int, offsets: Sequence[int], seed: int, tokens: bool = False) -> DraftHeads:
    """Seeded heads whose residuals are not zero, so each head's q differs from the target's next-token one."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        heads = DraftHeads(HeadsConfig(hidden_size, tuple(offsets), tokens))
        with torch.no_grad():
            heads.down.normal_(std=hidden_size**-0.5)
    return heads


def random_spec(weights: str) -> tuple[int, bool] | None:
    """(seed, reads tokens) of `random[:SEED]` or `random_tokens[:SEED]`; None for a directory."""
    name = str(weights)
    if name == RANDOM_TOKENS or name.startswith(RANDOM_TOKENS + ":"):
        seed = random_seed("random" + name[len(RANDOM_TOKENS) :])
        return seed, True
    seed = random_seed(name)
    return None if seed is None else (seed, False)


def check_heads_setting(weights: str | None, decoder: str) -> None:
    """Before any model loads: heads are named and, unless random, their directory holds both files."""
    if weights is None:
        raise ValueError(
            f"decoder {decoder!r} needs draft heads: set `{HEADS_KEY}` to a heads directory ({CONFIG_FILE} and "
            f"{WEIGHTS_FILE}, from `python scripts/train_heads.py model=NAME`), or `random` for untrained ones"
        )
    if random_spec(str(weights)) is not None:
        return
    path = resolve(str(weights))
    missing = [f for f in (CONFIG_FILE, WEIGHTS_FILE) if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(f"decoder {decoder!r}: `{HEADS_KEY}`={weights}: no {missing} in {path.absolute()}")


def heads_settings(heads: dict | None, decoder: str) -> dict:
    """`decoder.heads` of a heads decoder, checked before any model loads: `weights` (check_heads_setting) and
    `head`, the LM head's rows they run (check_draft_head; the image codes' by default)."""
    heads = dict(heads or {})
    unknown = sorted(set(heads) - {"weights", "head"})
    if unknown:
        raise ValueError(f"decoder.heads: unknown setting(s) {unknown} (settings: weights, head)")
    check_heads_setting(heads.get("weights"), decoder)
    return {
        "weights": str(heads["weights"]),
        "head": check_draft_head(str(heads.get("head", "codes")), "decoder.heads.head"),
    }


def read_heads_config(weights: str) -> dict:
    f = resolve(str(weights)) / CONFIG_FILE
    try:
        config = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"`{HEADS_KEY}`: cannot read {f}: {e}") from None
    return config


def heads_record(weights: str) -> dict:
    """What a run records of its heads: the seed of random ones (and `tokens` for token-aware ones), else the
    directory's heads.json."""
    spec = random_spec(str(weights))
    if spec is None:
        return read_heads_config(weights)
    return {"random_seed": spec[0], "tokens": True} if spec[1] else {"random_seed": spec[0]}


def build_heads(adapter: ModelAdapter, weights: str, random_offsets: Sequence[int] = DEFAULT_OFFSETS) -> DraftHeads:
    hidden = int(adapter.architecture()["hidden_size"])
    spec = random_spec(str(weights))
    if spec is not None:
        heads = random_heads(hidden, random_offsets, *spec)
    else:
        config = read_heads_config(weights)
        where = resolve(str(weights))
        if int(config.get("hidden_size", -1)) != hidden:
            raise ValueError(
                f"`{HEADS_KEY}`: the heads at {where} have hidden_size {config.get('hidden_size')}, the target "
                f"{adapter.name!r} {hidden}"
            )
        trained_on = (config.get("target") or {}).get("name")
        if trained_on is not None and trained_on != adapter.name:
            raise ValueError(
                f"`{HEADS_KEY}`: the heads at {where} were trained on {trained_on!r}, not {adapter.name!r}"
            )
        from safetensors.torch import load_file

        offsets = tuple(int(d) for d in config["offsets"])
        heads = DraftHeads(HeadsConfig(hidden, offsets, bool(config.get("tokens", False))))
        heads.load_state_dict(load_file(str(where / WEIGHTS_FILE)))
    dtype = adapter.token_embeddings().dtype
    return heads.to(device=adapter.device, dtype=dtype if dtype.is_floating_point else torch.float32).eval()


def load_heads(adapter: ModelAdapter, weights: str, random_offsets: Sequence[int] = DEFAULT_OFFSETS) -> DraftHeads:
    """The heads for `adapter`, in the target's dtype and on its device, loaded once per directory and model.
    `random_offsets`: the offsets of `random` heads (a directory's heads.json names its own). On a shadowed model, a
    copy whose calls twins at the shadow's width also run (sjd/drafters/shadow.py)."""
    from sjd.drafters.shadow import heads_beside_shadow

    key = (str(weights), str(adapter.device), tuple(random_offsets))
    held = _LOADED.get(key)
    if held is None or held[0]() is not adapter:
        for stale in [k for k, (ref, _) in _LOADED.items() if ref() is not adapter]:
            del _LOADED[stale]  # heads of a model no longer loaded; a run's decoders keep theirs side by side
        heads = heads_beside_shadow(build_heads(adapter, weights, random_offsets), adapter)
        _LOADED[key] = (weakref.ref(adapter), heads)
    return _LOADED[key][1]


def save_heads(heads: DraftHeads, directory: Path, record: dict) -> None:
    """heads.safetensors and heads.json (the config, then the record)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in heads.state_dict().items()}
    save_file(state, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    config = {**heads.config.to_dict(), **record}
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True, default=str))


@torch.no_grad()
def draw_from_heads(
    heads: DraftHeads,
    adapter: ModelAdapter,
    sampling: SamplingConfig,
    features: torch.Tensor,
    predicts: torch.Tensor,
    generators: Sequence[torch.Generator],
    code_head: bool = False,
    tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One heads call. `features` [R, H] are the target's features of every CFG row (conditional rows, then
    unconditional), row b's predicting generated position `predicts` [B]. Returns the generated positions the
    heads draft, `predicts + offsets` [B, K], one draft of each (row b's from its own generator) and the q it was
    drawn from ([B, K], [B, K, V]); a position past the image gets q = 0. `code_head`: through the image codes'
    rows of the LM head only (ModelAdapter.code_head; the same q). `tokens` [B]: the committed token at each row's
    `predicts`, which token-aware heads read (every CFG row of an image the same one)."""
    N = adapter.layout.n_tokens
    offsets = device_ints(heads.offsets, predicts.device)
    positions = predicts[:, None] + offsets[None, :]
    dtype = heads.up.dtype
    embeddings = None
    if heads.config.tokens:
        if tokens is None:
            raise ValueError("token-aware heads need the token at each row's predicted position; none was given")
        copies = features.shape[0] // len(tokens)
        embeddings = adapter.token_embeddings()[tokens].to(dtype).repeat(copies, 1)  # [R, H]
    predicted = heads(features.to(dtype), embeddings)  # [R, K, H]
    logits = (adapter.code_head if code_head else adapter.head)(predicted)
    q = logits_to_probs(logits, positions.clamp(max=N - 1), adapter.layout, sampling)
    q = q * (positions < N)[..., None]
    uniforms = torch.stack([torch.rand(len(offsets), generator=g, device=q.device) for g in generators])
    return positions, sample_from(q, uniforms), q
