"""From raw `RunRecord`s to the figures the book quotes: correctness against the reference, speed and
latency (`summarize`), the simulator's ideal (`ideal_speedup`), the hardware's roofs
(`device_limits`) and the benchmark's stated targets (`targets`)."""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from inflight.bench.offline.config import MODE_TITLES
from inflight.bench.offline.prompts import Workload
from inflight.bench.offline.record import RunRecord, kv_bytes_per_token
from inflight.stats import percentile

__all__ = ["check_outputs", "summarize", "ideal_speedup", "device_limits", "targets"]

# figures that mean nothing when a mode's tokens differ from the reference
_SPEED_KEYS = ("tokens_per_s", "requests_per_s", "wall_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
               "e2e_p50_s", "e2e_p99_s")


def check_outputs(workload: Workload, reference: dict[str, list[int]], got: dict[str, list[int]]) -> str | None:
    """None when every request's tokens equal the reference's; else a sentence saying where they differ."""
    bad = []
    for r in workload.requests:
        want = reference.get(r.id, [])[: r.output_len]
        have = got.get(r.id)
        if have is None:
            bad.append((r.id, "no output"))
            continue
        have = list(have)[: r.output_len]
        if have != want:
            k = next((i for i, (a, b) in enumerate(zip(have, want)) if a != b), min(len(have), len(want)))
            bad.append((r.id, f"token {k}: got {have[k] if k < len(have) else 'nothing'}, "
                              f"expected {want[k] if k < len(want) else 'nothing'}"))
    if not bad:
        return None
    rid, detail = bad[0]
    return (f"{len(bad)} of {len(workload.requests)} requests differ from the sequential reference; "
            f"first: {rid} at {detail}")


def _pct(values: Sequence[float], q: float) -> float | None:
    """`percentile` (numpy's linear interpolation), None for no values so the JSON stays valid."""
    return percentile(values, q) if len(values) else None


def _thin(series: dict[str, list], limit: int = 1500) -> dict[str, list]:
    """Every k-th point of parallel lists so that at most `limit` remain (keeps the JSON small)."""
    n = len(next(iter(series.values()), []))
    k = max(1, math.ceil(n / limit))
    return {key: vals[::k] for key, vals in series.items()}


def _latencies(rec: RunRecord, workload: Workload) -> dict[str, Any]:
    """TTFT, TPOT and end-to-end time of every request (from its arrival), with their p50 / p99."""
    reqs = workload.requests
    ttft = [rec.first_token[r.id] - r.arrival for r in reqs if r.id in rec.first_token]
    tpot = [(rec.finish[r.id] - rec.first_token[r.id]) / (r.output_len - 1)
            for r in reqs if r.output_len > 1 and r.id in rec.finish and r.id in rec.first_token]
    e2e = [rec.finish[r.id] - r.arrival for r in reqs if r.id in rec.finish]
    return {"ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99),
            "tpot_p50_s": _pct(tpot, 50), "tpot_p99_s": _pct(tpot, 99),
            "e2e_p50_s": _pct(e2e, 50), "e2e_p99_s": _pct(e2e, 99), "ttft_s": ttft, "tpot_s": tpot}


def _memory(rec: RunRecord) -> dict[str, Any]:
    """KV reserved vs KV holding tokens of unfinished requests (mean and peak over steps)."""
    bpt, used = rec.kv_bytes_per_token or 0, rec.kv_used_tokens
    mean = (sum(used) / len(used) * bpt) if used and bpt else None
    return {"kv_allocated_bytes": rec.kv_allocated_bytes, "kv_used_mean_bytes": mean,
            "kv_used_peak_bytes": (max(used) * bpt) if used and bpt else None,
            "kv_used_share": mean / rec.kv_allocated_bytes if rec.kv_allocated_bytes and mean is not None else None,
            "peak_memory_bytes": rec.peak_memory_bytes}


def _engine_shares(stats: dict[str, Any]) -> dict[str, float]:
    """The engine's own split of its steps: schedule, prepare inputs, sample (shares of the step)."""
    if stats.get("forward_time") is None:
        return {}
    total = sum(stats.get(k, 0.0) for k in ("schedule_time", "prepare_time", "forward_time", "sample_time"))
    if total <= 0:
        return {}
    return {"schedule_share": stats["schedule_time"] / total, "prepare_share": stats["prepare_time"] / total,
            "sample_share": stats["sample_time"] / total,
            "sched_prep_share": (stats["schedule_time"] + stats["prepare_time"]) / total}


