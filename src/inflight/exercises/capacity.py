"""Chapter 11's second grader: `capacity_plan(model, gpu, load, slo)` — the whole capacity plan: which
tensor-parallel size, how many replicas, how many GPUs, under the book's roofline-and-queueing model
(`inflight.sim.fleet.plan`: the batch a replica runs, its prefill and its rate, the fleet's wait at
the SLO's percentile as an M/M/n queue, the TPOT with the prefills each replica also runs, the `tp`
with the fewest GPUs).

The answer is `{"tp": ..., "replicas": ..., "gpus": ...}` (or None when no size meets the SLOs). The
tolerance: `tp` exact, `gpus = replicas × tp`, and `replicas` within 5 % of the model's (at least one
replica either way) — a quantile bisected instead of solved, or a loop that steps differently, is not
a mistake; the slips below are far outside it. They are named when the learner's answers are theirs
across the cases: the SLO's percentile ignored (the mean wait instead of the p99 — or no wait at all,
replicas for the mean rate, which these loads cannot tell from it), each replica its own queue, the prefills' interference forgotten, the
fewest replicas instead of the fewest GPUs, KV for the mean context, the weights forgotten."""
from __future__ import annotations

import math
import random
from typing import Any, Callable

from inflight.exercises.fleet import A100, _variant
from inflight.exercises.grading import Case, GradeResult, Mistake, grade
from inflight.sim.fleet import (GPU, H100, LLAMA_8B, LLAMA_70B, SLO, Load, Model, colocated_tpot, erlang_c,
                                fleet_wait_quantile, max_batch, plan, step_time)

__all__ = ["capacity_plan", "check_capacity_plan", "MISTAKES", "cases", "REPLICA_TOLERANCE"]

REPLICA_TOLERANCE = 0.05  # of the model's replicas, and at least one


def capacity_plan(m: Model, g: GPU, load: Load, slo: SLO, mem_util: float = 0.9, mfu: float = 0.5) -> dict | None:
    """The package's answer: `inflight.sim.fleet.plan` as the exercise's dict."""
    p = plan(m, g, load, slo, mem_util=mem_util, mfu=mfu)
    return None if p is None else {"tp": p.tp, "replicas": p.replicas, "gpus": p.gpus}


def _wait(kind: str, lam: float, mu: float, n: int, p: float) -> float:
    if kind == "mean":  # the mean wait of an M/M/n queue: C / (n·mu - lam)
        return math.inf if lam >= n * mu else erlang_c(n, lam / mu) / (n * mu - lam)
    if kind == "separate":  # n M/M/1 queues at lam / n each
        lam1, rho = lam / n, lam / (n * mu)
        return math.inf if rho >= 1 else (0.0 if rho <= 1 - p else math.log(rho / (1 - p)) / (mu - lam1))
    return fleet_wait_quantile(lam, mu, n, p)


def _plan_variant(*, wait: str = "quantile", interference: bool = True, pick: str = "gpus",
                  batch: Callable = max_batch) -> Callable:
    def impl(m: Model, g: GPU, load: Load, slo: SLO, mem_util: float = 0.9, mfu: float = 0.5) -> dict | None:
        options = []
        for tp in (1, 2, 4, 8):
            b = batch(m, g, load, slo, tp, mem_util)
            t_prefill = 2 * m.params * load.prompt_len / (tp * g.flops * mfu)
            if b == 0 or t_prefill >= slo.ttft_s:
                continue
            t_step = step_time(m, g, b, load.prompt_len + load.output_len / 2, tp)
            mu = 1 / (t_prefill + load.output_len * t_step / b)
            n = max(1, math.floor(load.rate / mu) + 1)
            while t_prefill + _wait(wait, load.rate, mu, n, slo.percentile) > slo.ttft_s:
                n += 1
            while interference and colocated_tpot(t_step, load.rate / n, t_prefill) > slo.tpot_s:
                n += 1
            options.append({"tp": tp, "replicas": n, "gpus": n * tp})
        key = (lambda o: (o["gpus"], o["tp"])) if pick == "gpus" else (lambda o: (o["replicas"], o["tp"]))
        return min(options, key=key) if options else None
    return impl


MISTAKES = [
    Mistake("the SLO's percentile ignored", "you sized the fleet for the mean wait (or for none: "
            "just enough replicas for the mean rate, which here gives the same answers); the objective is the p99 (or the "
            "percentile the SLO names) of TTFT, and a queue's tail is far longer than its mean: the wait the "
            "p-quantile allows is P(W > w) = C(n, λ/μ)·exp(−(nμ − λ)·w) = 1 − p, solved for w "
            "(fleet_wait_quantile).", _plan_variant(wait="mean")),
    Mistake("each replica its own queue", "you made every replica an M/M/1 queue at λ/n; a router that sends each "
            "request to a replica with room pools them into one M/M/n queue, which waits far less "
            "(Erlang C: fleet_wait_quantile(λ, μ, n, p)).", _plan_variant(wait="separate")),
    Mistake("the prefills' interference forgotten", "colocated, each replica also runs the prefills of its share "
            "of the load, (λ/n)·t_prefill of its time, which stretches every decode's TPOT to "
            "t_step / (1 − share) (colocated_tpot): add replicas until that meets the TPOT too.",
            _plan_variant(interference=False)),
    Mistake("the fewest replicas, not the fewest GPUs", "a replica of tp GPUs costs tp GPUs: compare the sizes by "
            "replicas × tp, not by the number of replicas.", _plan_variant(pick="replicas")),
    Mistake("KV for the mean context", "the batch was sized with each request's KV at its mean context; the pool "
            "must hold every running request at its peak, prompt + output (the first exercise).",
            _plan_variant(batch=_variant(context="mean"))),
    Mistake("the weights forgotten", "every replica holds its own copy of the weights: the KV gets tp × memory × "
            "mem_util − weight_bytes (the first exercise).", _plan_variant(batch=_variant(weights=False))),
]


