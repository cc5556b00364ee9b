"""`python -m inflight.bench.offline.soak`: does a long-running engine keep flat memory?

A server runs for days. This streams many requests (100,000 by default) through
`LLMEngine.add_request` / `step` — a steady stream with bursts, greedy and seeded sampled requests,
stop tokens, a few aborts, a pool small enough for preemptions, optionally swap preemption and
prefix caching — and prints, at checkpoints, the process's
resident memory and the size of every container the engine keeps. Flat means: the figures at 100k
requests are those at 10k. It is a program, not a test: `tests/test_robustness_memory.py` checks
the same property quickly on a few thousand requests.

`--model random` (the default) is a tiny random Llama (one layer, width 32), so the run is about
the engine's bookkeeping and takes minutes on a CPU; `--model tiny` serves the shipped tiny model.
"""
from __future__ import annotations

import argparse
import gc
import math
import random
import sys
import time
from typing import Any

import torch

from inflight.engine.llm_engine import LLMEngine
from inflight.engine.sampling import SamplingParams

__all__ = ["soak", "memory_mib", "engine_sizes", "main"]

CHECKPOINTS = (1_000, 10_000, 50_000, 100_000)


def memory_mib() -> tuple[float | None, float | None]:
    """(current, peak) resident memory of this process in MiB; None where the OS doesn't say."""
    current = peak = None
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    current = int(line.split()[1]) / 1024
    except OSError:
        pass
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux
    except (ImportError, OSError):
        pass
    return current, peak


def engine_sizes(engine: LLMEngine) -> dict[str, int]:
    """The length of every container a long-running engine keeps."""
    sched = engine.scheduler
    sizes = {"held requests": len(engine.requests), "stats window": len(engine.stats),
             "undelivered": len(engine._undelivered), "waiting": len(sched.waiting), "running": len(sched.running),
             "swapped": len(sched.swapped)}
    if engine.enable_prefix_caching:
        sizes["cached blocks"] = engine.allocator.num_cached
    return sizes


def _model(kind: str, seed: int) -> tuple[Any, int]:
    if kind == "tiny":
        from inflight.model.loading import load_tiny

        model, _ = load_tiny()
        return model.eval(), model.config.vocab_size
    from inflight.model.llama import LlamaConfig, LlamaModel

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    return LlamaModel(cfg).eval(), cfg.vocab_size


