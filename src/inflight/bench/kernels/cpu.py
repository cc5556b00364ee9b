"""`python -m inflight.bench.kernels.cpu`: the C code of the CPU path against the plain-torch reference, side by side.

Three measurements, each alternating the implementations in one process so that the machine's drift
hits all of them alike:

- **attention alone**: every layer's attention for one decode step of B sequences with long-tailed
  contexts in scattered blocks (what a busy paged engine sees), C decode kernel vs reference, best of
  many runs;
- **linear layers alone**: all of the model's linear layers for one step of 1 to 2048 rows, the
  weights pushed out of the CPU's caches first (as a step's attention does), torch's BLAS vs the
  skinny-GEMM kernel, median of many runs: where `skinny_gemm.max_rows()` comes from;
- **end to end**: the paged engine (the benchmark's mode 4) serving the long-tailed workload, each
  implementation `repeats` times: everything in torch ("torch"), the C attention kernel alone ("c"),
  and the C attention kernel plus the fused passes between the matrix multiplies and the skinny
  GEMMs ("fused", the engine's default on a CPU). The greedy tokens must be identical to the
  reference's, request for request.

Where no C compiler is available the C code can't be built, and the report says why.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any, Sequence

import torch

from inflight.bench.offline.config import BenchConfig
from inflight.bench.offline.report import print_and_save
from inflight.blocks import blocks_needed
from inflight.model import cpu_attention, fused_ops, skinny_gemm
from inflight.model.attention import AttentionBackend
from inflight.model.attention_metadata import AttentionMetadata
from inflight.model.kv_cache import KVCache

__all__ = ["scattered_cache", "attention_step_ms", "linear_step_ms", "end_to_end", "run", "main"]

IMPLS = ("torch", "c")  # the attention implementations
ENGINE_IMPLS = ("torch", "c", "fused")
#: the backend each implementation runs under in the engine: "auto" is the engine's default, which on a
#: CPU gives the C kernel whole steps of short prompts (and "c" by name takes decode-only steps alone)
ENGINE_BACKEND = {"torch": "torch", "c": "auto", "fused": "auto"}
ATTENTION_RAN = {"torch": "torch", "c": "c", "fused": "c"}  # what `last_used` must then say
LINEAR_ROWS = (1, 2, 5, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048)
FLUSH_BYTES = 64 << 20  # more than a server CPU's last-level cache: what a step's KV read does to the weights


@contextmanager
def _implementation(model: Any, name: str):
    """The engine's model runs attention and the small operators the way `name` says, inside the block."""
    saved = model.attention_backend
    model.attention_backend = AttentionBackend(ENGINE_BACKEND[name])
    try:
        if name == "fused":
            yield
        else:
            with fused_ops.reference_only():
                yield
    finally:
        model.attention_backend = saved


def scattered_cache(cfg: Any, contexts: Sequence[int], block_size: int, rng: random.Random,
                    gen: torch.Generator | None = None):
    """A cache twice the size `contexts` need, filled with random keys and values (from `gen`), and
    each context's block table drawn from it in shuffled order (what a busy paged engine holds)."""
    num_blocks = sum(blocks_needed(c, block_size) for c in contexts) * 2
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(blocks_needed(c, block_size))] for c in contexts]
    kv = KVCache.for_model(cfg, num_blocks, block_size)
    for k, v in zip(kv.k_cache, kv.v_cache):
        k.normal_(generator=gen), v.normal_(generator=gen)
    return kv, tables


