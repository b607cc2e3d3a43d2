"""A trained drafter's and draft heads' twins at a shadowed model's real widths (sjd/models/shadow.py).

On a shadowed model, the decoder's own networks would otherwise be timed at the stand-in's widths: an EAGLE drafter
layer of a few million parameters where the real one, at the real model's hidden size, reads hundreds of millions
every call. So `load_drafter` and `load_heads` (sjd/drafters/checkpoint.py, heads.py) hand a shadowed model's
decoders a copy of the drafter or heads whose calls also run a network of the shadow's family and widths with random
weights:

- the drafter layer (`ShadowedDrafterNet`): a `DrafterNet` built from the shadow's `architecture()` (its layer
  family: llama, chameleon or llamagen), its token embeddings the shadow's own table; each call runs on the same
  rows, positions, cache slots and mask, the tokens mapped into the shadow's vocabulary, zero features of the
  shadow's width, into a cache of its own allocated beside the drafter's;
- the heads (`ShadowedDraftHeads`): heads at the shadow's hidden size with the same offsets, on zero features of
  the same leading shape, for every call and every `one`.

The copy holds the drafter's or heads' own weights under their own names, so what decides the drafts, and what a
run hashes into `weights_sha`, is unchanged; the twin is kept out of the module's parameters. The drafter's or
heads' own call runs inside the shadowed model's `set_aside()`, so the latency holds the twin's call instead.
"""

from __future__ import annotations

import weakref

import torch

from sjd.drafters.heads import DraftHeads, HeadsConfig, random_heads
from sjd.drafters.net import DrafterNet, config_from_architecture
from sjd.models.real_architectures import building
from sjd.models.shadow import ShadowedAdapter, shadow_dtype

TWIN_SEED = 0  # the twins' random weights (their values do not change what a call costs)
_TWINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # shadowed model -> {what: twin}


def shadow_width(adapter: ShadowedAdapter) -> int:
    return int(adapter.shadow.architecture()["hidden_size"])


def drafter_twin(adapter: ShadowedAdapter) -> DrafterNet:
    """A drafter layer of the shadow's family and widths, random, on its device and in its dtype; made once per
    shadowed model."""
    twins = _TWINS.setdefault(adapter, {})
    if "drafter" not in twins:
        shadow = adapter.shadow
        device, dtype = torch.device(shadow.device), shadow_dtype(shadow)
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
            torch.manual_seed(TWIN_SEED)
            with building(device, dtype):
                net = DrafterNet(config_from_architecture(shadow.architecture()))
        net.embed_tokens.weight = torch.nn.Parameter(shadow.token_embeddings().detach(), requires_grad=False)
        twins["drafter"] = net.eval()
    return twins["drafter"]


def heads_twin(adapter: ShadowedAdapter, offsets: tuple[int, ...], tokens: bool = False) -> DraftHeads:
    """Heads at the shadow's hidden size with these offsets (reading tokens where the heads do), random, on its
    device and in its dtype."""
    twins = _TWINS.setdefault(adapter, {})
    key = ("heads", offsets, tokens)
    if key not in twins:
        heads = random_heads(shadow_width(adapter), offsets, TWIN_SEED, tokens)
        twins[key] = heads.to(device=adapter.shadow.device, dtype=shadow_dtype(adapter.shadow)).eval()
    return twins[key]


class ShadowedDrafterNet(DrafterNet):
    """The drafter, each call also run by its twin (see the module docstring)."""

    def beside(self, adapter: ShadowedAdapter) -> ShadowedDrafterNet:
        self._beside = {"adapter": adapter, "twin": drafter_twin(adapter), "kv_of": None, "kv": None, "zeros": {}}
        return self

    def forward(
        self,
        tokens: torch.Tensor,
        features: torch.Tensor,
        positions: torch.Tensor,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        slots: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        parts = self._beside
        adapter, twin = parts["adapter"], parts["twin"]
        with adapter.set_aside():
            out = super().forward(tokens, features, positions, kv, slots, mask)
            ids = adapter.ids[tokens]
            zeros = parts["zeros"].get(tuple(tokens.shape))
            if zeros is None:
                width = twin.config.hidden_size
                zeros = torch.zeros(*tokens.shape, width, dtype=twin.fc.weight.dtype, device=tokens.device)
                parts["zeros"][tuple(tokens.shape)] = zeros
        if parts["kv_of"] is not kv:  # a new call's cache: the twin's beside it, as many rows and slots
            rows, _, S, _ = kv[0][0].shape
            cfg, dtype = twin.config, twin.fc.weight.dtype
            shape = (rows, cfg.num_key_value_heads, S, cfg.head_dim)
            new = [torch.zeros(shape, dtype=dtype, device=tokens.device) for _ in range(2 * len(kv))]
            parts["kv"] = list(zip(new[::2], new[1::2]))
            parts["kv_of"] = kv
        twin(ids, zeros, positions, parts["kv"], slots, mask)
        return out


class ShadowedDraftHeads(DraftHeads):
    """The heads, each call also run by their twin (see the module docstring)."""

    def beside(self, adapter: ShadowedAdapter) -> ShadowedDraftHeads:
        twin = heads_twin(adapter, self.offsets, self.config.tokens)
        self._beside = {"adapter": adapter, "twin": twin, "zeros": {}}
        return self

    def _twin_input(self, features: torch.Tensor) -> torch.Tensor:
        zeros = self._beside["zeros"]
        shape = tuple(features.shape[:-1])
        if shape not in zeros:
            twin = self._beside["twin"]
            zeros[shape] = torch.zeros(*shape, twin.config.hidden_size, dtype=twin.up.dtype, device=features.device)
        return zeros[shape]

    def forward(self, features: torch.Tensor, embeddings: torch.Tensor | None = None) -> torch.Tensor:
        with self._beside["adapter"].set_aside():
            out = super().forward(features, embeddings)
            twin_in = self._twin_input(features)
        self._beside["twin"](twin_in, twin_in if self.config.tokens else None)
        return out

    def one(self, features: torch.Tensor, offset: int) -> torch.Tensor:
        with self._beside["adapter"].set_aside():
            out = super().one(features, offset)
            twin_in = self._twin_input(features)
        self._beside["twin"].one(twin_in, offset)
        return out


def drafter_beside_shadow(net: DrafterNet, adapter: object) -> DrafterNet:
    """`net` itself, or on a shadowed model a copy whose calls its twin also runs."""
    if not isinstance(adapter, ShadowedAdapter):
        return net
    copy = ShadowedDrafterNet(net.config).to(device=net.fc.weight.device, dtype=net.fc.weight.dtype)
    copy.load_state_dict(net.state_dict())
    return copy.eval().beside(adapter)


def heads_beside_shadow(heads: DraftHeads, adapter: object) -> DraftHeads:
    """`heads` themselves, or on a shadowed model a copy whose calls their twin also runs."""
    if not isinstance(adapter, ShadowedAdapter):
        return heads
    copy = ShadowedDraftHeads(HeadsConfig(heads.config.hidden_size, heads.offsets, heads.config.tokens))
    copy = copy.to(device=heads.up.device, dtype=heads.up.dtype)
    copy.load_state_dict(heads.state_dict())
    return copy.eval().beside(adapter)
