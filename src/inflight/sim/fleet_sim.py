"""A fleet in time: replicas whose engine is a few coefficients fitted from real runs, behind the
router policies of `inflight.sim.fleet.simulate_routing`, at tens to thousands of replicas. Torch-free
(numpy and the standard library).

`fit_prefill` and `fit_decode` compute a `ServiceModel` from measurements (a committed
`python -m inflight.bench.serve.cluster` run; one replica's `sweep`); `simulate_fleet` runs chat
sessions through a fleet of such replicas and returns the hit rate, TTFT p50/p99 and the load spread.
What it leaves out is said in its docstring: a first answer at a scale no laptop runs, checked against
the real fleet at the real fleet's size (chapter 11)."""
from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from inflight.checks import number
from inflight.sim.fleet import ROUTING_POLICIES

__all__ = ["ServiceModel", "fit_prefill", "fit_decode", "session_prompt_tokens", "simulate_fleet"]


@dataclass(frozen=True)
class ServiceModel:
    """One replica's engine as four coefficients: a prefill takes `prefill_base_s + uncached prompt
    tokens · prefill_s_per_token`; a decode step of `B` running requests takes `step_base_s +
    B · step_s_per_seq`. `fit_prefill` and `fit_decode` compute them from measurements."""
    prefill_base_s: float
    prefill_s_per_token: float
    step_base_s: float
    step_s_per_seq: float

    def step_s(self, batch: float) -> float:
        return self.step_base_s + max(batch, 1.0) * self.step_s_per_seq


def _line_fit(x, y) -> tuple[float, float]:
    """Least squares y = a + b·x with a, b >= 0 (a negative one is set to 0 and the other refitted)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 2 or np.ptp(x) == 0:
        raise ValueError("a line needs at least two distinct x values")
    b, a = np.polyfit(x, y, 1)
    if b < 0:
        return float(max(y.mean(), 0.0)), 0.0
    if a < 0:
        return 0.0, float(max((x @ y) / (x @ x), 0.0))
    return float(a), float(b)


def session_prompt_tokens(system_len: int, question_len: int, output_len: int, turns: int) -> list[int]:
    """The prompt of each turn of a chat session that resends its history: system + t · (question +
    answer) + question."""
    return [system_len + t * (question_len + output_len) + question_len for t in range(turns)]


def fit_prefill(run: dict) -> dict:
    """Prefill coefficients from a committed `python -m inflight.bench.serve.cluster` run: each
    policy's median TTFT against its mean *uncached* prompt tokens (the mean prompt · (1 − hit rate),
    the hit rate from the replicas' own `/metrics`), a least-squares line. The coefficients and the
    points with their fitted values."""
    s = run["settings"]
    mean_prompt = float(np.mean(session_prompt_tokens(s["system_len"], s["question_len"], s["output_len"], s["turns"])))
    pts = [(r["policy"], mean_prompt * (1 - r["hit_rate"]), r["p50_ttft_ms"] / 1e3) for r in run["policies"]]
    a, b = _line_fit([p[1] for p in pts], [p[2] for p in pts])
    return {"prefill_base_s": a, "prefill_s_per_token": b, "mean_prompt_tokens": mean_prompt,
            "points": [{"policy": p, "uncached_tokens": x, "p50_ttft_s": y, "fitted_s": a + b * x} for p, x, y in pts]}


def fit_decode(rows: list[dict], output_len: int) -> dict:
    """Decode-step coefficients from one replica's measured rows (`request_throughput` req/s and the
    median TPOT, `median_tpot_ms` as `inflight.bench.serve.sweep` returns it, or `p50_tpot_ms`): the batch by Little's law (requests
    decoding at once = throughput × the time each spends decoding, output_len · TPOT), then a
    least-squares line of the step time (the TPOT) against it. With fewer than two distinct batches
    the whole step is the base."""
    tpots = [r.get("median_tpot_ms", r.get("p50_tpot_ms")) / 1e3 for r in rows]
    pts = [{"batch": max(1.0, r["request_throughput"] * output_len * t), "step_s": t} for r, t in zip(rows, tpots)]
    try:
        a, b = _line_fit([p["batch"] for p in pts], [p["step_s"] for p in pts])
    except ValueError:
        a, b = (float(np.mean([p["step_s"] for p in pts])) if pts else 0.0), 0.0
    return {"step_base_s": a, "step_s_per_seq": b, "points": pts}


class _Replicas:
    """The fleet's state: each replica's LRU prefix cache (key -> blocks), who holds each key, the
    router's own record of the prompts it sent each replica (key -> {replica: blocks}, never evicted:
    vllm-router's radix tree, trimmed only every 120 s), requests in flight, when each processor is
    free, requests served."""

    def __init__(self, n: int, cache_blocks: int, systems, sys_blocks: int):
        self.caches = [OrderedDict() for _ in range(n)]
        self.used = [0] * n
        self.holders: dict[tuple, dict[int, int]] = {}
        self.sent: dict[tuple, dict[int, int]] = {}
        self.inflight = np.zeros(n, dtype=np.int64)
        self.free_at = [0.0] * n
        self.served = [0] * n
        self.cache_blocks, self.systems, self.sys_blocks = cache_blocks, systems, sys_blocks

    def cached(self, i: int, s: int) -> int:
        """Blocks of session `s`'s next prompt replica `i` holds: its system prompt, then its history."""
        c = self.caches[i]
        return 0 if ("sys", self.systems[s]) not in c else self.sys_blocks + c.get(("sess", s), 0)

    def tree_match(self, i: int, s: int) -> int:
        """Blocks of session `s`'s next prompt the router's record says replica `i` was sent."""
        if i not in self.sent.get(("sys", self.systems[s]), ()):
            return 0
        return self.sys_blocks + self.sent.get(("sess", s), {}).get(i, 0)

    def record(self, i: int, s: int, prompt_blocks: int) -> None:
        self.sent.setdefault(("sys", self.systems[s]), {})[i] = self.sys_blocks
        self.sent.setdefault(("sess", s), {})[i] = prompt_blocks - self.sys_blocks

    def put(self, i: int, key: tuple, blocks: int) -> None:
        c = self.caches[i]
        self.used[i] += blocks - c.pop(key, 0)
        c[key] = blocks
        self.holders.setdefault(key, {})[i] = blocks
        while self.used[i] > self.cache_blocks and c:
            old, b = c.popitem(last=False)
            self.used[i] -= b
            self.holders[old].pop(i, None)

    def cache_aware(self, s: int, prompt_blocks: float, threshold: float, balance_abs: int, balance_rel: float) -> int:
        load = self.inflight
        lo, hi = int(np.argmin(load)), int(load.max())
        if hi - load[lo] > balance_abs and hi > balance_rel * max(load[lo], 1):
            return lo
        cands = self.sent.get(("sess", s)) or self.sent.get(("sys", self.systems[s])) or {}
        best = max(cands, key=lambda j: (self.tree_match(j, s), -load[j]), default=None)
        return best if best is not None and self.tree_match(best, s) / prompt_blocks > threshold else lo