def _decode_step(model: Any, batch: int, block_size: int, seed: int):
    """One layer's worth of inputs for a decode step: q, a filled cache, metadata over scattered blocks."""
    rng = random.Random(seed)
    cfg = model.config
    ctx = [rng.randint(16, 128) + min(int(rng.expovariate(1 / 48)), 256) // 2 + 1 for _ in range(batch)]
    kv, tables = scattered_cache(cfg, ctx, block_size, rng)
    q = torch.randn(batch, cfg.num_attention_heads, cfg.head_dim)
    return q, kv, AttentionMetadata.build([1] * batch, ctx, tables, block_size)


def attention_step_ms(model: Any, batch: int = 48, block_size: int = 16, repeats: int = 30,
                      seed: int = 0) -> dict[str, float]:
    """Milliseconds of attention (all layers) in one decode step, per implementation (best of `repeats`)."""
    q, kv, meta = _decode_step(model, batch, block_size, seed)
    scale = model.config.head_dim ** -0.5
    best = {name: float("inf") for name in IMPLS}
    backends = {name: AttentionBackend(name) for name in IMPLS}
    with torch.inference_mode():
        for _ in range(repeats):
            for name, backend in backends.items():
                start = time.perf_counter()
                for k, v in zip(kv.k_cache, kv.v_cache):
                    backend(q, k, v, meta, scale)
                best[name] = min(best[name], time.perf_counter() - start)
    return {name: t * 1e3 for name, t in best.items()}


def linear_step_ms(model: Any, rows: Sequence[int] = LINEAR_ROWS, repeats: int = 30,
                   seed: int = 0) -> dict[str, dict[str, float]]:
    """Milliseconds all the model's linear layers take for one step of each number of `rows`, torch
    ("torch") vs the skinny-GEMM kernel ("skinny"), median of `repeats`; before each timing a buffer
    larger than the caches is written, so the weights come from memory as in a serving step."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    flush = torch.empty(FLUSH_BYTES // 4)
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, dict[str, float]] = {}
    with torch.inference_mode():
        for m_rows in rows:
            xs = [torch.randn(m_rows, m.in_features, generator=gen) for m in linears]
            impls = {"torch": lambda m, x: torch.nn.functional.linear(x, m.weight, m.bias),
                     "skinny": lambda m, x: skinny_gemm.kernel_linear(x, m.weight, m.bias)}
            times: dict[str, list[float]] = {name: [] for name in impls}
            for _ in range(repeats):
                for name, fn in impls.items():
                    flush.add_(1.0)
                    start = time.perf_counter()
                    for m, x in zip(linears, xs):
                        fn(m, x)
                    times[name].append(time.perf_counter() - start)
            out[str(m_rows)] = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    return out


def end_to_end(model: Any, n: int = 256, repeats: int = 2, seed: int = 0, **workload: Any) -> dict[str, Any]:
    """The paged engine on the long-tailed workload with each implementation, alternated: tokens/s of
    every run and whether the two gave the same tokens. `workload` overrides the benchmark's shape
    (`prompt_range`, `output_mean`, `output_cap`)."""
    from inflight.bench.offline.suite import _plan, _setup, run_mode  # the benchmark's own setup and mode 4

    cfg = BenchConfig(n=n, seed=seed, **workload)
    setup = _setup(cfg, model)
    lt, _ = _plan(cfg, model.config.vocab_size, setup.max_len)
    warm = _plan(BenchConfig(n=4, seed=seed + 1, **workload), model.config.vocab_size, setup.max_len)[0]
    speeds: dict[str, list[float]] = {name: [] for name in ENGINE_IMPLS}
    tokens: dict[str, dict[str, list[int]]] = {}
    for name in ENGINE_IMPLS:
        with _implementation(model, name):
            run_mode("paged", setup, warm)
            if model.attention_backend.last_used != ATTENTION_RAN[name]:
                raise RuntimeError(f"the engine ran {model.attention_backend.last_used!r} attention for {name!r}")
    for _ in range(repeats):
        for name in ENGINE_IMPLS:
            with _implementation(model, name):
                rec = run_mode("paged", setup, lt)
            speeds[name].append(lt.useful_tokens / rec.wall)
            tokens.setdefault(name, rec.tokens)
    same = {name: sum(tokens[name][r.id] == tokens["torch"][r.id] for r in lt.requests) for name in ("c", "fused")}
    return {"requests": n, "useful_tokens": lt.useful_tokens, "tokens_per_s": speeds,
            "speedup_per_pair": [c / t for c, t in zip(speeds["c"], speeds["torch"])],
            "fused_speedup_per_pair": [f / t for f, t in zip(speeds["fused"], speeds["torch"])],
            "requests_with_identical_tokens": same["c"], "fused_requests_with_identical_tokens": same["fused"]}


def run(n: int = 256, repeats: int = 2, batch: int = 48) -> dict[str, Any]:
    from inflight.model.loading import load_tiny
    from inflight.threads import configure_threads, machine_load

    threads = configure_threads()
    if cpu_attention.load() is None or fused_ops.load() is None or skinny_gemm.load() is None:
        return {"status": "unavailable",
                "reason": cpu_attention.build_error() or fused_ops.build_error() or skinny_gemm.build_error()}
    model = load_tiny()[0].eval()
    load_before = machine_load()
    step = attention_step_ms(model, batch)
    linear = linear_step_ms(model)
    e2e = end_to_end(model, n, repeats)
    return {"status": "ok", "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m inflight.bench.kernels.cpu " + " ".join(sys.argv[1:]), "threads": threads.threads,
            "kernel_threads": cpu_attention.parallel_backend(), "machine_before": asdict(load_before), "machine_after": asdict(machine_load()),
            "batch": batch, "attention_step_ms": step, "attention_speedup": step["torch"] / step["c"],
            "linear_step_ms": linear, "skinny_max_rows": skinny_gemm.max_rows(), "skinny_lanes": skinny_gemm.lanes(), "end_to_end": e2e}


def report(res: dict[str, Any]) -> str:
    if res["status"] != "ok":
        return f"the C kernel is unavailable here: {res['reason']}"
    s, e = res["attention_step_ms"], res["end_to_end"]
    lines = [f"attention of one decode step, {res['batch']} sequences, all layers: reference {s['torch']:.2f} ms, "
             f"C kernel {s['c']:.2f} ms ({res['attention_speedup']:.1f}x)",
             "linear layers of one step, weights from memory (rows: torch / skinny kernel): " +
             ", ".join(f"{r}: {t['torch']:.2f} / {t['skinny']:.2f} ms" for r, t in res["linear_step_ms"].items()) +
             f" (the engine uses the kernel up to {res['skinny_max_rows']} rows)",
             f"paged engine, {e['requests']} long-tailed requests ({e['useful_tokens']} tokens), alternated:"]
    what = {"torch": "all torch", "c": "C attention", "fused": "C attention + fused ops + skinny GEMMs"}
    for name in ENGINE_IMPLS:
        lines.append(f"  {what[name]:24} " + ", ".join(f"{t:.0f}" for t in e["tokens_per_s"][name]) + " tokens/s")
    lines.append("  C attention / all torch per run: " + ", ".join(f"{x:.2f}x" for x in e["speedup_per_pair"]) +
                 f"; identical tokens on {e['requests_with_identical_tokens']} of {e['requests']} requests")
    lines.append("  + fused ops and skinny GEMMs / all torch per run: " + ", ".join(f"{x:.2f}x" for x in e["fused_speedup_per_pair"]) +
                 f"; identical tokens on {e['fused_requests_with_identical_tokens']} of {e['requests']} requests")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inflight.bench.kernels.cpu", description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--num-requests", type=int, default=256)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("-B", "--batch", type=int, default=48)
    p.add_argument("--out", help="write the results JSON here")
    a = p.parse_args(argv)
    res = run(a.num_requests, a.repeats, a.batch)
    return print_and_save(res, report(res), a.out)

if __name__ == "__main__":
    raise SystemExit(main())