def summarize(rec: RunRecord, workload: Workload, mismatch: str | None = None) -> dict[str, Any]:
    """The figures of one mode: speeds (unless its outputs differ), latencies, memory, overhead."""
    n = len(workload.requests)
    busy = max(rec.wall - rec.idle, 1e-12)
    steps = rec.step_batch
    out: dict[str, Any] = {
        "mode": rec.mode, "title": MODE_TITLES.get(rec.mode, rec.mode),
        "status": "ok" if mismatch is None else "outputs differ", "reason": mismatch,
        "requests": n, "useful_tokens": workload.useful_tokens, "wall_s": rec.wall, "idle_s": rec.idle,
        "tokens_per_s": workload.useful_tokens / rec.wall if rec.wall > 0 else None,
        "requests_per_s": n / rec.wall if rec.wall > 0 else None,
        **_latencies(rec, workload),
        "steps": len(steps), "forward_calls": rec.forward_calls, "forward_tokens": rec.forward_tokens,
        "mean_batch": sum(steps) / len(steps) if steps else None, "max_batch": max(steps) if steps else None,
        "forward_s": rec.forward_seconds,
        "outside_forward_share": (None if rec.forward_seconds is None else max(0.0, 1 - rec.forward_seconds / busy)),
        **_memory(rec),
        "engine_stats": rec.engine_stats, "notes": rec.notes,
        "batch_over_time": _thin({"t": rec.step_time, "batch": rec.step_batch}),
        # what each step computed (engine modes): tokens fed to the model, KV tokens the running requests
        # held (recorded on steps that returned tokens), the sequences in each step (the most rows its LM head
        # ran on); `bench.protocol.floor` turns them into lower bounds
        "work_per_step": {"tokens": rec.step_tokens, "kv_tokens": rec.kv_used_tokens,
                          "sequences": rec.step_sequences} if rec.step_tokens else None,
        **_engine_shares(rec.engine_stats),
    }
    if mismatch is not None:  # refuse to report a speed for outputs that differ
        out.update({key: None for key in _SPEED_KEYS}, ttft_s=[], tpot_s=[])
    return out


def ideal_speedup(workload: Workload, batch_size: int) -> dict[str, Any]:
    """The simulator's step counts for static vs continuous batching with `batch_size` slots on these
    output lengths (one token per request per step): the best continuous batching can do here."""
    from inflight.sim.schedulers import ContinuousBatchScheduler, StaticBatchScheduler
    from inflight.sim.simulate import simulate
    from inflight.sim.workloads import from_lengths

    lens = [r.output_len for r in workload.requests]
    w = from_lengths(lens)
    st = simulate(StaticBatchScheduler(batch_size), w)
    co = simulate(ContinuousBatchScheduler(batch_size), w)
    # rows a padded static batch computes vs rows that produce a useful token: the speedup when a
    # step's cost grows with its rows (compute-bound), as opposed to steps that cost the same
    static_rows = sum(len(lens[i:i + batch_size]) * max(lens[i:i + batch_size]) for i in range(0, len(lens), batch_size))
    return {"batch_size": batch_size, "static_steps": st.steps, "continuous_steps": co.steps,
            "static_utilization": st.utilization, "continuous_utilization": co.utilization,
            "ideal_speedup": st.steps / co.steps,
            "static_row_steps": static_rows, "useful_row_steps": sum(lens),
            "work_bound_speedup": static_rows / sum(lens)}


