"""The micro model (sjd.models.micro) behind SJD2's noise-aware input path: the audit's SJD2 model."""

from __future__ import annotations

import torch

from sjd.models.micro import MicroAdapter
from sjd.sjd2.inputs import NoiseAwareLMInputs
from sjd.sjd2.toy_net import NoiseAwareLM


class MicroSJD2Adapter(NoiseAwareLMInputs, MicroAdapter):
    """The micro model behind SJD2's noise-aware input path, with a random timestep embedding.

    Nothing here is trained to denoise; it exists so that the audit can test the SJD2 loop's
    exactness where it must hold (denoise_steps=1) and measure its distance otherwise."""

    def __init__(self, time_scale: float = 0.5, **kwargs) -> None:
        super().__init__(**kwargs)
        self.model = NoiseAwareLM(self.model).eval().to(self.device)
        with torch.no_grad():
            self.model.time_embed.weight.normal_(0.0, time_scale)
