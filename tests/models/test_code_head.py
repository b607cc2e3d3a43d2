"""ModelAdapter.code_head: the LM head's image-code rows alone give the same logits there, so the shared pipeline
gives the same q (what a drafter or draft heads set to `head: codes` draft from)."""

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from sjd.core.sampling import SamplingConfig, logits_to_probs
from sjd.harness.decoder_configs import DECODER_DIR
from sjd.types import Prompt

CONF = DECODER_DIR.parent


@pytest.mark.parametrize("model", ["micro", "toy", "standin_lumina_512_cal"])
def test_the_code_head_gives_the_heads_logits_on_the_codes_and_the_same_q(model):
    cfg = OmegaConf.load(CONF / "model" / f"{model}.yaml")
    adapter = instantiate(cfg.adapter, device="cpu")
    sampling = SamplingConfig(**OmegaConf.to_container(cfg.sampling))
    text = {"micro": ["a", "b"], "toy": ["small red square top right on black", "large blue square center on green"]}
    texts = text.get(model, ["a red circle on a blue sky", "a green field"])
    adapter.prefill([Prompt(f"p{i}", t) for i, t in enumerate(texts)], with_uncond=sampling.uses_uncond)
    hidden = torch.randn(2 * (1 + sampling.uses_uncond), 5, int(adapter.architecture()["hidden_size"]),
                         generator=torch.Generator().manual_seed(0))  # fmt: skip
    full, codes = adapter.head(hidden), adapter.code_head(hidden)
    cols = adapter.layout.free_columns(torch.device("cpu"))
    assert torch.allclose(full.cond[..., cols], codes.cond[..., cols], atol=1e-5, rtol=1e-5)
    N = adapter.layout.n_tokens
    positions = torch.tensor([[0, 1, N // 2, N - 2, N - 1]] * 2)
    p, q = (logits_to_probs(x, positions, adapter.layout, sampling) for x in (full, codes))
    assert torch.allclose(p, q, atol=1e-6)
