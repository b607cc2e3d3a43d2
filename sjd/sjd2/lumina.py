"""Lumina-mGPT with SJD2's `embeds` capability, from a noise-aware checkpoint made by our recipe.

SJD2's fine-tuned Lumina-mGPT was never released; `scripts/finetune_sjd2_hf.py --model lumina`
makes the checkpoint this adapter loads: the fine-tuned model in the base checkpoint's own
transformers format (loaded by the plain Lumina loader) plus `noise_aware.safetensors` and
`noise_aware.json` (sjd/sjd2/noise_path.py). Prompt, CFG rows, layout and images are
Lumina's (sjd/models/lumina.py); every model call goes through the noise-aware input path.
"""

from __future__ import annotations

from sjd.models.loading import WEIGHTS_KEY
from sjd.models.lumina import QUESTION, LuminaAdapter
from sjd.sjd2.inputs import NoiseAwareInputs, open_checkpoint
from sjd.types import EMBEDS

FAMILY = "lumina"


class LuminaSJD2Adapter(NoiseAwareInputs, LuminaAdapter):
    base_adapter = LuminaAdapter
    capabilities = LuminaAdapter.capabilities | {EMBEDS}
    title = "Lumina-mGPT, SJD2 noise-aware"

    def __init__(
        self,
        weights: str | None = None,
        vqgan: str | None = None,
        name: str = "lumina_sjd2",
        device: str = "cpu",
        resolution: int = 768,
        dtype: str | None = "auto",
        trust_remote_code: bool = False,
        prompt_template: str = QUESTION,
    ) -> None:
        directory, self.noise_path, self.noise_meta = open_checkpoint(weights, name, FAMILY, WEIGHTS_KEY)
        super().__init__(str(directory), vqgan, name, device, resolution, dtype, trust_remote_code, prompt_template)
        self._check_noise_path()
