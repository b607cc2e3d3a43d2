"""Our AR baseline decodes as transformers' own `generate` does, given the same batched CFG and grammar, and samples
as one row stepped alone with a uniform drawn each step does."""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from sjd.core.sampling import SamplingConfig, cfg_mix, logits_to_probs, sample_rows
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


@torch.no_grad()
def step_by_step_ar(adapter, prompt: Prompt, sampling: SamplingConfig, generator: torch.Generator) -> torch.Tensor:
    """One row's AR tokens with its uniform drawn at each step, as ARDecoder drew them before it drew them at once."""
    layout, n = adapter.layout, adapter.layout.n_tokens
    tokens = torch.zeros(n, dtype=torch.long)
    logits = adapter.prefill([prompt], sampling.uses_uncond)
    for pos in range(n):
        if pos:
            logits = adapter.forward(tokens[pos - 1 : pos][None], [pos - 1])
        p = logits_to_probs(logits, torch.full((1, 1), pos), layout, sampling)
        tokens[pos] = sample_rows(p[:, 0], [generator])[0]
    return tokens


def test_sampled_ar_draws_each_rows_uniforms_at_once_as_a_row_stepped_alone_draws_them_one_by_one(toy):
    """ARDecoder draws a row's uniforms for every step in one call after the first token: the tokens of each row of a
    batch are those of the row stepped alone with a uniform a step, and each generator is left where those leave it."""
    sampling = SamplingConfig(cfg_scale=3.0, top_k=20)
    prompts = [Prompt("a", "large red circle center on green"), Prompt("b", "small blue square top left on black")]
    batch_gens, alone_gens = (make_generators(5, [p.prompt_id for p in prompts], toy.device) for _ in range(2))
    ours = ARDecoder().generate(toy, prompts, sampling, batch_gens)
    for row, (prompt, generator) in enumerate(zip(prompts, alone_gens)):
        assert torch.equal(ours.tokens[row], step_by_step_ar(toy, prompt, sampling, generator)), prompt.text
    assert [torch.rand(3, generator=g).tolist() for g in batch_gens] == [
        torch.rand(3, generator=g).tolist() for g in alone_gens
    ]
    assert len(set(ours.tokens[0].tolist())) > 3  # sampled, not one token over and over
