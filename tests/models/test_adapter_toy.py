"""The adapter contract (tests/adapter_contract.py) on the shipped toy model: a trained Llama over
the toy vocabulary, CFG rows of the NULL caption padded to the same text context."""

import pytest
import torch
from adapter_contract import AdapterContract, LoadsWeightsContract, fresh_causal_lm

from sjd.harness.prompts import load_prompt_file
from sjd.models.toy import ToyAdapter
from sjd.toy.scenes import GRID
from sjd.toy.tokenizer import CODEBOOK, N_CODES, PATCH

pytestmark = pytest.mark.usefixtures("one_thread")


class TestToyAdapter(AdapterContract, LoadsWeightsContract):
    prompts = load_prompt_file("sjd/assets/prompts/toy.tsv")[:2]
    adapter_class, model_name = ToyAdapter, "toy"
    empty_checkpoint_detail = r"model\.safetensors not found"

    @pytest.fixture
    def adapter(self, toy):
        return toy

    def fresh_logits(self, adapter, row, generated, positions=None):
        B, vocab, context = len(self.prompts), adapter.vocab, adapter.text_context
        ids = vocab.encode_text(self.prompts[row].text, context) if row < B else vocab.null_text(context)
        return fresh_causal_lm(adapter.model, ids, generated, positions)

    def image_size(self, adapter):
        return GRID * PATCH, GRID * PATCH

    def codebook(self, adapter):
        ids = adapter.vocab.code_offset + torch.arange(N_CODES)
        return ids, torch.as_tensor(CODEBOOK.reshape(N_CODES, -1) / 255.0, dtype=torch.float32)