def _within(ref: dict | None) -> Callable[[Any], Any]:
    """An answer within the tolerance of `ref` reads as `ref`; any other is shown as it is."""
    def norm(got: Any) -> Any:
        if ref is None or not isinstance(got, dict):
            return got
        try:
            n, tp, gpus = got["replicas"], got["tp"], got["gpus"]
            ok = tp == ref["tp"] and gpus == n * tp and abs(n - ref["replicas"]) <= max(1, REPLICA_TOLERANCE * ref["replicas"])
        except (KeyError, TypeError):
            return got
        return dict(ref) if ok else got
    return norm


def _case(name: str, m: Model, g: GPU, load: Load, slo: SLO) -> Case:
    norm = _within(capacity_plan(m, g, load, slo))
    return Case(name, lambda f, a=(m, g, load, slo): norm(f(*a)), describe=f"model {m}, GPU {g}, {load}, {slo}",
                data=(m, g, load, slo), fields=None)


def cases(seed: int = 0, n_random: int = 30) -> list[Case]:
    rng = random.Random(seed)
    out = [_case("the chapter's: Llama-3-70B on H100s, 20 req/s, 1000+200, p99 TTFT 1 s, TPOT 50 ms", LLAMA_70B, H100,
                 Load(20, 1000, 200), SLO(1.0, 0.05, 0.99)),
           _case("the same at the median TTFT", LLAMA_70B, H100, Load(20, 1000, 200), SLO(1.0, 0.05, 0.5)),
           _case("Llama-3-70B, 8000-token prompts (the prefills interfere)", LLAMA_70B, H100, Load(20, 8000, 200),
                 SLO(2.0, 0.05, 0.99)),
           _case("Llama-3-8B on H100s, 100 req/s, 500+300, p99 TTFT 300 ms, TPOT 20 ms", LLAMA_8B, H100,
                 Load(100, 500, 300), SLO(0.3, 0.02, 0.99)),
           _case("Llama-3-70B on A100-40GB, 5 req/s", LLAMA_70B, A100, Load(5, 1000, 200), SLO(2.0, 0.1, 0.9)),
           _case("a 1T-parameter model: fits on no size", Model(1e12, 100, 8, 128), H100, Load(20, 1000, 200),
                 SLO(1.0, 0.05, 0.99))]
    out += _queue_cases(rng, 12)
    first = len(out)
    while len(out) < first + n_random:
        m = Model(rng.uniform(1e9, 120e9), rng.choice((16, 32, 48, 80)), rng.choice((2, 4, 8)), rng.choice((64, 128)))
        g = GPU(rng.choice((40e9, 80e9, 141e9)), rng.uniform(1.5e12, 4.8e12), rng.uniform(300e12, 1000e12))
        load = Load(rng.uniform(2, 60), rng.randint(200, 6000), rng.randint(32, 1000))
        slo = SLO(rng.uniform(0.5, 3.0), rng.uniform(0.02, 0.12), rng.choice((0.5, 0.9, 0.99, 0.999)))
        if capacity_plan(m, g, load, slo) is not None:  # the random cases all have an answer
            out.append(_case(f"random case {len(out) - first}", m, g, load, slo))
    return out


def _queue_cases(rng: random.Random, n: int) -> list[Case]:
    """Loads where the TTFT's percentile decides: a smaller model, long prompts, short answers and a
    loose TPOT, and a TTFT of 1.5-4 times the prefill at the best size (so the wait it leaves is short)."""
    out = []
    while len(out) < n:
        m = Model(rng.uniform(1e9, 30e9), rng.choice((16, 32)), rng.choice((2, 4, 8)), 128)
        g = GPU(80e9, rng.uniform(2e12, 4.8e12), rng.uniform(400e12, 1000e12))
        load = Load(rng.uniform(1, 30), rng.randint(1000, 8000), rng.randint(16, 64))
        first = capacity_plan(m, g, load, SLO(1.0, 1.0, 0.99))
        if first is None:
            continue
        t_prefill = 2 * m.params * load.prompt_len / (first["tp"] * g.flops * 0.5)
        slo = SLO(t_prefill * rng.uniform(1.5, 4.0), 0.2, rng.choice((0.99, 0.999)))
        if capacity_plan(m, g, load, slo) is not None:
            out.append(_case(f"the queue decides {len(out)}", m, g, load, slo))
    return out


def check_capacity_plan(fn: Callable[..., Any], *, quiet: bool = False) -> GradeResult:
    """Grade `capacity_plan(model, gpu, load, slo)` against `inflight.sim.fleet.plan` (see the module's
    tolerance)."""
    return grade("capacity_plan", fn, capacity_plan, cases(), MISTAKES, quiet=quiet,
                 fields={"tp": "the tensor-parallel size with the fewest GPUs",
                         "replicas": "the fewest replicas meeting the TTFT at its percentile and the TPOT",
                         "gpus": "replicas × tp"})
