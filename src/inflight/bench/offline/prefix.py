"""`python -m inflight.bench.offline.prefix`: what prefix caching buys, measured on our engine.

Two workloads with the same lengths, each run with prefix caching off and on:

* `shared_system_prompt` — every request is one long system prompt + a short user turn of its own,
* `share_nothing`        — every prompt is unrelated (the cache can only cost, never help).

Requests arrive one every `arrival_every` engine steps (so later requests find earlier ones' blocks
cached, as on a live server). Reported per run: prefill tokens computed, TTFT (mean/p50/p99),
output throughput, the cache hit rate; and a check that greedy outputs are identical on and off.

    python -m inflight.bench.offline.prefix              # full size, prints a table, saves JSON
    python -m inflight.bench.offline.prefix --quick      # CI / notebook size (a few seconds on a CPU)
"""
from __future__ import annotations

import argparse
import json
import time
from collections import deque
from pathlib import Path
from typing import Any, Sequence

import torch

from inflight.bench.offline.models import describe_model, load_model
from inflight.bench.offline.prompts import Workload, with_token_ids
from inflight.sim import workloads
from inflight.stats import percentile

__all__ = ["shared_prefix_workload", "share_nothing_workload", "run_workload", "collect", "report", "main"]


def _workload(name: str, n: int, prompt_len: int, shared_len: int, output_len: int, vocab_size: int, seed: int,
              arrival_every: int) -> Workload:
    """`n` prompts of `prompt_len` tokens (the first `shared_len` common to all), arriving one every
    `arrival_every` engine steps; lengths from `sim.workloads`, token ids from `bench.offline.prompts`."""
    lengths = workloads.from_lengths([output_len] * n, arrivals=[i * arrival_every for i in range(n)],
                                     prompt_len=prompt_len)
    return with_token_ids(name, lengths, vocab_size, f"{name}-{seed}", shared_prefix=shared_len)


def shared_prefix_workload(n: int = 32, system_len: int = 192, user_len: int = 16, output_len: int = 16,
                           vocab_size: int = 257, seed: int = 0, arrival_every: int = 1) -> Workload:
    """`n` requests = one shared `system_len`-token system prompt + their own `user_len` tokens."""
    return _workload("shared_system_prompt", n, system_len + user_len, system_len, output_len, vocab_size, seed,
                     arrival_every)


def share_nothing_workload(n: int = 32, system_len: int = 192, user_len: int = 16, output_len: int = 16,
                           vocab_size: int = 257, seed: int = 0, arrival_every: int = 1) -> Workload:
    """The same lengths as `shared_prefix_workload`, but every prompt is unrelated to the others."""
    return _workload("share_nothing", n, system_len + user_len, 0, output_len, vocab_size, seed, arrival_every)


def run_workload(model: Any, workload: Workload, *, enable_prefix_caching: bool, block_size: int = 16,
                 num_blocks: int | None = None, max_batch_size: int = 8, max_batched_tokens: int = 512,
                 tokenizer: Any = None) -> dict[str, Any]:
    """Serve `workload` on a fresh `LLMEngine`, feeding each request at its arrival step; measure it."""
    from inflight.engine.block_manager import blocks_needed
    from inflight.engine.llm_engine import LLMEngine
    from inflight.engine.sampling import SamplingParams

    if num_blocks is None:  # room for a full batch of private prompts: caching must win by compute, not by memory
        num_blocks = max_batch_size * blocks_needed(workload.max_len, block_size) + 1
    engine = LLMEngine(model, block_size=block_size, num_blocks=num_blocks, max_batch_size=max_batch_size,
                       max_batched_tokens=max_batched_tokens, enable_prefix_caching=enable_prefix_caching,
                       tokenizer=tokenizer)
    pending = deque(sorted(workload.requests, key=lambda r: r.arrival))
    step = 0
    final = {}  # request id -> its final output (the engine forgets a request once it has returned that)
    start = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        while pending and pending[0].arrival <= step:
            r = pending.popleft()
            engine.add_request(r.prompt, SamplingParams(max_tokens=r.output_len, ignore_eos=True), request_id=r.id)
        final.update((o.request_id, o) for o in engine.step() if o.finished)
        step += 1
    wall = time.perf_counter() - start
    outs = [final[str(r.id)] for r in workload.requests]
    return _figures(workload, outs, engine.summary(), wall) | {
        "prefix_caching": enable_prefix_caching, "num_blocks": num_blocks, "block_size": block_size}


