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

A heads directory holds `heads.json` (the hidden size, the offsets, the target it was trained on and, for our
recipe, the training record) and `heads.safetensors`; `decoder.heads.weights` names one, or `random` /
`random:SEED` for seeded random heads (tests, random models). Exactness never depends on the heads: every draft is
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
_LOADED: dict[tuple, tuple[weakref.ref, DraftHeads]] = {}


@dataclass(frozen=True)
class HeadsConfig:
    hidden_size: int
    offsets: tuple[int, ...]  # head j drafts offsets[j] positions after the one the feature predicts

    def __post_init__(self) -> None:
        if not self.offsets or any(int(d) < 1 for d in self.offsets) or len(set(self.offsets)) != len(self.offsets):
            raise ValueError(f"heads offsets must be distinct integers >= 1, got {list(self.offsets)}")

    def to_dict(self) -> dict:
        return {"hidden_size": self.hidden_size, "offsets": list(self.offsets)}


class DraftHeads(nn.Module):
    """One residual block per offset, batched: features [..., H] -> predicted features [..., K, H]."""

    def __init__(self, config: HeadsConfig) -> None:
        super().__init__()
        self.config = config
        K, H = len(config.offsets), config.hidden_size
        self.up = nn.Parameter(torch.empty(K, H, H))
        self.bias = nn.Parameter(torch.zeros(K, H))
        self.down = nn.Parameter(torch.zeros(K, H, H))
        nn.init.normal_(self.up, std=H**-0.5)

    @property
    def offsets(self) -> tuple[int, ...]:
        return self.config.offsets

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        inner = nn.functional.silu(torch.einsum("...h,khj->...kj", features, self.up) + self.bias)
        return features.unsqueeze(-2) + torch.einsum("...kj,kjh->...kh", inner, self.down)

    def one(self, features: torch.Tensor, offset: int) -> torch.Tensor:
        """The head at `offset` alone: features [..., H] -> the predicted features `offset` positions on
        [..., H]. Applied to its own output it predicts further on (SSD's chained latent prediction)."""
        k = self.offsets.index(offset)
        inner = nn.functional.silu(features @ self.up[k] + self.bias[k])
        return features + inner @ self.down[k]


def random_heads(hidden_size: int, offsets: Sequence[int], seed: int) -> DraftHeads:
    """Seeded heads whose residuals are not zero, so each head's q differs from the target's next-token one."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        heads = DraftHeads(HeadsConfig(hidden_size, tuple(offsets)))
        with torch.no_grad():
            heads.down.normal_(std=hidden_size**-0.5)
    return heads


def check_heads_setting(weights: str | None, decoder: str) -> None:
    """Before any model loads: heads are named and, unless random, their directory holds both files."""
    if weights is None:
        raise ValueError(
            f"decoder {decoder!r} needs draft heads: set `{HEADS_KEY}` to a heads directory ({CONFIG_FILE} and "
            f"{WEIGHTS_FILE}, from `python scripts/train_heads.py model=NAME`), or `random` for untrained ones"
        )
    if random_seed(str(weights)) is not None:
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
    """What a run records of its heads: the seed of random ones, else the directory's heads.json."""
    seed = random_seed(str(weights))
    return {"random_seed": seed} if seed is not None else read_heads_config(weights)


def build_heads(adapter: ModelAdapter, weights: str, random_offsets: Sequence[int] = DEFAULT_OFFSETS) -> DraftHeads:
    hidden = int(adapter.architecture()["hidden_size"])
    seed = random_seed(str(weights))
    if seed is not None:
        heads = random_heads(hidden, random_offsets, seed)
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

        heads = DraftHeads(HeadsConfig(hidden, tuple(int(d) for d in config["offsets"])))
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One heads call. `features` [R, H] are the target's features of every CFG row (conditional rows, then
    unconditional), row b's predicting generated position `predicts` [B]. Returns the generated positions the
    heads draft, `predicts + offsets` [B, K], one draft of each (row b's from its own generator) and the q it was
    drawn from ([B, K], [B, K, V]); a position past the image gets q = 0. `code_head`: through the image codes'
    rows of the LM head only (ModelAdapter.code_head; the same q)."""
    N = adapter.layout.n_tokens
    offsets = device_ints(heads.offsets, predicts.device)
    positions = predicts[:, None] + offsets[None, :]
    predicted = heads(features.to(heads.up.dtype))  # [R, K, H]
    logits = (adapter.code_head if code_head else adapter.head)(predicted)
    q = logits_to_probs(logits, positions.clamp(max=N - 1), adapter.layout, sampling)
    q = q * (positions < N)[..., None]
    uniforms = torch.stack([torch.rand(len(offsets), generator=g, device=q.device) for g in generators])
    return positions, sample_from(q, uniforms), q
