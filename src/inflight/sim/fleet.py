"""Fleets as arithmetic and as a simulation: how many GPUs a load needs, and what routing does to
prefix-cache hits at a scale no laptop runs. Torch-free.

**Capacity** (`plan`, `plan_for_tp`, `max_batch`): a model (parameters, layers, KV heads, head size),
a GPU (memory, bandwidth, FLOP/s), a load (requests per second, prompt and output lengths) and SLOs
(TTFT at a percentile, TPOT). For a tensor-parallel size `tp` (one replica = `tp` GPUs):

1. memory: the KV cache gets what is left of `tp` GPUs' memory (times `mem_util`) after the
   weights, and every running request may grow to its *peak* context, prompt + output, so
   `B_mem = floor((tp·memory·mem_util − weight_bytes) / ((prompt + output) · kv_bytes_per_token))`,
   with `kv_bytes_per_token = 2 · layers · kv_heads · head_dim · bytes`;
2. TPOT: a decode step of `B` requests (their KV at the *mean* context, prompt + output/2) takes
   `max((weights + B·ctx·kv)/(tp·bandwidth), 2·params·B/(tp·flops))` (the roofline of
   `inflight.sim.roofline`, with TP's communication left out); `B_tpot` is the largest `B` whose
   step meets the TPOT SLO; the batch is `B = min(B_mem, B_tpot)`;
3. throughput: a request costs the replica its prefill, `2·params·prompt/(tp·flops·mfu)` seconds
   of the whole replica, and `output` decode steps shared by `B`: so a replica serves at most
   `mu = 1 / (t_prefill + output · t_step(B) / B)` requests per second;
4. TTFT at the percentile: requests arrive at random, so they queue. One replica alone is an M/M/1
   queue: the wait exceeds `w` with probability `rho·exp(-(mu - lam)·w)` (`rho = lam/mu`), and
   `replica_rate` is the largest `lam` whose `p`-quantile wait plus the prefill meets the TTFT. A
   fleet whose router sends each request to a replica with room pools the queueing: `n` replicas
   are an M/M/n queue, which waits with Erlang C's probability `C(n, lam/mu)` and then exceeds `w`
   with probability `C·exp(-(n·mu - lam)·w)`;
5. replicas = the smallest `n` whose p-quantile wait plus the prefill meets the TTFT at the whole
   load, and whose decodes, slowed by the prefills they share each replica with (the share
   `load/n · t_prefill` of its time), still meet the TPOT (`colocated_tpot`: the interference
   disaggregation removes); GPUs = replicas · tp; `plan` takes the `tp` (a power of two up to 8)
   with the fewest GPUs.

Also `replicas_from_curve`: the same question answered from a *measured* curve of one replica
(rate against its p99 TTFT and TPOT), which is what a capacity plan should start from.

**Routing** (`simulate_routing`): replicas with LRU prefix caches (in blocks), requests that are
turns of chat sessions (a shared system prompt, then the session's history), and vllm-router's
policies: round_robin, power_of_two, cache_aware (the longest cached prefix unless the load is
out of balance), consistent_hash (by session id). It counts cache hits and load; no time passes
(load = requests routed in a recent window), so it shows what placement does, not latency.
"""
from __future__ import annotations

import hashlib
import math
import random
from bisect import bisect
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass

from inflight.checks import number

__all__ = ["Model", "GPU", "Load", "SLO", "Plan", "kv_bytes_per_token", "max_batch", "step_time", "replica_rate",
           "plan_for_tp", "plan", "plan_disaggregated", "erlang_c", "fleet_wait_quantile", "servers_needed", "colocated_tpot", "replicas_from_curve", "simulate_routing", "ROUTING_POLICIES", "H100", "LLAMA_70B",
           "LLAMA_8B"]


@dataclass(frozen=True)
class Model:
    params: float
    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_value: float = 2.0   # weights and KV in 16-bit

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_value


@dataclass(frozen=True)
class GPU:
    memory_bytes: float
    bandwidth: float               # bytes/s
    flops: float                   # dense 16-bit FLOP/s


@dataclass(frozen=True)
class Load:
    rate: float                    # requests per second
    prompt_len: int
    output_len: int


@dataclass(frozen=True)
class SLO:
    ttft_s: float
    tpot_s: float
    percentile: float = 0.99       # of TTFT


#: Llama-3-70B and -8B (config.json: 80 / 32 layers, 8 KV heads of 128) and an H100 SXM (80 GB HBM3,
#: 3.35 TB/s, 989 TFLOP/s dense BF16: NVIDIA's datasheet)
LLAMA_70B = Model(70.6e9, 80, 8, 128)
LLAMA_8B = Model(8.03e9, 32, 8, 128)
H100 = GPU(80e9, 3.35e12, 989e12)