def _figures(workload: Workload, outs: list[Any], s: dict[str, Any], wall: float) -> dict[str, Any]:
    """Prefill work, TTFT, throughput and the cache's hit rate of one run, from the engine's summary."""
    ttfts = [o.ttft for o in outs]
    gen = sum(len(o.token_ids) for o in outs)
    return {
        "workload": workload.name, "requests": len(outs),
        "prompt_tokens": sum(len(r.prompt) for r in workload.requests), "prefill_tokens": s["prefill_tokens"],
        "output_tokens": gen, "steps": s["steps"], "wall_s": wall, "output_tokens_per_s": gen / wall,
        "ttft_mean_s": sum(ttfts) / len(ttfts), "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99),
        "hit_rate": s["prefix_cache_hit_rate"], "hit_tokens": s["prefix_cache_hit_tokens"],
        "evictions": s["prefix_cache_evictions"], "preemptions": s["preemptions"], "ttfts_s": ttfts,
        # the engine's own work outside the model (scheduling incl. cache lookups, bookkeeping incl. caching
        # full blocks, sampling), per step: what prefix caching adds when nothing is shared
        "overhead_ms_per_step": 1e3 * (s["schedule_time"] + s["sample_time"]) / max(s["steps"], 1),
        "token_ids": [o.token_ids for o in outs],
    }


def _model(model: Any, device: str | None, seed: int) -> tuple[Any, str]:
    if model is not None:
        return model, describe_model(model)
    bm = load_model(None, device or "cpu", seed=seed)
    return bm.model, bm.source


def collect(model: Any = None, quick: bool = False, seed: int = 0, device: str | None = None,
            **sizes: Any) -> dict[str, Any]:
    """Both workloads, caching off and on. `sizes` override n / system_len / user_len / output_len /
    arrival_every / block_size / max_batch_size. Returns plain data (JSON-able)."""
    model, desc = _model(model, device, seed)
    n = sizes.pop("n", 16 if quick else 48)
    system_len = sizes.pop("system_len", 128 if quick else 256)
    user_len = sizes.pop("user_len", 16 if quick else 32)
    output_len = sizes.pop("output_len", 8 if quick else 32)
    every = sizes.pop("arrival_every", 2)
    engine_kw = {k: sizes.pop(k) for k in ("block_size", "max_batch_size", "max_batched_tokens", "num_blocks")
                 if k in sizes}
    if sizes:
        raise TypeError(f"unknown size arguments: {sorted(sizes)}")
    limit = getattr(model.config, "max_position_embeddings", 10**9)
    if system_len + user_len + output_len > limit:
        raise ValueError(f"prompt + output ({system_len + user_len + output_len} tokens) exceed the model's context of {limit}")
    vocab = model.config.vocab_size
    pair = [shared_prefix_workload(n, system_len, user_len, output_len, vocab, seed, every),
            share_nothing_workload(n, system_len, user_len, output_len, vocab, seed, every)]
    results: dict[str, Any] = {"model": desc, "device": str(getattr(model, "device", "cpu")),
                               "sizes": {"n": n, "system_len": system_len, "user_len": user_len,
                                         "output_len": output_len, "arrival_every": every, **engine_kw},
                               "workloads": {}}
    with torch.inference_mode():
        for w in pair:
            off = run_workload(model, w, enable_prefix_caching=False, **engine_kw)
            on = run_workload(model, w, enable_prefix_caching=True, **engine_kw)
            same = off.pop("token_ids") == on.pop("token_ids")
            results["workloads"][w.name] = {
                "off": off, "on": on, "outputs_identical": same,
                "prefill_saved": 1 - on["prefill_tokens"] / off["prefill_tokens"],
                "ttft_speedup": off["ttft_mean_s"] / on["ttft_mean_s"],
                "throughput_speedup": on["output_tokens_per_s"] / off["output_tokens_per_s"]}
    return results


def report(res: dict[str, Any]) -> str:
    """A plain-text table of `collect`'s results."""
    lines = [f"prefix caching on {res['model']} ({res['device']}), sizes {res['sizes']}",
             f"{'workload':22} {'caching':8} {'prefill tok':>11} {'hit rate':>8} {'TTFT mean':>10} {'TTFT p99':>9} "
             f"{'out tok/s':>10}"]
    for name, w in res["workloads"].items():
        for key in ("off", "on"):
            r = w[key]
            lines.append(f"{name:22} {key:8} {r['prefill_tokens']:>11} {r['hit_rate']:>8.1%} "
                         f"{r['ttft_mean_s'] * 1e3:>8.1f}ms {r['ttft_p99_s'] * 1e3:>7.1f}ms {r['output_tokens_per_s']:>10.1f}")
        lines.append(f"{'':22} prefill saved {w['prefill_saved']:.1%}, TTFT x{w['ttft_speedup']:.2f}, "
                     f"throughput x{w['throughput_speedup']:.2f}, outputs identical: {w['outputs_identical']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inflight.bench.offline.prefix", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (CI, notebooks)")
    p.add_argument("--device", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-n", "--num-requests", type=int, default=None)
    p.add_argument("--system-len", type=int, default=None)
    p.add_argument("--output", default="bench_prefix.json", help="where to save the JSON results")
    a = p.parse_args(argv)
    sizes = {k: v for k, v in (("n", a.num_requests), ("system_len", a.system_len)) if v is not None}
    torch.manual_seed(a.seed)
    res = collect(quick=a.quick, seed=a.seed, device=a.device, **sizes)
    print(report(res))
    Path(a.output).write_text(json.dumps(res, indent=1, default=str))
    print(f"saved {a.output}")
    return 0 if all(w["outputs_identical"] for w in res["workloads"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
