"""Grader for the "Why batching" chapter: the KV cache bytes one token occupies.

The learner writes `kv_bytes_per_token(config, bytes_per_value)` for a Llama-family config (fields
named as in Hugging Face: `num_hidden_layers`, `num_attention_heads`, `num_key_value_heads`,
`head_dim`, `hidden_size`). The answer is 2 (K and V) x layers x KV heads x head_dim x bytes.
Cases are real models' shapes plus seeded random ones; the `Mistake`s are the classic slips.
"""
from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any, Callable

from inflight.exercises.grading import Case, GradeResult, Mistake, grade

__all__ = ["kv_bytes_per_token", "check_kv_bytes_per_token", "MODEL_SHAPES"]


def kv_bytes_per_token(config: Any, bytes_per_value: float) -> int:
    """Reference: K and V, for every layer, for every KV head, head_dim values each."""
    return int(2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * bytes_per_value)


def _cfg(layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int | None = None) -> SimpleNamespace:
    return SimpleNamespace(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                           num_key_value_heads=kv_heads, head_dim=head_dim or hidden // heads)


# public shapes (config.json of each model), used in the chapter too
MODEL_SHAPES = {
    "inflight tiny": _cfg(4, 256, 4, 2, 64),
    "Llama-2-7B": _cfg(32, 4096, 32, 32),
    "Llama-3-8B": _cfg(32, 4096, 32, 8),
    "Llama-2-70B": _cfg(80, 8192, 64, 8),
    "Qwen2.5-0.5B": _cfg(24, 896, 14, 2, 64),
    "Mistral-7B": _cfg(32, 4096, 32, 8),
    "Gemma-7B": _cfg(28, 3072, 16, 16, 256),  # head_dim x heads != hidden: catches "hidden size" slips
    "SmolLM2-135M": _cfg(30, 576, 9, 3, 64),
}


def _cases() -> list[Case]:
    cases = []
    for name, cfg in MODEL_SHAPES.items():
        for nbytes, dtype in [(2, "fp16"), (4, "fp32"), (1, "int8")]:
            cases.append(Case(f"{name} in {dtype}", lambda f, c=cfg, b=nbytes: int(f(c, b)),
                              f"{vars(cfg)}, bytes_per_value={nbytes}"))
    rng = random.Random("kv-bytes")
    for i in range(30):
        kv = rng.choice([1, 2, 4, 8])
        heads = kv * rng.choice([1, 2, 4, 7])
        head_dim = rng.choice([32, 64, 80, 128, 256])
        hidden = heads * head_dim if rng.random() < 0.7 else rng.choice([512, 1024, 3072])
        cfg = _cfg(rng.randint(1, 96), hidden, heads, kv, head_dim)
        nbytes = rng.choice([1, 2, 4])
        cases.append(Case(f"random config #{i}", lambda f, c=cfg, b=nbytes: int(f(c, b)),
                          f"{vars(cfg)}, bytes_per_value={nbytes}"))
    return cases


MISTAKES = [
    Mistake("only K, not V", "every token stores a key AND a value vector per layer and KV head: the factor 2 "
            "is missing.", lambda c, b: c.num_hidden_layers * c.num_key_value_heads * c.head_dim * b),
    Mistake("attention heads instead of KV heads", "with grouped-query attention several query heads share one "
            "KV head, and only the KV heads are cached: use `num_key_value_heads`, not `num_attention_heads`.",
            lambda c, b: 2 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * b),
    Mistake("hidden size instead of KV width", "the cached width per layer is `num_key_value_heads * head_dim`, "
            "not `hidden_size` (that is the query width, and not even that when head_dim x heads != hidden).",
            lambda c, b: 2 * c.num_hidden_layers * c.hidden_size * b),
    Mistake("forgot the layers", "every layer has its own attention and its own K/V: multiply by "
            "`num_hidden_layers`.", lambda c, b: 2 * c.num_key_value_heads * c.head_dim * b),
    Mistake("bits instead of bytes", "`bytes_per_value` is already in bytes (2 for fp16); multiplying by 8 "
            "counts bits.", lambda c, b: 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * b * 8),
    Mistake("counted Q too", "queries are used once and thrown away; only K and V are cached (factor 2, not 3).",
            lambda c, b: 3 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * b),
    Mistake("head_dim from hidden_size", "some models (Gemma, for one) have `head_dim` x heads != "
            "`hidden_size`, so `hidden_size // num_attention_heads` is not the head width: read "
            "`config.head_dim`.",
            lambda c, b: (2 * c.num_hidden_layers * c.num_key_value_heads
                          * (c.hidden_size // c.num_attention_heads) * b)),
    Mistake("forgot the bytes", "the formula counts values; multiply by `bytes_per_value` to get bytes.",
            lambda c, b: 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim),
]


def check_kv_bytes_per_token(fn: Callable[[Any, float], int], *, quiet: bool = False) -> GradeResult:
    """Grade `kv_bytes_per_token(config, bytes_per_value)` on real and random model shapes."""
    return grade("KV cache bytes per token", fn, kv_bytes_per_token, _cases(), MISTAKES, quiet=quiet)
