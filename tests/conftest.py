"""Shared fixtures for the tests."""
from __future__ import annotations

import pytest
import torch

from inflight.model.llama import LlamaConfig, LlamaModel

#: the vocabulary of `model`: small, so that random token ids hit every path (token 0 is end-of-text)
SMALL_VOCAB = 61


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    """A small random Llama (2 layers, 32 wide, grouped-query attention), seeded: the engine tests'
    model. A test module that needs another one defines its own `model` fixture."""
    torch.set_num_threads(1)  # token-exact comparisons must not depend on how threads split a reduction
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=SMALL_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, eos_token_id=0)
    return LlamaModel(cfg).eval()