def device_limits(model: Any, mean_context: float, batch_sizes: dict[str, float], measure_seconds: float = 0.5
                  ) -> dict[str, Any]:
    """What the hardware allows this model: a compute roof (measured matmul FLOP/s over FLOPs per
    token) and, per batch size, a bandwidth roof (weights + the batch's KV read once per step) and the
    rate of the model's linear layers alone at that batch (what its shapes allow, nothing else counted)."""
    from inflight.bench.profiling import (measure_linear_layers, measure_matmul_flops, measure_memory_bandwidth,
                                          model_flops_per_token)

    dev = model.device
    flops = measure_matmul_flops(dev, model.dtype if model.dtype != torch.float16 or dev.type == "cuda"
                                 else torch.float32, min_seconds=measure_seconds)
    bw = measure_memory_bandwidth(dev, min_seconds=measure_seconds)
    fpt = model_flops_per_token(model.config, mean_context)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bpt = kv_bytes_per_token(model)
    roofs = {}
    for name, b in batch_sizes.items():
        if not b:
            continue
        step_bytes = weight_bytes + b * mean_context * bpt
        rows = max(1, round(b))
        roofs[name] = {"batch": b, "bytes_per_step": step_bytes,
                       "bandwidth_roof_tokens_per_s": b * bw / step_bytes,
                       "roof_tokens_per_s": min(flops / fpt, b * bw / step_bytes),
                       # the linear layers alone at this batch: the ceiling of this model's shapes
                       "linear_layers_tokens_per_s": rows / measure_linear_layers(model, rows, min_seconds=measure_seconds / 2)}
    return {"matmul_flops_per_s": flops, "memory_bytes_per_s": bw, "model_flops_per_token": fpt,
            "mean_context": mean_context, "weight_bytes": weight_bytes, "kv_bytes_per_token": bpt,
            "compute_roof_tokens_per_s": flops / fpt, "per_mode": roofs}


def targets(results: dict[str, Any], batch_size: int) -> dict[str, Any]:
    """The benchmark's stated targets on the long-tailed workload, each with its figures and `met`."""
    lt = results["workloads"].get("long_tailed", {})
    modes = lt.get("modes", {})
    tps = {m: (v or {}).get("tokens_per_s") for m, v in modes.items()}
    t: dict[str, Any] = {}
    ideal = lt.get("ideal")
    if ideal and tps.get("contiguous") and tps.get("static"):
        realized = tps["contiguous"] / tps["static"]
        frac = realized / ideal["ideal_speedup"]
        t["continuous_realizes_90pct_of_ideal"] = {
            "ideal_speedup": ideal["ideal_speedup"], "realized_speedup": realized, "fraction": frac,
            "work_bound_speedup": ideal["work_bound_speedup"],
            "fraction_of_work_bound": realized / ideal["work_bound_speedup"], "met": frac >= 0.9}
    if ideal and tps.get("paged") and tps.get("static"):
        t["paged_vs_static_speedup"] = {"value": tps["paged"] / tps["static"]}
    # the goals differ by hardware (issue 14): on a GPU the peers' launch overheads are the gap to close
    on_gpu = str(results.get("model", {}).get("device", "")).startswith("cuda")
    if on_gpu:
        for peer, goal in (("hf_static", 5), ("hf_continuous", 2)):
            if tps.get("paged") and tps.get(peer):
                ratio = tps["paged"] / tps[peer]
                t[f"paged_{goal}x_{peer}"] = {"ratio": ratio, "goal": goal, "met": ratio >= goal}
    else:
        t.update(_peer_targets(tps, ideal, modes.get("paged") or {}, results.get("time_floor") or {},
                               results.get("fair") or {}))
    floor = ((results.get("fair") or {}).get("target") or {}).get("floor") or {}
    if floor.get("n"):  # the fair rounds' own floors: each paged run over the floor measured in its process
        t["paged_time_at_most_1.3x_floor"] = {
            "median": floor["median"], "range": [floor["min"], floor["max"]], "rounds": floor["n"],
            "median_wall_over_lowest_floor": floor.get("median_wall_over_lowest_floor"),
            "target": floor["wall_over_floor_at_most"], "met": floor["met"]}
    share = {}
    for m in ("contiguous", "paged"):
        es = (modes.get(m) or {}).get("engine_stats") or {}
        if es.get("full_batch_sched_prep_share") is not None:
            share[m] = {"sched_prep_share_at_full_batch": es["full_batch_sched_prep_share"],
                        "steps_at_full_batch": es.get("full_batch_steps"),
                        "step_ms_at_full_batch": es.get("full_batch_step_ms"),
                        "outside_forward_share_whole_run": (modes.get(m) or {}).get("outside_forward_share")}
    step = results.get("decode_step", {}).get("results") or {}
    if step.get("graphs_ms") is not None:
        t["decode_step_3ms_at_batch_1"] = {k: step.get(k) for k in ("eager_ms", "graphs_ms", "target_ms", "met")}
    if share:
        worst = max(v["sched_prep_share_at_full_batch"] for v in share.values())
        t["sched_prep_under_10pct_at_batch"] = {"batch_size": batch_size, "modes": share, "met": worst < 0.10}
    return t


