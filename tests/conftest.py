"""Shared fixtures for the tests."""
from __future__ import annotations

import os

# Plain `pytest` (as the README gives it) must work without a display: the tests that draw use the
# headless backend, unless the caller chose one. (Only the tests: a notebook kernel started with
# MPLBACKEND=Agg would draw nothing, so the book build and `pytest chapters` never set it.)
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest  # noqa: E402
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


@pytest.fixture(scope="module")
def tiny():
    """The shipped tiny model and its tokenizer, `(model, tokenizer)`: what the server serves by default.
    (A module that needs another small model under this name, as test_bench does, defines its own.)"""
    from inflight import load_tiny

    return load_tiny()