def kv_bytes_per_token(m: Model) -> float:
    """K and V of every layer: 2 · layers · kv_heads · head_dim · bytes."""
    return 2 * m.layers * m.kv_heads * m.head_dim * m.bytes_per_value


def step_time(m: Model, g: GPU, batch: float, context: float, tp: int = 1) -> float:
    """One decode step of `batch` requests with `context` tokens of KV each, on `tp` GPUs (roofline)."""
    mem = (m.weight_bytes + batch * context * kv_bytes_per_token(m)) / (tp * g.bandwidth)
    return max(mem, 2 * m.params * batch / (tp * g.flops))


def max_batch(m: Model, g: GPU, load: Load, slo: SLO, tp: int = 1, mem_util: float = 0.9) -> int:
    """The most requests a replica of `tp` GPUs runs at once: what its memory holds at the peak
    context, and what keeps a decode step within the TPOT SLO (0: the model does not fit)."""
    kv_budget = tp * g.memory_bytes * mem_util - m.weight_bytes
    if kv_budget <= 0:
        return 0
    b_mem = int(kv_budget // ((load.prompt_len + load.output_len) * kv_bytes_per_token(m)))
    ctx = load.prompt_len + load.output_len / 2
    if step_time(m, g, 1, ctx, tp) > slo.tpot_s:
        return 0
    lo, hi = 1, max(1, b_mem)  # the step time grows with the batch: bisect the largest that meets the SLO
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if step_time(m, g, mid, ctx, tp) <= slo.tpot_s:
            lo = mid
        else:
            hi = mid - 1
    return min(b_mem, lo)


def _wait_quantile(lam: float, mu: float, p: float) -> float:
    """The p-quantile of the wait in an M/M/1 queue: P(W > w) = rho·exp(-(mu - lam)·w)."""
    rho = lam / mu
    return 0.0 if rho <= 1 - p else math.log(rho / (1 - p)) / (mu - lam)


def replica_rate(m: Model, g: GPU, load: Load, slo: SLO, tp: int = 1, mem_util: float = 0.9,
                 mfu: float = 0.5) -> dict:
    """What one replica sustains within the SLOs, with every intermediate figure."""
    b = max_batch(m, g, load, slo, tp, mem_util)
    t_prefill = 2 * m.params * load.prompt_len / (tp * g.flops * mfu)
    out = {"tp": tp, "batch": b, "kv_bytes_per_token": kv_bytes_per_token(m), "t_prefill_s": t_prefill,
           "weights_per_gpu_bytes": m.weight_bytes / tp}
    if b == 0 or t_prefill >= slo.ttft_s:
        return {**out, "t_step_s": None, "mu": 0.0, "rate": 0.0}
    t_step = step_time(m, g, b, load.prompt_len + load.output_len / 2, tp)
    mu = 1 / (t_prefill + load.output_len * t_step / b)
    lo, hi = 0.0, mu  # the largest arrival rate whose p-quantile TTFT meets the SLO
    for _ in range(100):
        mid = (lo + hi) / 2
        if t_prefill + _wait_quantile(mid, mu, slo.percentile) <= slo.ttft_s:
            lo = mid
        else:
            hi = mid
    return {**out, "t_step_s": t_step, "mu": mu, "rate": lo}


@dataclass
class Plan:
    tp: int
    replicas: int
    gpus: int
    per_replica: dict

    def as_dict(self) -> dict:
        return asdict(self)


def erlang_c(n: int, a: float) -> float:
    """The probability that an arrival waits in an M/M/n queue of offered load `a` = lam/mu (< n)."""
    b = 1.0
    for k in range(1, n + 1):  # Erlang B by its recursion (stable), then C from B
        b = a * b / (k + a * b)
    rho = a / n
    return b / (1 - rho + rho * b)


def fleet_wait_quantile(lam: float, mu: float, n: int, p: float) -> float:
    """The p-quantile of the wait in an M/M/n queue: P(W > w) = C(n, lam/mu)·exp(-(n·mu - lam)·w)."""
    if lam >= n * mu:
        return math.inf
    c = erlang_c(n, lam / mu)
    return 0.0 if c <= 1 - p else math.log(c / (1 - p)) / (n * mu - lam)


def servers_needed(lam: float, mu: float, first_s: float, budget_s: float, p: float, limit: int = 100_000) -> int | None:
    """The fewest servers (rate `mu` each) whose p-quantile wait plus `first_s` stays within `budget_s`
    at arrival rate `lam`; None if the service alone is over the budget."""
    if first_s >= budget_s or mu <= 0:
        return None
    n = max(1, math.floor(lam / mu) + 1)  # (fewer cannot keep up at all)
    while first_s + fleet_wait_quantile(lam, mu, n, p) > budget_s:
        n += 1
        if n > limit:
            return None
    return n


def plan_for_tp(m: Model, g: GPU, load: Load, slo: SLO, tp: int, **kw) -> Plan | None:
    """Replicas of `tp` GPUs for `load`, the fleet's queueing pooled (M/M/n); None if a replica cannot
    meet the SLOs at all."""
    r = replica_rate(m, g, load, slo, tp, **kw)
    if r["mu"] <= 0:
        return None
    n = servers_needed(load.rate, r["mu"], r["t_prefill_s"], slo.ttft_s, slo.percentile)
    if n is None:
        return None
    # colocated, the prompts' prefills run between the decode steps: a replica spends the share
    # (load / n) · t_prefill of its time on them, which stretches every decode's TPOT by 1 / (1 - share)
    while colocated_tpot(r["t_step_s"], load.rate / n, r["t_prefill_s"]) > slo.tpot_s:
        n += 1
    return Plan(tp, n, n * tp, {**r, "tpot_with_prefills_s": colocated_tpot(r["t_step_s"], load.rate / n,
                                                                           r["t_prefill_s"])})


def colocated_tpot(t_step: float, rate_per_replica: float, t_prefill: float) -> float:
    """The time per output token of a replica that also runs the prefills of `rate_per_replica`
    prompts a second: its decode steps share the replica with `rate · t_prefill` of prefill work."""
    busy = rate_per_replica * t_prefill
    return math.inf if busy >= 1 else t_step / (1 - busy)


def plan(m: Model, g: GPU, load: Load, slo: SLO, tps=(1, 2, 4, 8), **kw) -> Plan | None:
    """The tensor-parallel size with the fewest GPUs (ties: the smaller tp), or None if none works."""
    plans = [p for tp in tps if (p := plan_for_tp(m, g, load, slo, tp, **kw)) is not None]
    return min(plans, key=lambda p: (p.gpus, p.tp)) if plans else None


def plan_disaggregated(m: Model, g: GPU, load: Load, slo: SLO, tps=(1, 2, 4, 8), mem_util: float = 0.9,
                       mfu: float = 0.5, link_bandwidth: float = 50e9) -> dict | None:
    """DistServe's question: how many prefill and how many decode instances (each of its own `tp`)
    meet both objectives with the fewest GPUs. A prefill instance only runs prompts, one at a time
    (`t_prefill` as in `replica_rate`), and must meet the TTFT at the percentile with the KV's
    transfer (`prompt · kv_bytes_per_token / link_bandwidth`) added; a decode instance only decodes,
    `B = max_batch(...)` requests at once, so it serves `B / (output · t_step(B))` requests per
    second (the wait for a decode slot is left out). None if no size works."""
    transfer = load.prompt_len * kv_bytes_per_token(m) / link_bandwidth
    prefill, decode = [], []
    for tp in tps:
        if tp * g.memory_bytes * mem_util <= m.weight_bytes + load.prompt_len * kv_bytes_per_token(m):
            continue
        t_p = 2 * m.params * load.prompt_len / (tp * g.flops * mfu)
        n = servers_needed(load.rate, 1 / t_p, t_p + transfer, slo.ttft_s, slo.percentile)
        if n is not None:
            prefill.append({"tp": tp, "instances": n, "gpus": n * tp, "t_prefill_s": t_p, "mu": 1 / t_p})
        b = max_batch(m, g, load, slo, tp, mem_util)
        if b > 0:
            t_step = step_time(m, g, b, load.prompt_len + load.output_len / 2, tp)
            mu = b / (load.output_len * t_step)
            n = math.ceil(load.rate / mu - 1e-9)
            decode.append({"tp": tp, "instances": n, "gpus": n * tp, "batch": b, "t_step_s": t_step, "mu": mu})
    if not prefill or not decode:
        return None
    p = min(prefill, key=lambda x: (x["gpus"], x["tp"]))
    d = min(decode, key=lambda x: (x["gpus"], x["tp"]))
    return {"prefill": p, "decode": d, "gpus": p["gpus"] + d["gpus"], "transfer_s": transfer}


def replicas_from_curve(curve: list[dict], target_rate: float, slo_ms: dict[str, float], headroom: float = 1.0) -> dict:
    """From one replica's measured rows (`request_rate`, and `p99_ttft_ms` / `p99_tpot_ms` or the keys
    named in `slo_ms`): the highest measured rate that met every SLO, and how many replicas the
    target needs (`headroom` > 1 keeps that share spare)."""
    number("target_rate", target_rate, above=0.0)
    ok = [r["request_rate"] for r in curve if all(r[f"p99_{k}_ms"] <= v for k, v in slo_ms.items())]
    best = max(ok, default=0.0)
    return {"max_rate_within_slo": best,
            "replicas": math.ceil(target_rate * headroom / best - 1e-9) if best > 0 else None}


# -- routing ---------------------------------------------------------------------------------------
ROUTING_POLICIES = ("round_robin", "power_of_two", "cache_aware", "consistent_hash")


class _LRU:
    def __init__(self, capacity: int):
        self.capacity, self.blocks = capacity, OrderedDict()

    def match(self, keys: list[str]) -> int:
        n = 0
        for k in keys:
            if k not in self.blocks:
                break
            n += 1
        return n

    def insert(self, keys: list[str]) -> None:
        for k in keys:
            self.blocks[k] = None
            self.blocks.move_to_end(k)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


def _ring(n: int, vnodes: int = 160) -> tuple[list[int], list[int]]:
    points = sorted((int(hashlib.md5(f"w{i}-{v}".encode()).hexdigest()[:12], 16), i) for i in range(n)
                    for v in range(vnodes))
    return [p for p, _ in points], [i for _, i in points]


def simulate_routing(policy: str, num_replicas: int, *, num_sessions: int = 2000, turns: int = 4,
                     num_system_prompts: int = 8, system_blocks: int = 10, turn_blocks: int = 3,
                     cache_blocks: int = 400, window: int | None = None, cache_threshold: float = 0.3,
                     balance_abs: int = 8, balance_rel: float = 1.5, seed: int = 0) -> dict:
    """Route every turn of `num_sessions` chat sessions (interleaved: sessions start in order, each
    turn of a session comes a few sessions later) to `num_replicas` replicas with LRU caches of
    `cache_blocks` blocks each; returns the hit rate (cached blocks / prompt blocks) and the load
    spread (most-loaded replica's requests over the mean). `window`: how many recent requests count
    as a replica's load (default: 4 per replica)."""
    if policy not in ROUTING_POLICIES:
        raise ValueError(f"policy must be one of {ROUTING_POLICIES}, got {policy!r}")
    rng = random.Random(seed)
    window = window or 4 * num_replicas
    caches = [_LRU(cache_blocks) for _ in range(num_replicas)]
    served = [0] * num_replicas
    recent: deque[int] = deque(maxlen=window)
    load = [0] * num_replicas
    ring_points, ring_owner = _ring(num_replicas)
    # the stream of turns: session s's turn t arrives at position s + 3t (sessions overlap)
    stream = sorted(((s + 3 * t + rng.random(), s, t) for s in range(num_sessions) for t in range(turns)))
    systems = [rng.randrange(num_system_prompts) for _ in range(num_sessions)]
    hits = queried = 0
    rr = 0
    for _, s, t in stream:
        keys = [f"sys{systems[s]}-{b}" for b in range(system_blocks)] + \
               [f"s{s}-{b}" for b in range(turn_blocks * (t + 1))]
        if policy == "round_robin":
            i, rr = rr % num_replicas, rr + 1
        elif policy == "power_of_two":
            a, b = rng.sample(range(num_replicas), 2) if num_replicas > 1 else (0, 0)
            i = a if load[a] <= load[b] else b
        elif policy == "consistent_hash":
            h = int(hashlib.md5(f"s{s}".encode()).hexdigest()[:12], 16)
            i = ring_owner[bisect(ring_points, h) % len(ring_points)]
        else:  # cache_aware (vllm-router / SGLang): balance first, then the longest match above the threshold
            lo, hi = min(load), max(load)
            if hi - lo > balance_abs and hi > balance_rel * max(lo, 1):
                i = load.index(lo)
            else:
                matches = [c.match(keys) for c in caches]
                best = max(range(num_replicas), key=lambda j: (matches[j], -load[j]))
                i = best if matches[best] / len(keys) > cache_threshold else load.index(lo)
        n = caches[i].match(keys)
        hits, queried = hits + n, queried + len(keys)
        caches[i].insert(keys)
        served[i] += 1
        if len(recent) == recent.maxlen:
            load[recent[0]] -= 1
        recent.append(i)
        load[i] += 1
    mean = sum(served) / num_replicas
    return {"policy": policy, "replicas": num_replicas, "hit_rate": hits / queried,
            "load_spread_max_over_mean": max(served) / mean, "served": served}
