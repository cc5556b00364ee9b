"""A benchmark workload: the lengths and arrivals of `inflight.sim.workloads`, plus token-id prompts.

The length and arrival generators live once, torch-free, in `inflight.sim.workloads`; the only
thing a benchmark adds is the prompts' token ids (`with_token_ids`). The serving benchmark's two
offline workloads are `short_chat` ("long_tailed") and `uniform` lengths; its online workload is the
same requests arriving as a Poisson process (`with_poisson_arrivals`). The prefix-caching
benchmark (`inflight.bench.offline.prefix`) builds its own from fixed lengths and a shared prefix.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Sequence

from inflight.sim import workloads

__all__ = ["BenchRequest", "Workload", "KINDS", "make_workload", "with_token_ids", "with_poisson_arrivals"]

KINDS = ("long_tailed", "uniform")


@dataclass(frozen=True)
class BenchRequest:
    """One request: its prompt token ids, how many tokens it must generate, and when it arrives —
    seconds after the start for the serving runners, engine steps for the prefix benchmark."""

    id: str
    prompt: list[int]
    output_len: int
    arrival: float = 0.0


@dataclass
class Workload:
    name: str
    requests: list[BenchRequest]
    rate: float | None = None  # requests per second for an online workload, None = all at t=0

    @property
    def useful_tokens(self) -> int:
        return sum(r.output_len for r in self.requests)

    @property
    def max_len(self) -> int:
        return max(len(r.prompt) + r.output_len for r in self.requests)


def with_token_ids(name: str, requests: Sequence[workloads.Request], vocab_size: int, seed: int | str,
                   shared_prefix: int = 0) -> Workload:
    """Give each request of a length workload `prompt_len` seeded random token ids; the first
    `shared_prefix` of them are the same for every request (a shared system prompt). Byte-level
    vocabularies get printable ASCII, so prompts stay text-like; others avoid id 0 (often padding)."""
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    if any(r.prompt_len < shared_prefix for r in requests):
        raise ValueError(f"every prompt must be at least shared_prefix = {shared_prefix} tokens long")
    lo, hi = (32, 127) if 127 <= vocab_size <= 300 else (1, vocab_size)
    rng = random.Random(f"prompts-{seed}")
    prefix = [rng.randrange(lo, hi) for _ in range(shared_prefix)]
    out = []
    for r in requests:
        prompt = prefix + [rng.randrange(lo, hi) for _ in range(r.prompt_len - shared_prefix)]
        out.append(BenchRequest(r.id, prompt, r.output_len, float(r.arrival)))
    return Workload(name, out)


def with_poisson_arrivals(workload: Workload, rate: float, seed: int) -> Workload:
    """The same requests arriving as a Poisson process of `rate` per second, the first at 0."""
    times = workloads.arrival_times(len(workload.requests), rate, seed)
    reqs = [replace(r, arrival=t - times[0]) for r, t in zip(workload.requests, times)]
    return Workload(f"{workload.name}@{rate:.3g}/s", reqs, rate)


def make_workload(kind: str, n: int, seed: int, vocab_size: int, *, max_context: int = 10**9,
                  prompt_range: tuple[int, int] = (16, 128), output_mean: float = 48, output_cap: int = 256,
                  rate: float | None = None) -> Workload:
    """Seeded requests. `kind`: "long_tailed" (`workloads.short_chat`: capped exponential outputs,
    mean `output_mean`, cap `output_cap`) or "uniform" (outputs uniform in [1, 2·mean]); prompts
    uniform in `prompt_range`; every request fitted into `max_context` tokens. With `rate`, the same
    requests arrive as a Poisson process of `rate` requests per second."""
    if kind not in KINDS:
        raise ValueError(f"unknown workload kind {kind!r} ({' | '.join(KINDS)})")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if prompt_range[1] >= max_context:
        raise ValueError(f"prompts of up to {prompt_range[1]} tokens leave no room in a context of {max_context}")
    if kind == "long_tailed":
        lengths = workloads.short_chat(n, seed, prompt_range, mean_output=output_mean, max_output=output_cap)
    else:
        lengths = workloads.uniform(n, seed, 1, max(1, int(2 * output_mean)), prompt_len=tuple(prompt_range))
    lengths = workloads.clip_to_context(lengths, max_context)
    w = with_token_ids(kind, lengths, vocab_size, f"{kind}-{seed}")
    return w if rate is None else with_poisson_arrivals(w, rate, seed)
