"""Grader for the "Why batching" chapter: the KV cache bytes one token occupies.

The learner writes `kv_bytes_per_token(config, bytes_per_value)` for a Llama-family config (fields
named as in Hugging Face: `num_hidden_layers`, `num_attention_heads`, `num_key_value_heads`,
`head_dim`, `hidden_size`). The config is a `ModelConfig`, which reads both ways — `config.head_dim`
as on a Hugging Face config object, `config["head_dim"]` as in its `config.json` — so either habit
is right. The answer is an int: 2 (K and V) x layers x KV heads x head_dim x bytes. Cases are real
models' shapes plus seeded random ones; the `Mistake`s are the classic slips.
"""
from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction
from typing import Any, Callable

from inflight.exercises.answers import as_int, call_unchanged
from inflight.exercises.grading import Case, Diagnosis, GradeResult, Mistake, grade, repeat_case

__all__ = ["kv_bytes_per_token", "check_kv_bytes_per_token", "MODEL_SHAPES", "ModelConfig"]


class ModelConfig(dict):
    """A model's shape, readable as attributes (`config.num_hidden_layers`, like a Hugging Face
    config object) and as keys (`config["num_hidden_layers"]`, like its `config.json`)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"ModelConfig has no field {name!r}; it has {sorted(self)}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __repr__(self) -> str:
        return f"ModelConfig({dict.__repr__(self)})"


def kv_bytes_per_token(config: Any, bytes_per_value: float) -> int:
    """Reference: K and V, for every layer, for every KV head, head_dim values each."""
    return int(2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * bytes_per_value)


def _cfg(layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int | None = None) -> ModelConfig:
    return ModelConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
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


_WHY = "The chapter uses the same config objects for every model after this exercise."


def _run(f: Callable, cfg: ModelConfig, nbytes: int) -> int:
    got = call_unchanged(f, [cfg, nbytes], ["config", "bytes_per_value"], _WHY)
    return as_int(got, f"kv_bytes_per_token(config, {nbytes})", "a number of bytes is an int")


def _tags(cfg: ModelConfig, nbytes: int) -> frozenset:
    tags = {f"{nbytes} byte"}
    if cfg.num_key_value_heads < cfg.num_attention_heads:
        tags.add("gqa")
    if cfg.head_dim * cfg.num_attention_heads != cfg.hidden_size:
        tags.add("odd head_dim")
    if nbytes != 2:
        tags.add("not fp16")
    return frozenset(tags)


def _case(name: str, cfg: ModelConfig, nbytes: int) -> Case:
    return Case(name, lambda f, c=cfg, b=nbytes: _run(f, c, b), f"config={dict(cfg)}, bytes_per_value={nbytes}",
                tags=_tags(cfg, nbytes), data=(cfg, nbytes))


def _cases() -> list[Case]:
    cases = []
    for name, cfg in MODEL_SHAPES.items():
        for nbytes, dtype in [(2, "fp16"), (4, "fp32"), (1, "int8")]:
            cases.append(_case(f"{name} in {dtype}", cfg, nbytes))
    rng = random.Random("kv-bytes")
    for i in range(30):
        kv = rng.choice([1, 2, 4, 8])
        heads = kv * rng.choice([1, 2, 4, 7])
        head_dim = rng.choice([32, 64, 80, 128, 256])
        hidden = heads * head_dim if rng.random() < 0.7 else rng.choice([512, 1024, 3072])
        cfg = _cfg(rng.randint(1, 96), hidden, heads, kv, head_dim)
        cases.append(_case(f"random config #{i}", cfg, rng.choice([1, 2, 4])))
    return cases + [repeat_case(cases)]


TAGS = {
    "gqa": ("the model uses grouped-query attention (fewer KV heads than query heads)",
            "only the KV heads are cached: count `num_key_value_heads`, not `num_attention_heads`."),
    "odd head_dim": ("head_dim × num_attention_heads ≠ hidden_size (Gemma, and some random shapes)",
                     "read `head_dim` from the config; don't derive it from hidden_size."),
    "not fp16": ("bytes_per_value is not 2 (fp32 or int8)",
                 "use the bytes_per_value argument; don't assume fp16's 2 bytes."),
    "1 byte": ("bytes_per_value is 1 (int8)", "multiply by bytes_per_value itself (1 here)."),
}

FACTORS = {
    0.5: "the factor 2 is missing: every token stores a key AND a value vector per layer and KV head.",
    2.0: "there is a factor 2 too many: K and V are one factor 2 — is fp16's 2 counted on top of bytes_per_value?",
    8.0: "you count bits: bytes_per_value is already in bytes.",
    1.5: "you count Q as well: only K and V are cached (a factor 2, not 3).",
    1 / 1024: "your answer is in KiB: the function returns bytes.",
    1 / 1024 ** 2: "your answer is in MiB: the function returns bytes.",
    1 / 8: "you divide by 8: bytes_per_value is already in bytes, not bits.",
}


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
    Mistake("group size instead of KV heads", "`num_attention_heads // num_key_value_heads` is how many query "
            "heads SHARE one KV head, not how many KV heads there are: multiply by `num_key_value_heads`.",
            lambda c, b: 2 * c.num_hidden_layers * (c.num_attention_heads // c.num_key_value_heads) * c.head_dim * b),
    Mistake("bytes fixed at 2 (fp16)", "you multiply by 2 bytes whatever `bytes_per_value` says; fp32 has 4 and "
            "int8 has 1: multiply by the argument.",
            lambda c, b: 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 2),
]


# -- what a wrong formula multiplies: a product of the config's fields, found by trying them -------
_FIELDS = ("num_hidden_layers", "num_key_value_heads", "head_dim", "bytes_per_value", "num_attention_heads",
           "hidden_size")
_RIGHT = (1, 1, 1, 1, 0, 0)  # 2 x layers x kv heads x head_dim x bytes


def _values(cfg: ModelConfig, nbytes: int) -> tuple[int, ...]:
    return (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, nbytes, cfg.num_attention_heads,
            cfg.hidden_size)


def _product(rows: list[tuple], targets: list[float]) -> tuple[Fraction, tuple[int, ...]] | None:
    """The constant and exponents (-1, 0 or 1 per field) of a product that gives every target, the one
    closest to the right formula; None when no such product does."""
    best = None
    for exps in itertools.product((0, 1, -1), repeat=len(_FIELDS)):
        base = [math.prod(v ** e for v, e in zip(row, exps) if e >= 0) /
                math.prod(v for v, e in zip(row, exps) if e < 0) for row in rows]
        const = Fraction(targets[0] / base[0]).limit_denominator(4096)
        if const <= 0 or not all(math.isclose(t, float(const) * b, rel_tol=1e-9) for t, b in zip(targets, base)):
            continue
        distance = sum(e != r for e, r in zip(exps, _RIGHT)) + (const != 2)
        if best is None or distance < best[0]:
            best = (distance, const, exps)
    return None if best is None else (best[1], best[2])


def _formula(const: Fraction, exps: tuple[int, ...]) -> str:
    top = [f for f, e in zip(_FIELDS, exps) if e > 0]
    bottom = [f for f, e in zip(_FIELDS, exps) if e < 0]
    text = " × ".join([str(const)] * (const != 1) + top) or "1"
    return text + "".join(f" / {f}" for f in bottom)


def _differences(const: Fraction, exps: tuple[int, ...]) -> list[str]:
    e = dict(zip(_FIELDS, exps))
    notes = []
    if e["num_attention_heads"] == 1 and e["num_key_value_heads"] == 0:
        notes.append("num_attention_heads where num_key_value_heads belongs (only the KV heads are cached)")
        e["num_attention_heads"] = e["num_key_value_heads"] = None
    if e["num_attention_heads"] == 1 and e["num_key_value_heads"] == -1:
        notes.append("the group size num_attention_heads / num_key_value_heads where num_key_value_heads belongs")
        e["num_attention_heads"] = e["num_key_value_heads"] = None
    if e["hidden_size"] == 1 and e["head_dim"] == 0:
        how = (" divided by num_attention_heads (not every model has head_dim × heads = hidden_size)"
               if e["num_attention_heads"] == -1 else "")
        notes.append(f"hidden_size{how} where head_dim belongs")
        e["hidden_size"] = e["head_dim"] = None
        if how:
            e["num_attention_heads"] = None
    for f, right in zip(_FIELDS, _RIGHT):
        if e[f] is None or e[f] == right:
            continue
        notes.append(f"{f} is missing" if e[f] < right else f"an extra factor {f}" if e[f] > 0 else f"a division by {f}")
    if const != 2:
        notes.append(f"the constant is {const}, not 2 (one key and one value)")
    return notes


def _explain(candidate: Any, failures: list) -> Diagnosis | None:
    """A wrong formula that is still a product of the config's fields, said field by field."""
    rows, targets, right = [], [], []
    for case in _cases()[:-1]:
        cfg, nbytes = case.data
        try:
            got = case.run(candidate)
        except Exception:
            return None
        rows.append(_values(cfg, nbytes))
        targets.append(got)
        right.append(kv_bytes_per_token(cfg, nbytes))
    found = _product(rows, targets) if all(t > 0 for t in targets) else None
    if found is None:
        extra = [t - r for t, r in zip(targets, right)]
        sign = 1 if all(x > 0 for x in extra) else -1 if all(x < 0 for x in extra) else 0
        term = _product(rows, [abs(x) for x in extra]) if sign else None
        if term is None:
            return None
        layer = term == (Fraction(2), (0, 1, 1, 1, 0, 0))
        return Diagnosis("a term added or left out", f"on every case your answer is the right one "
                         f"{'plus' if sign > 0 else 'minus'} {_formula(*term)}" + (
                             ": exactly one layer's worth — count num_hidden_layers layers, no more, no fewer."
                             if layer else ": find that term in your formula; the answer is a single product."),
                         failures[0][0])
    const, exps = found
    if not any(exps):
        return Diagnosis("the same answer for every model", f"your function returns {const} whatever the config and "
                         "bytes_per_value: compute it from them (2 × num_hidden_layers × num_key_value_heads × "
                         "head_dim × bytes_per_value).", failures[0][0])
    notes = _differences(const, exps)
    if not notes:
        return None
    return Diagnosis("a different product of the fields", f"on every case your answer equals {_formula(const, exps)}, "
                     f"where the formula is 2 × num_hidden_layers × num_key_value_heads × head_dim × bytes_per_value: "
                     + "; ".join(notes) + ".", failures[0][0])


def check_kv_bytes_per_token(fn: Callable[[Any, float], int], *, quiet: bool = False) -> GradeResult:
    """Grade `kv_bytes_per_token(config, bytes_per_value)` on real and random model shapes."""
    return grade("KV cache bytes per token", fn, kv_bytes_per_token, _cases(), MISTAKES, quiet=quiet,
                 explain=_explain, tags=TAGS, factors=FACTORS)
