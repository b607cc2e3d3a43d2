"""The pipeline bench's old pipeline (sjd/bench/pipeline.py, run by scripts/bench_pipeline.py): patched in, it is
what AR and SJD decode with, and they decode the greedy tokens they decode with today's pipeline; leaving it puts
today's back."""

from collections import Counter
from contextlib import nullcontext

import torch

import sjd.decoders.base
from sjd.bench import pipeline, replaced_pipeline
from sjd.core import sampling
from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.decoders.kernels import Kernels
from sjd.decoders.sjd import SJDDecoder
from sjd.types import Prompt

GREEDY = SamplingConfig(cfg_scale=3.0, temperature=0.0)
PROMPTS = [Prompt("p0", "small red square top right on black"), Prompt("p1", "large blue circle center on green")]


def test_the_replaced_pipeline_patched_in_decodes_todays_greedy_tokens(toy, monkeypatch, one_thread):
    calls = Counter()

    def counted(name):
        fn = getattr(replaced_pipeline, name)

        def call(*args):
            calls[name] += 1
            return fn(*args)

        return call

    for name in ("logits_to_probs", "finite_rows"):
        monkeypatch.setattr(replaced_pipeline, name, counted(name))
    today = (Kernels.pipeline, sjd.decoders.base.finite_rows)
    for decoder in (ARDecoder(), SJDDecoder(window=8)):
        runs = []
        for patch in (nullcontext, pipeline.old_pipeline):
            with patch():
                runs.append(decoder.generate(toy, PROMPTS, GREEDY, make_generators(0, ["p0", "p1"], toy.device)))
        assert torch.equal(runs[0].tokens, runs[1].tokens), decoder.name
    assert calls["logits_to_probs"] > 0 and calls["finite_rows"] > 0  # every forward went through the old pair
    assert (Kernels.pipeline, sjd.decoders.base.finite_rows) == today
    assert sjd.decoders.base.logits_to_probs is sampling.logits_to_probs
