"""The adapter contract (tests/adapter_contract.py) on the micro model of the exactness audit: a
random Llama over a handful of ids, 2x2 codes of 3 values (8 tokens an image)."""

import pytest
import torch
from adapter_contract import AdapterContract, fresh_causal_lm

from sjd.core.sampling import SamplingConfig
from sjd.models.micro import BOS, FIRST_CODE, NULL, WORD_A, WORD_B, MicroAdapter
from sjd.types import Prompt

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def micro():
    return MicroAdapter()


class TestMicroAdapter(AdapterContract):
    prompts = [Prompt("a", "a"), Prompt("b", "b")]
    greedy = SamplingConfig(cfg_scale=2.0, temperature=0.0)  # the micro config's guidance

    @pytest.fixture
    def adapter(self, micro):
        return micro

    def fresh_logits(self, adapter, row, generated, positions=None):
        B = len(self.prompts)
        word = WORD_A if self.prompts[row % B].text == "a" else WORD_B
        return fresh_causal_lm(adapter.model, [BOS, word if row < B else NULL], generated, positions)

    def image_size(self, adapter):
        return adapter.height, adapter.width

    def codebook(self, adapter):
        levels = torch.arange(adapter.n_codes, dtype=torch.float32)[:, None] / (adapter.n_codes - 1)
        return FIRST_CODE + torch.arange(adapter.n_codes), levels