def _request(rng: random.Random, vocab: int, shared: list[int], i: int) -> tuple[list[int], SamplingParams]:
    """One request of the stream: 4-48 prompt tokens (a third start with a shared preamble), 1-24 new
    tokens, greedy or seeded sampling, sometimes a stop token."""
    n = rng.randint(4, 48)
    prompt = (shared[:n // 2] if rng.random() < 1 / 3 else []) + [rng.randrange(1, vocab) for _ in range(n)]
    sampled = rng.random() < 0.5
    params = SamplingParams(max_tokens=rng.randint(1, 24), temperature=0.8 if sampled else 0.0, top_p=0.95,
                            seed=i if sampled else None, ignore_eos=True,
                            stop_token_ids=[rng.randrange(1, vocab)] if rng.random() < 0.2 else [])
    return prompt[:n], params


def soak(n: int = 100_000, model: str = "random", seed: int = 0, max_batch_size: int = 32,
         enable_prefix_caching: bool = False, preemption: str = "recompute",
         checkpoints: tuple[int, ...] = CHECKPOINTS, out: Any = sys.stdout) -> list[dict]:
    """Stream `n` requests through one engine; one row of figures per checkpoint (also printed)."""
    mdl, vocab = _model(model, seed)
    # 2 blocks of 16 tokens per slot: a full batch of long requests outgrows the pool (preemptions)
    engine = LLMEngine(mdl, block_size=16, num_blocks=max_batch_size * 2, max_batch_size=max_batch_size,
                       enable_prefix_caching=enable_prefix_caching, preemption=preemption, seed=seed)
    rng = random.Random(seed)
    shared = [rng.randrange(1, vocab) for _ in range(32)]
    marks = sorted(c for c in checkpoints if c <= n) or [n]
    rows, submitted, finished, aborted, step = [], 0, 0, 0, 0
    start = time.perf_counter()
    _header(out)
    while submitted < n or engine.has_unfinished_requests():
        # a steady stream with bursts: keep between 0.5x and 3x a batch of requests in the engine
        target = max_batch_size * (1.75 + 1.25 * math.sin(step / 500))
        while submitted < n and len(engine.requests) < target:
            engine.add_request(*_request(rng, vocab, shared, submitted))
            submitted += 1
            if marks and submitted == marks[0]:
                rows.append(_checkpoint(engine, submitted, finished, aborted, step, start, out))
                marks.pop(0)
        if rng.random() < 0.01 and engine.requests:  # a client hangs up
            engine.abort_request(rng.choice(list(engine.requests)))
            aborted += 1
        finished += sum(o.finished for o in engine.step())
        step += 1
    rows.append(_checkpoint(engine, submitted, finished, aborted, step, start, out, label="drained"))
    s = engine.summary()
    print(f"summary: {s['steps']} steps, {s['finished_requests']} finished, {s['preemptions']} preemptions, "
          f"{s['blocks_swapped']} blocks swapped, prefix-cache hit rate {s['prefix_cache_hit_rate']:.2f}; "
          f"KV blocks free at the end: {engine.allocator.num_free}/{engine.num_blocks}", file=out)
    return rows


def _header(out: Any) -> None:
    print(f"{'requests':>9} {'finished':>9} {'aborted':>8} {'steps':>8} {'RSS MiB':>8} {'peak MiB':>9} "
          f"{'held':>5} {'stats':>6} {'undeliv.':>8} {'queued':>7} {'py objects':>11} {'wall s':>7}", file=out)


def _checkpoint(engine: LLMEngine, submitted: int, finished: int, aborted: int, step: int, start: float, out: Any,
                label: str | None = None) -> dict:
    gc.collect()
    rss, peak = memory_mib()
    sizes = engine_sizes(engine)
    row = {"requests": submitted, "finished": finished, "aborted": aborted, "steps": step, "rss_mib": rss,
           "peak_rss_mib": peak, "python_objects": len(gc.get_objects()), "wall_s": time.perf_counter() - start,
           **sizes}
    queued = sizes["waiting"] + sizes["running"] + sizes["swapped"]
    fmt = lambda v: f"{v:.1f}" if v is not None else "n/a"  # noqa: E731
    print(f"{label or submitted:>9} {finished:>9} {aborted:>8} {step:>8} {fmt(rss):>8} {fmt(peak):>9} "
          f"{sizes['held requests']:>5} {sizes['stats window']:>6} {sizes['undelivered']:>8} {queued:>7} "
          f"{row['python_objects']:>11} {row['wall_s']:>7.1f}", file=out, flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inflight.bench.offline.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=100_000, help="how many requests to stream (default 100000)")
    p.add_argument("--model", choices=("random", "tiny"), default="random",
                   help="random: a one-layer random Llama (bookkeeping-bound, minutes); tiny: the shipped tiny model")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--prefix-caching", action="store_true", help="serve with prefix caching on")
    p.add_argument("--preemption", choices=("recompute", "swap"), default="recompute")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"soak: {args.requests} requests, model={args.model}, max_batch_size={args.max_batch_size}, "
          f"preemption={args.preemption}, prefix caching {'on' if args.prefix_caching else 'off'}, "
          f"torch {torch.__version__}, python {sys.version.split()[0]}")
    soak(args.requests, args.model, args.seed, args.max_batch_size, args.prefix_caching, args.preemption)
    return 0


if __name__ == "__main__":
    sys.exit(main())
