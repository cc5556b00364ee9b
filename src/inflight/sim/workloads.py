"""Seeded request workloads: the one home of every length and arrival generator in the book.

Every generator takes a `seed` and returns a list of `Request`s, so a chapter's numbers are the
same on every run. Lengths are in tokens; arrival times are in scheduler steps (`arrival_times`
gives the un-rounded Poisson times, which the serving benchmark reads as seconds). Python's
`random` is used (not numpy) so the numbers don't move between library versions. The scheduling
chapters, the KV-utilisation simulator (`kv_sim`) and the benchmarks (`inflight.bench`, which only
adds token ids to these lengths) all draw from here.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from inflight.engine.block_manager import blocks_needed


@dataclass(frozen=True)
class Request:
    """One request of a workload: `output_len` is what a scheduler calls `num_tokens`."""

    id: str
    prompt_len: int
    output_len: int
    arrival: int = 0
    memory_cost: float = 1

    @property
    def num_tokens(self) -> int:
        return self.output_len


def _check(n: int, **positive: float) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    for name, value in positive.items():
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")


def _check_range(name: str, bounds: tuple[int, int]) -> None:
    low, high = bounds
    if not 1 <= low <= high:
        raise ValueError(f"{name} must be (low, high) with 1 <= low <= high, got {bounds!r}")


def _ids(n: int) -> list[str]:
    width = len(str(max(n - 1, 0)))
    return [f"r{i:0{width}d}" for i in range(n)]  # zero-padded so sorted ids = arrival order


def _build(outputs: Sequence[int], prompts: Sequence[int], arrivals: Sequence[int] | None) -> list[Request]:
    arrivals = arrivals if arrivals is not None else [0] * len(outputs)
    return [Request(rid, p, o, a) for rid, p, o, a in zip(_ids(len(outputs)), prompts, outputs, arrivals)]


def capped_exponential(rng: random.Random, mean: float, max_len: int, min_len: int = 1) -> int:
    """One long-tailed length: exponential with the given mean, rounded up, clipped to [min_len, max_len]."""
    return int(min(max_len, max(min_len, math.ceil(rng.expovariate(1.0 / mean)))))


def arrival_times(n: int, rate: float, seed: int = 0) -> list[float]:
    """Arrival times of a Poisson process with `rate` requests per unit of time (sorted). The same
    seed gives the same pattern at every rate, only stretched: load is the one thing that changes."""
    _check(n, rate=rate)
    rng = random.Random(f"arrivals-{seed}")
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def poisson_arrivals(n: int, rate: float, seed: int = 0) -> list[int]:
    """Arrival steps of a Poisson process with `rate` requests per step (integer steps, sorted)."""
    return [int(t) for t in arrival_times(n, rate, seed)]


def long_tailed(n: int, seed: int = 0, mean: float = 40, max_len: int = 400, min_len: int = 1,
                prompt_mean: float = 100, arrival_rate: float | None = None) -> list[Request]:
    """Output lengths from a capped exponential (most requests short, a few very long) — the shape
    of real chat traffic. Prompt lengths are long-tailed too; arrivals are Poisson if `arrival_rate`."""
    _check(n, mean=mean, max_len=max_len, prompt_mean=prompt_mean)
    rng = random.Random(f"long_tailed-{seed}")
    outputs = [capped_exponential(rng, mean, max_len, min_len) for _ in range(n)]
    prompts = [capped_exponential(rng, prompt_mean, 8 * int(prompt_mean)) for _ in range(n)]
    arrivals = poisson_arrivals(n, arrival_rate, seed) if arrival_rate else None
    return _build(outputs, prompts, arrivals)


def uniform(n: int, seed: int = 0, low: int = 1, high: int = 100, prompt_len: int | tuple[int, int] = 100,
            arrival_rate: float | None = None) -> list[Request]:
    """Output lengths uniform in [low, high] (inclusive); every prompt `prompt_len` tokens, or, for a
    `(low, high)` pair, prompt lengths uniform in that range (drawn after the outputs)."""
    _check(n, low=low)
    if high < low:
        raise ValueError(f"high ({high}) must be >= low ({low})")
    rng = random.Random(f"uniform-{seed}")
    outputs = [rng.randint(low, high) for _ in range(n)]
    if isinstance(prompt_len, tuple):
        _check_range("prompt_len", prompt_len)
        prompts = [rng.randint(*prompt_len) for _ in range(n)]
    else:
        _check(n, prompt_len=prompt_len)
        prompts = [prompt_len] * n
    arrivals = poisson_arrivals(n, arrival_rate, seed) if arrival_rate else None
    return _build(outputs, prompts, arrivals)


def short_chat(n: int, seed: int = 0, prompt_range: tuple[int, int] = (16, 128), mean_output: float = 48,
               max_output: int = 256) -> list[Request]:
    """Chat traffic as the serving chapters model it: prompts uniform in `prompt_range`, outputs
    exponential with mean `mean_output` capped at `max_output` (the server's max_tokens). Chapter
    5's KV simulator and the serving benchmark's "long_tailed" workload both use it."""
    _check(n, mean_output=mean_output, max_output=max_output)
    _check_range("prompt_range", prompt_range)
    rng = random.Random(f"kv-short-chat-{seed}")  # the stream chapter 5's figures were first drawn from
    pairs = [(rng.randint(*prompt_range), capped_exponential(rng, mean_output, max_output)) for _ in range(n)]
    return _build([o for _, o in pairs], [p for p, _ in pairs], None)


def with_spread(n: int, seed: int = 0, mean: float = 40, spread: float = 1.0, max_len: int | None = None,
                prompt_len: int = 100) -> list[Request]:
    """Output lengths with a chosen spread: gamma-distributed with mean `mean` and coefficient of
    variation `spread` (0 = all equal, 1 = exponential, >1 = heavier tail)."""
    _check(n, mean=mean)
    if spread < 0:
        raise ValueError(f"spread must be >= 0, got {spread}")
    rng = random.Random(f"spread-{seed}")
    max_len = max_len or int(20 * mean)
    if spread == 0:
        outputs = [max(1, round(mean))] * n
    else:
        shape = 1.0 / spread**2
        outputs = [int(min(max_len, max(1, math.ceil(rng.gammavariate(shape, mean / shape))))) for _ in range(n)]
    return _build(outputs, [prompt_len] * n, None)


def sharegpt_like(n: int, seed: int = 0, arrival_rate: float | None = None, max_len: int = 2048) -> list[Request]:
    """Chat-shaped lengths: log-normal prompts and outputs of a few hundred tokens with long tails,
    in the spirit of the ShareGPT conversations serving benchmarks replay (not the data set itself)."""
    _check(n, max_len=max_len)
    rng = random.Random(f"sharegpt-{seed}")

    def draw(median: float, sigma: float) -> int:
        return int(min(max_len, max(4, round(rng.lognormvariate(math.log(median), sigma)))))

    prompts = [draw(200, 1.0) for _ in range(n)]
    outputs = [draw(220, 0.9) for _ in range(n)]
    arrivals = poisson_arrivals(n, arrival_rate, seed) if arrival_rate else None
    return _build(outputs, prompts, arrivals)


def from_lengths(output_lens: Iterable[int], memory_costs: Iterable[float] | None = None,
                 arrivals: Iterable[int] | None = None, prompt_len: int = 0) -> list[Request]:
    """A workload from explicit lengths (and optionally memory costs and arrival steps)."""
    outs = list(output_lens)
    reqs = _build(outs, [prompt_len] * len(outs), list(arrivals) if arrivals is not None else None)
    if memory_costs is not None:
        reqs = [replace(r, memory_cost=c) for r, c in zip(reqs, memory_costs, strict=True)]
    return reqs


def clip_to_context(requests: Iterable[Request], max_len: int) -> list[Request]:
    """Fit every request into a context of `max_len` tokens, as a server must: the output is cut
    to `max_len - prompt_len`, and a prompt that fills the context keeps `max_len - 1` tokens and
    one output token."""
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 2:
        raise ValueError(f"max_len must be an int >= 2 (one prompt and one output token), got {max_len!r}")
    out = []
    for r in requests:
        prompt = min(r.prompt_len, max_len - 1)
        out.append(replace(r, prompt_len=prompt, output_len=max(1, min(r.output_len, max_len - prompt))))
    return out


def kv_memory_cost(requests: Iterable[Request], block_size: int = 16) -> list[Request]:
    """Give each request a memory cost in KV-cache blocks: enough for its prompt and full output."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    return [replace(r, memory_cost=blocks_needed(r.prompt_len + r.output_len, block_size)) for r in requests]


def total_tokens(requests: Iterable[Request]) -> int:
    """Sum of output lengths: the work every scheduler must do, however it orders it."""
    return sum(r.output_len for r in requests)