def simulate_fleet(policy: str, num_replicas: int, service: ServiceModel, *, num_sessions: int = 2000,
                   session_rate: float | None = None, turns: int = 4, num_system_prompts: int = 8,
                   system_len: int = 160, question_len: int = 32, output_len: int = 16, think_s: float = 0.0,
                   block_size: int = 16, cache_blocks: int = 48, cache_threshold: float = 0.3,
                   balance_abs: int = 64, balance_rel: float = 1.5, seed: int = 0) -> dict:
    """An event simulation of `num_replicas` replicas of `service` behind a router with `policy`.

    Chat sessions start at random (Poisson, `session_rate` a second; default half a session per replica
    a second), take one of `num_system_prompts` system prompts and send `turns` turns, each when the
    previous answer is in (plus `think_s`), resending the history. Each replica has an LRU prefix cache
    of `cache_blocks` blocks (entries: a system prompt's full blocks, a session's history's); a
    request's hit is the system prompt's blocks if cached there, plus the session's if also cached.

    A replica is one processor: prefills run in arrival order (TTFT = the wait + `prefill_base_s +
    uncached · prefill_s_per_token`); a request then decodes `output_len` tokens at the step time of
    the replica's batch, and adds its share of each step (`step_s_per_seq + step_base_s / B`) to the
    processor's work, which delays the prefills after it (no chunking, no preemption). Load (for
    power_of_two and cache_aware) is requests in flight, as vllm-router counts it. cache_aware (with
    vllm-router's defaults): the idlest replica if the busiest has more than `balance_abs` requests
    over it and `balance_rel` times it; else the longest cached prefix if it covers more than
    `cache_threshold` of the prompt, else the idlest — the prefix as the router's own record of
    the prompts it sent says, not as the caches, which evict, hold it. consistent_hash: the session on a ring of 40 points per replica. Deterministic for a seed."""
    if policy not in ROUTING_POLICIES:
        raise ValueError(f"policy must be one of {ROUTING_POLICIES}, got {policy!r}")
    number("num_replicas", num_replicas, above=0)
    rng = np.random.default_rng(seed)
    n = num_replicas
    starts = np.cumsum(rng.exponential(1 / (session_rate or 0.5 * n), num_sessions))
    systems = rng.integers(num_system_prompts, size=num_sessions).tolist()
    prompts = session_prompt_tokens(system_len, question_len, output_len, turns)
    sys_blocks = system_len // block_size
    fleet = _Replicas(n, cache_blocks, systems, sys_blocks)
    route = _router(policy, fleet, rng, num_sessions * turns, cache_threshold, balance_abs, balance_rel)
    events = [(float(t), 0, s, 0, -1) for s, t in enumerate(starts)]  # (time, 0 arrives / 1 finishes, session, turn, replica)
    heapq.heapify(events)
    ttft, wait, tpot, hits, k = [], [], [], 0, 0
    while events:
        now, kind, s, t, i = heapq.heappop(events)
        if kind == 1:
            fleet.inflight[i] -= 1
            if t + 1 < turns:
                heapq.heappush(events, (now + think_s, 0, s, t + 1, -1))
            continue
        prompt = prompts[t]
        i = route(k, s, prompt / block_size)
        k += 1
        hit = min(fleet.cached(i, s) * block_size, prompt)
        hits += hit
        start = max(now, fleet.free_at[i])
        first = start + service.prefill_base_s + (prompt - hit) * service.prefill_s_per_token
        batch = int(fleet.inflight[i]) + 1
        fleet.free_at[i] = first + output_len * (service.step_s_per_seq + service.step_base_s / batch)
        ttft.append(first - now)
        wait.append(start - now)
        tpot.append(service.step_s(batch))
        fleet.inflight[i] += 1
        fleet.served[i] += 1
        fleet.record(i, s, prompt // block_size)
        fleet.put(i, ("sys", systems[s]), sys_blocks)
        fleet.put(i, ("sess", s), (prompt + output_len) // block_size - sys_blocks)
        heapq.heappush(events, (first + output_len * tpot[-1], 1, s, t, i))
    return _summary(policy, n, np.asarray(ttft), np.asarray(wait), tpot, hits / (num_sessions * sum(prompts)), np.asarray(fleet.served))


def _router(policy: str, fleet: _Replicas, rng, num_requests: int, threshold: float, balance_abs: int,
            balance_rel: float):
    """`route(k, session, prompt_blocks)` -> the replica for the `k`-th request, by `policy`."""
    n, sessions = len(fleet.caches), len(fleet.systems)
    if policy == "round_robin":
        return lambda k, s, blocks: k % n
    if policy == "power_of_two":
        coin = rng.integers(0, n, size=(num_requests, 2)).tolist()
        load = fleet.inflight
        return lambda k, s, blocks: coin[k][0] if load[coin[k][0]] <= load[coin[k][1]] else coin[k][1]
    if policy == "consistent_hash":  # each session's hash on a ring of 40 points per replica
        points, owners = np.sort(rng.random(n * 40)), rng.permutation(np.repeat(np.arange(n), 40))
        owner = owners[np.searchsorted(points, rng.random(sessions)) % len(points)].tolist()
        return lambda k, s, blocks: owner[s]
    return lambda k, s, blocks: fleet.cache_aware(s, blocks, threshold, balance_abs, balance_rel)


def _summary(policy, n, ttft, wait, tpot, hit_rate, served) -> dict:
    return {"policy": policy, "replicas": n, "requests": len(ttft), "hit_rate": hit_rate,
            "p50_ttft_s": float(np.percentile(ttft, 50)), "p99_ttft_s": float(np.percentile(ttft, 99)),
            "mean_ttft_s": float(ttft.mean()), "mean_wait_s": float(wait.mean()),
            "p99_wait_s": float(np.percentile(wait, 99)), "p50_tpot_s": float(np.percentile(tpot, 50)),
            "load_spread_max_over_mean": float(served.max() / served.mean()), "served": served.tolist()}
