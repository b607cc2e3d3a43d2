"""Adapter for the SJD2 noise-aware toy checkpoint (sjd/assets/toy_sjd2, scripts/finetune_sjd2.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from sjd.models.toy import ToyAdapter, toy_layout
from sjd.sjd2.inputs import NoiseAwareLMInputs
from sjd.sjd2.toy_net import load_noise_aware
from sjd.toy.tokenizer import ToyVocab

DEFAULT_WEIGHTS = Path(__file__).resolve().parents[1] / "assets" / "toy_sjd2"


class ToySJD2Adapter(NoiseAwareLMInputs, ToyAdapter):
    def __init__(self, weights: str | None = None, device: str = "cpu", name: str = "toy_sjd2") -> None:
        self.name = name
        self.device = torch.device(device)
        self.model, self.meta = load_noise_aware(Path(weights) if weights else DEFAULT_WEIGHTS)
        self.model.to(self.device)
        self.vocab = ToyVocab()
        self.text_context = int(self.meta["text_context"])
        self.layout = toy_layout(self.vocab)
