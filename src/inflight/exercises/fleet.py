"""Chapter 11's grader: `max_batch(model, gpu, load, slo, tp)` — how many requests one replica of
`tp` GPUs runs at once: what the memory left after the weights holds at every request's peak
context, and what keeps a decode step within the TPOT objective (the package's is
`inflight.sim.fleet.max_batch`; the capacity plan is built on it).

The cases are real shapes (Llama-3-8B and -70B on H100- and A100-like GPUs) and random ones, with
tensor-parallel sizes 1-8, loads where memory decides, loads where the TPOT decides, and models that
do not fit at all. The answer is an integer and must be exact. The classic slips are named when the
learner's answers are theirs: KV for the mean context instead of the peak, the weights forgotten,
one GPU's memory for a replica of several, the memory utilisation ignored, only one of the two
limits."""
from __future__ import annotations

import random
from typing import Any, Callable

from inflight.exercises.grading import Case, GradeResult, Mistake, grade
from inflight.sim.fleet import GPU, H100, LLAMA_8B, LLAMA_70B, SLO, Load, Model, kv_bytes_per_token, max_batch, step_time

__all__ = ["check_max_batch", "MISTAKES", "cases"]

A100 = GPU(40e9, 1.55e12, 312e12)


def _bisect(fits: Callable[[int], bool], hi: int) -> int:
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def _variant(*, context: str = "peak", weights: bool = True, gpus: str = "tp", util: bool = True,
             memory: bool = True, tpot: bool = True) -> Callable:
    def impl(m: Model, g: GPU, load: Load, slo: SLO, tp: int = 1, mem_util: float = 0.9) -> int:
        mem = (tp if gpus == "tp" else 1) * g.memory_bytes * (mem_util if util else 1.0)
        budget = mem - (m.weight_bytes if weights else 0.0)
        if budget <= 0:
            return 0
        ctx = load.prompt_len + (load.output_len if context == "peak" else load.output_len / 2)
        b_mem = int(budget // (ctx * kv_bytes_per_token(m)))
        mean_ctx = load.prompt_len + load.output_len / 2
        if not tpot:
            return b_mem
        if step_time(m, g, 1, mean_ctx, tp) > slo.tpot_s:
            return 0
        b_tpot = _bisect(lambda b: step_time(m, g, b, mean_ctx, tp) <= slo.tpot_s, max(1, b_mem) if memory else 10**7)
        return min(b_mem, b_tpot) if memory else b_tpot
    return impl


MISTAKES = [
    Mistake("KV for the mean context", "you sized each request's KV at its mean context (prompt + output / 2); a "
            "request that has generated its whole answer holds prompt + output tokens, and the pool must hold every "
            "running request at that peak, or requests get preempted near their end.", _variant(context="mean")),
    Mistake("the weights forgotten", "the whole memory went to the KV cache; every replica first holds its own copy "
            "of the weights (split over its tp GPUs): the KV gets tp × memory × mem_util − weight_bytes.",
            _variant(weights=False)),
    Mistake("one GPU's memory", "a replica of tp GPUs has tp GPUs' memory (the weights and the KV are split "
            "across them): tp × memory × mem_util − weight_bytes.", _variant(gpus="one")),
    Mistake("mem_util ignored", "you gave the KV cache every byte; an engine keeps a share free (activations, "
            "the CUDA context, fragmentation): multiply the memory by mem_util.", _variant(util=False)),
    Mistake("only the memory limit", "the batch that fits in memory can be too slow: a decode step of B requests "
            "reads the weights and all B requests' KV, so past some B it exceeds the TPOT objective. Take the "
            "smaller of the two limits.", _variant(tpot=False)),
    Mistake("only the TPOT limit", "a batch fast enough can still not fit: the KV of B requests at their peak "
            "context must fit in the memory the weights leave. Take the smaller of the two limits.",
            _variant(memory=False)),
]


def cases(seed: int = 0, n_random: int = 40) -> list[Case]:
    rng = random.Random(seed)
    fixed = [("Llama-3-8B, 1×H100, 1000+200, TPOT 50 ms", LLAMA_8B, H100, Load(10, 1000, 200), SLO(1.0, 0.05), 1),
             ("Llama-3-8B, 1×H100, 1000+200, TPOT 10 ms (TPOT decides)", LLAMA_8B, H100, Load(10, 1000, 200),
              SLO(1.0, 0.01), 1),
             ("Llama-3-70B on 1×H100: does not fit", LLAMA_70B, H100, Load(20, 1000, 200), SLO(1.0, 0.05), 1),
             ("Llama-3-70B, 2×H100, 1000+200", LLAMA_70B, H100, Load(20, 1000, 200), SLO(1.0, 0.05), 2),
             ("Llama-3-70B, 4×H100, 1000+200", LLAMA_70B, H100, Load(20, 1000, 200), SLO(1.0, 0.05), 4),
             ("Llama-3-70B, 8×H100, 4000+1000, TPOT 30 ms", LLAMA_70B, H100, Load(20, 4000, 1000), SLO(2.0, 0.03), 8),
             ("Llama-3-70B, 8×A100-40GB, 1000+200", LLAMA_70B, A100, Load(5, 1000, 200), SLO(1.0, 0.1), 8),
             ("Llama-3-8B, 1×A100-40GB, 200+800, TPOT 15 ms", LLAMA_8B, A100, Load(5, 200, 800), SLO(1.0, 0.015), 1)]
    out = []
    for name, m, g, load, slo, tp in fixed:
        out.append(Case(name, lambda f, a=(m, g, load, slo, tp): f(*a), describe=f"model {m}, GPU {g}, {load}, {slo}, tp={tp}",
                        data=(m, g, load, slo, tp)))
    for i in range(n_random):
        layers = rng.choice((16, 32, 48, 80))
        m = Model(rng.uniform(1e9, 120e9), layers, rng.choice((2, 4, 8)), rng.choice((64, 128)),
                  rng.choice((1.0, 2.0)))
        g = GPU(rng.choice((24e9, 40e9, 80e9, 141e9)), rng.uniform(0.9e12, 4.8e12), rng.uniform(100e12, 1000e12))
        load = Load(rng.uniform(1, 50), rng.randint(100, 8000), rng.randint(16, 2000))
        slo = SLO(rng.uniform(0.3, 3.0), rng.uniform(0.01, 0.2), rng.choice((0.5, 0.9, 0.99)))
        tp = rng.choice((1, 2, 4, 8))
        out.append(Case(f"random case {i}", lambda f, a=(m, g, load, slo, tp): f(*a),
                        describe=f"model {m}, GPU {g}, {load}, {slo}, tp={tp}", data=(m, g, load, slo, tp)))
    return out


def check_max_batch(fn: Callable[..., Any], *, quiet: bool = False) -> GradeResult:
    """Grade `max_batch(model, gpu, load, slo, tp)` against `inflight.sim.fleet.max_batch`."""
    return grade("max_batch", fn, max_batch, cases(), MISTAKES, quiet=quiet)