# Issue 14's CPU targets, as ratios measured side by side in one run.
ROOF_TARGET = 0.50             # of the compute roof at the benchmark's batch size
PER_TOKEN_COST_TARGET = 1.5    # x the work-bound ideal over `transformers` static generate
HF_CONTINUOUS_TARGET = 15.0    # x `transformers` continuous batching


def _peer_targets(tps: dict[str, Any], ideal: dict[str, Any] | None, paged: dict[str, Any],
                  floor: dict[str, Any], fair: dict[str, Any]) -> dict[str, Any]:
    """The paged engine against its roof and its peers (each entry: the figures and `met`). The
    ratios come from the fair comparison when it ran (`bench.protocol.fair`: the median over its rounds, with
    the range), else from this process's table (marked so). With the run's time floor
    (`bench.protocol.floor`), each entry also says the most the target's measure could reach on this machine
    if everything but the linear layers were free, and whether the target is within it."""
    t: dict[str, Any] = {}
    ok = floor.get("status") == "ok"
    bounds = floor.get("ratio_bounds", {}) if ok else {}
    if paged.get("fraction_of_roof") is not None:
        entry: dict[str, Any] = {"fraction": paged["fraction_of_roof"], "met": paged["fraction_of_roof"] >= ROOF_TARGET}
        if ok:
            bound = floor["linear_layers_at_batch"]["fraction_of_compute_roof"]
            entry |= {"bound_linear_layers_alone": bound, "reachable": bound >= ROOF_TARGET}
        t["paged_50pct_of_compute_roof"] = entry
    for peer, key in (("hf_static", "paged_1.5x_work_bound_ideal_over_hf_static"),
                      ("hf_continuous", "paged_15x_hf_continuous")):
        entry = _peer_ratio(peer, tps, fair)
        if entry is None:
            continue
        ratio = entry["ratio"]
        if peer == "hf_static" and ideal and ideal.get("work_bound_speedup"):
            # the scheduling gain is at most the work-bound ideal; what is beyond it is a cheaper token
            wb = ideal["work_bound_speedup"]
            entry |= {"work_bound_ideal": wb, "of_ideal": ratio / wb, "met": ratio >= PER_TOKEN_COST_TARGET * wb}
            if "range" in entry:
                entry["of_ideal_range"] = [x / wb for x in entry["range"]]
            if peer in bounds:
                entry |= {"bound_of_ideal_linear_only": bounds[peer]["linear_only"] / wb,
                          "bound_of_ideal_linear_and_kv": bounds[peer]["linear_and_kv"] / wb,
                          "reachable": bounds[peer]["linear_and_kv"] / wb >= PER_TOKEN_COST_TARGET}
        elif peer == "hf_continuous":
            entry["met"] = ratio >= HF_CONTINUOUS_TARGET
            if peer in bounds:
                entry |= {"bound_linear_only": bounds[peer]["linear_only"],
                          "bound_linear_and_kv": bounds[peer]["linear_and_kv"],
                          "reachable": bounds[peer]["linear_and_kv"] >= HF_CONTINUOUS_TARGET}
        t[key] = entry
    return t


def _peer_ratio(peer: str, tps: dict[str, Any], fair: dict[str, Any]) -> dict[str, Any] | None:
    """paged over `peer`: the fair comparison's median (and range, rounds), else this process's ratio."""
    r = (fair.get("summary") or {}).get("ratios", {}).get(f"paged/{peer}") if fair.get("status") == "ok" else None
    if r and r.get("median"):
        return {"ratio": r["median"], "range": [r["min"], r["max"]], "rounds": r["n"],
                "measured": "fair: each system in its own process at its best setting, alternating (bench.protocol.fair)"}
    if tps.get("paged") and tps.get(peer):
        return {"ratio": tps["paged"] / tps[peer], "measured": "in one process (no fair comparison ran)"}
    return None
