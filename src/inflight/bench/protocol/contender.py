"""`python -m inflight.bench.protocol.contender --mode M`: one measurement of one mode, in this process, for
`inflight.bench.protocol.fair` (each system in its own process, at its own settings).

It builds the benchmark's long-tailed workload (the same requests in every process: same seed, same
shape), serves a short warm-up, then times one run of the mode and writes the result JSON to
`$INFLIGHT_RESULT` (or prints it): `value` (useful tokens per second), every request's `tokens`, the
wall time, the threads and OpenMP wait policy this process ran with, and the machine's load around
the run. `--floor` adds the run's floor (`bench.protocol.floor`, measured in this process right after the
run: the linear layers at their best, one read of the KV per step) for an engine mode.

Nothing here sets threads or a wait policy: whatever the environment (OMP_NUM_THREADS,
OMP_WAIT_POLICY, GOMP_SPINCOUNT) and import order gave this process is what is measured, so the protocol can try
each setting in its own process.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from typing import Any, Sequence

__all__ = ["main", "measure"]


def measure(mode: str, n: int, seed: int = 0, batch_size: int = 64, floor: bool = False, model_name: str | None = None,
            weights: str | None = None, device: str = "cpu", split: bool = False, **shape: Any) -> dict[str, Any]:
    """Warm up, then time `mode` once on the long-tailed workload of `n` requests (`shape`: its
    `prompt_range`, `output_mean`, `output_cap`) with the benchmark's model `model_name` (None: the
    tiny model) or the one saved at `weights` (`bench.offline.models.save_model`), in float32 (every process's
    tokens must be the same) on `device`. With `split` (an engine mode), one more run of the same
    workload after the timed one, with its time split by what the work is (`bench.offline.time_split`)."""
    import torch

    from inflight.bench.offline.config import BenchConfig
    from inflight.bench.offline.metrics import ideal_speedup, summarize
    from inflight.bench.offline.suite import _plan, _setup, run_mode
    from inflight.bench.offline.models import load_model, load_saved
    from inflight.engine.gc_heap import freeze_gc_heap
    from inflight.threads import LoadWatch, openmp_idle_wait, passive_wait_in_effect

    model = load_saved(weights).to(device) if weights else load_model(model_name, device, "float32", seed).model
    cfg = BenchConfig(n=n, seed=seed, batch_size=batch_size, modes=[mode], **shape)
    setup = _setup(cfg, model)
    if mode.startswith("hf_") and setup.hf is None:
        raise RuntimeError(f"transformers model unavailable: {setup.hf_error}")
    lt, _ = _plan(cfg, model.config.vocab_size, setup.max_len, with_sequential=False)
    warm = _plan(BenchConfig(n=4, seed=seed + 1, batch_size=batch_size, **shape), model.config.vocab_size,
                 setup.max_len, with_sequential=False)[0]
    run_mode(mode, setup, warm)  # first-call costs (allocator, operator caches, the C build) out of the clock
    # this process is the protocol's own: every mode's timed run starts with its heap frozen, out of the
    # garbage collector's full passes (`inflight.engine.gc_heap`, as a server's is once it is up), so
    # that no one's run pays a walk over the imports and the model that another's skips
    freeze_gc_heap()
    with LoadWatch(sample_seconds=0.1) as watch:
        rec = run_mode(mode, setup, lt)
    frozen = gc.get_freeze_count()  # (it walks the frozen objects: counted after the clock)
    out = {"mode": mode, "value": lt.useful_tokens / rec.wall, "unit": "tokens/s", "wall_s": rec.wall,
           "useful_tokens": lt.useful_tokens, "requests": n, "tokens": rec.tokens,
           "work_bound_ideal": ideal_speedup(lt, batch_size)["work_bound_speedup"],
           "prompt_tokens": sum(len(r.prompt) for r in lt.requests),
           "work_bound_ideal_with_prompts": _ideal_with_prompts(lt, batch_size),
           "torch_threads": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
           "passive_wait": passive_wait_in_effect(), "idle_wait": openmp_idle_wait(),
           "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"), "kernels": _kernels(), "load": watch.as_dict(),
           "gc_frozen_objects": frozen, "gc_pauses": rec.gc_pauses}
    # the benchmark's per-mode summary (latencies, forward calls, time outside the forward pass, ...)
    out["summary"] = {k: v for k, v in summarize(rec, lt, None).items() if k not in ("work_per_step", "batch_over_time")}
    if floor:
        out["floor"] = _floor(model, rec, lt)
    if split:
        out["time_split"] = _split(mode, setup, lt)
    return out


def _split(mode: str, setup: Any, workload: Any) -> dict[str, Any]:
    """One more run, its time split by category (`bench.offline.time_split`); its tokens must be the timed run's."""
    from inflight.bench.offline.suite import run_mode
    from inflight.bench.offline.time_split import TimeSplit, split_of_run

    with TimeSplit(setup.model) as ts:
        rec = run_mode(mode, setup, workload)
    if not rec.step_stats:
        raise ValueError(f"mode {mode!r} records no engine steps: the split is for engine modes")
    return split_of_run(ts, rec.step_stats, rec.wall)


