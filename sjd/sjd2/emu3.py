"""Emu3-Gen with SJD2's `embeds` capability, from a noise-aware checkpoint made by our recipe.

SJD2's fine-tuned Emu3 was never released; `scripts/finetune_sjd2_hf.py --model emu3` makes the
checkpoint this adapter loads: the fine-tuned model in transformers' Emu3 format (loaded by the
plain Emu3 loader, VQ included) plus `noise_aware.safetensors` and `noise_aware.json`
(sjd/sjd2/noise_path.py). Prompt, CFG rows, layout and images are Emu3's (sjd/models/emu3.py);
every model call goes through the noise-aware input path.
"""

from __future__ import annotations

from sjd.models.emu3 import NEGATIVE_PROMPT, POSITIVE_SUFFIX, Emu3Adapter
from sjd.models.loading import WEIGHTS_KEY
from sjd.sjd2.inputs import NoiseAwareInputs, open_checkpoint
from sjd.types import EMBEDS

FAMILY = "emu3"


class Emu3SJD2Adapter(NoiseAwareInputs, Emu3Adapter):
    base_adapter = Emu3Adapter
    capabilities = Emu3Adapter.capabilities | {EMBEDS}

    def __init__(
        self,
        weights: str | None = None,
        device: str = "cpu",
        name: str = "emu3_sjd2",
        resolution: int = 720,
        dtype: str = "auto",
        trust_remote_code: bool = False,
        negative_prompt: str = NEGATIVE_PROMPT,
        positive_suffix: str = POSITIVE_SUFFIX,
    ) -> None:
        directory, self.noise_path, self.noise_meta = open_checkpoint(weights, name, FAMILY, WEIGHTS_KEY)
        super().__init__(
            str(directory), device, name, resolution, dtype, trust_remote_code, negative_prompt, positive_suffix
        )
        self._check_noise_path()
