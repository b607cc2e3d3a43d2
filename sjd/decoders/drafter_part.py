"""What every decoder that drafts with a trained drafter shares: its settings' record, its start-up check and its
network, written once for EAGLE (sjd.decoders.eagle) and the window decoders' drafter continuation
(sjd.decoders.drafted).

The decoder holds `self.drafter`, the dict sjd.drafters.checkpoint.drafter_settings makes of `decoder.drafter`
(`weights`, `head`). This part adds the drafter's training record to the decoder's config (so a results row names
the drafter it ran), loads the drafter at start-up (a drafter that does not fit the model fails there, before any
decode) and hands it over as one of the decoder's networks (hashed into `weights_sha`, counted as forwards by the
sync counter).
"""

from __future__ import annotations

import torch

from sjd.drafters.checkpoint import load_drafter, training_record
from sjd.models.base import ModelAdapter


class DrafterPart:
    """Mixin before a Decoder (or before a window decoder class): `config`, `check` and `networks` for
    `self.drafter`."""

    def config(self) -> dict:
        out = super().config()
        out["drafter"] = {**self.drafter, "record": training_record(self.drafter["weights"])}
        return out

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        load_drafter(adapter, self.drafter["weights"])  # a drafter that does not fit fails here, at start-up

    def networks(self, adapter: ModelAdapter) -> dict[str, torch.nn.Module]:
        return {**super().networks(adapter), "drafter": load_drafter(adapter, self.drafter["weights"])}