def _ideal_with_prompts(workload: Any, batch_size: int) -> float:
    """The work-bound ideal with the prompts counted too: every row static batching computes --
    each batch's prompts left-padded to its longest, its decodes to its longest output -- over the
    rows that carry a prompt or a wanted token. The work-bound ideal itself counts decodes only;
    where prompts are most of the work, both systems compute them and the two ideals part."""
    reqs, rows = workload.requests, 0
    for i in range(0, len(reqs), batch_size):
        batch = reqs[i:i + batch_size]
        rows += len(batch) * (max(len(r.prompt) for r in batch) + max(r.output_len for r in batch))
    return rows / sum(len(r.prompt) + r.output_len for r in reqs)


def _kernels() -> dict[str, Any]:
    """Where the C kernels ran last (the governor may move them step by step): the package's pool or
    torch's OpenMP team (a tree without the pool -- an older commit measured for comparison -- has
    only the latter)."""
    try:
        from inflight.model import cpu_attention, thread_pool
    except ImportError:
        return {"on": "OpenMP (torch's team)", "pool": None}
    stats = thread_pool.stats()
    on_pool = cpu_attention.parallel_backend() == "inflight thread pool" and not thread_pool.on_openmp()
    return {"on": "inflight thread pool" if on_pool else "OpenMP (torch's team)", "pool": stats}


def _floor(model: Any, rec: Any, workload: Any) -> dict[str, Any]:
    """This run against the lower bounds of its own work (`bench.protocol.floor`), measured now, here."""
    from inflight.bench.protocol.floor import time_floor
    from inflight.bench.profiling import measure_matmul_flops, measure_memory_bandwidth
    from inflight.bench.offline.record import kv_bytes_per_token

    if not rec.step_tokens:
        raise ValueError(f"mode {rec.mode!r} records no per-step work: the floor is for engine modes")
    run = {"work_per_step": {"tokens": rec.step_tokens, "kv_tokens": rec.kv_used_tokens,
                             "sequences": rec.step_sequences}, "wall_s": rec.wall,
           "useful_tokens": workload.useful_tokens}
    fl = time_floor(model, run, measure_memory_bandwidth(model.device), kv_bytes_per_token(model),
                    prompt_lens=[len(r.prompt) for r in workload.requests],
                    matmul_flops=measure_matmul_flops(model.device, model.dtype, min_seconds=0.2))
    fl["wall_over_floor"] = rec.wall / fl["floor_s"]
    return fl


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inflight.bench.protocol.contender", description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", required=True, choices=["sequential", "static", "contiguous", "paged", "hf_static",
                                                     "hf_continuous"])
    p.add_argument("-n", "--num-requests", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-B", "--batch-size", type=int, default=64)
    p.add_argument("--prompt-range", type=int, nargs=2, default=None, metavar=("LO", "HI"))
    p.add_argument("--output-mean", type=float, default=None)
    p.add_argument("--output-cap", type=int, default=None)
    p.add_argument("--model", default=None, help="the benchmark's --model (default: the tiny model)")
    p.add_argument("--weights", default=None, help="a model saved by bench.offline.models.save_model (instead of --model)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--floor", action="store_true", help="also measure this run's floor (engine modes)")
    p.add_argument("--split", action="store_true", help="also split an engine mode's time by category (one more run)")
    a = p.parse_args(argv)
    if a.num_requests < 1 or a.batch_size < 1:
        p.error("--num-requests and --batch-size must be >= 1")
    shape = {k: v for k, v in (("prompt_range", tuple(a.prompt_range) if a.prompt_range else None),
                               ("output_mean", a.output_mean), ("output_cap", a.output_cap)) if v is not None}
    if a.split and a.mode not in ("contiguous", "paged"):
        p.error("--split is for the engine modes (contiguous, paged)")
    res = measure(a.mode, a.num_requests, a.seed, a.batch_size, a.floor, a.model, a.weights, a.device, a.split, **shape)
    text = json.dumps(res)
    path = os.environ.get("INFLIGHT_RESULT")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
