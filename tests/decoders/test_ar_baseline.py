"""Our AR baseline decodes as transformers' own `generate` does, given the same batched CFG and grammar."""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from sjd.core.sampling import SamplingConfig, cfg_mix
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.types import Logits, Prompt


class BatchedCFG(LogitsProcessor):
    """Rows [cond..., uncond...]: both rows of a pair get the guided, grammar-masked scores, so both pick
    the same token, as our decoders' batched CFG does."""

    def __init__(self, scale: float, layout, prompt_len: int) -> None:
        self.scale, self.layout, self.prompt_len = scale, layout, prompt_len

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        cond, uncond = scores.float().chunk(2)
        guided = cfg_mix(Logits(cond[:, None], uncond[:, None]), self.scale)
        pos = torch.full((cond.shape[0], 1), input_ids.shape[1] - self.prompt_len)
        guided = guided.masked_fill(
            ~self.layout.allowed_table(pos.device)[pos.clamp(0, self.layout.n_tokens)], float("-inf")
        )[:, 0]
        return torch.cat([guided, guided])


def test_greedy_ar_gives_the_tokens_of_transformers_generate(toy):
    sampling = SamplingConfig(cfg_scale=3.0, temperature=0.0)
    n = toy.layout.n_tokens
    for prompt in (Prompt("a", "large red circle center on green"), Prompt("b", "small blue square top left on black")):
        ours = ARDecoder().generate(toy, [prompt], sampling, make_generators(0, [prompt.prompt_id], toy.device))
        ids = toy.prompt_ids([prompt], with_uncond=True)
        processors = LogitsProcessorList([BatchedCFG(sampling.cfg_scale, toy.layout, ids.shape[1])])
        theirs = toy.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                    min_new_tokens=n, do_sample=False, logits_processor=processors, pad_token_id=0,
                                    eos_token_id=None)  # fmt: skip
        assert torch.equal(ours.tokens[0], theirs[0, ids.shape[1] :]), prompt.text
