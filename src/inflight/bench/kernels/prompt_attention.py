"""`python -m inflight.bench.kernels.prompt_attention`: the C kernel on a prefill chunk's attention.

A prefill chunk's tokens are queries over their own prefix: the C kernel takes them as tiles, the
queries of a tile along the vector lanes (`csrc/paged_decode.c`, `attend_tile`). This times that call
alone, for the tiny model's shape (one layer's attention), on chunks a serving step carries — one long
prompt, several short ones — in scattered blocks, best of `repeats`, every implementation alternating
in one process so that the machine's drift hits them alike:

- "c": the kernel as built from this checkout;
- "torch": the plain-torch reference (context: what the C code replaced);
- with `--source PATH` (another checkout's `paged_decode.c`, e.g. from a `git worktree` of an earlier
  commit): that kernel too, built the same way, and whether its outputs have this one's bits.

The rate is the causal attention's arithmetic (q·k and the weights times v: 4 · heads · head size
FLOPs per query-key pair) over the time: what the matrix's floor charges a prompt's attention at the
matmul rate (`bench.protocol.floor`).
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import torch

from inflight.bench.kernels.cpu import scattered_cache
from inflight.bench.offline.report import print_and_save
from inflight.model import c_build, cpu_attention, skinny_gemm
from inflight.model.attention import AttentionBackend
from inflight.model.attention_metadata import AttentionMetadata

__all__ = ["CHUNKS", "chunk_inputs", "measure", "run", "main"]

#: prefill chunks (prompt lengths in one step): one long prompt, a few of the matrix's short ones, many short
CHUNKS = {"1 x 512": [512], "1 x 256": [256], "6 x 150": [150] * 6, "4 x 100": [100] * 4}


def chunk_inputs(cfg: Any, prompts: Sequence[int], block_size: int = 16, seed: int = 0):
    """q, a filled cache and the metadata of one prefill step over `prompts` (each whole, from position
    0), their blocks scattered through a cache twice the size they need."""
    gen = torch.Generator().manual_seed(seed)
    kv, tables = scattered_cache(cfg, prompts, block_size, random.Random(seed), gen)
    meta = AttentionMetadata.build(list(prompts), list(prompts), tables, block_size)
    q = torch.randn(sum(prompts), cfg.num_attention_heads, cfg.head_dim, generator=gen)
    return q, kv, meta


def _kernel_call(lib: c_build.LazyLibrary):
    """The C kernel on a step's per-query block tables and lengths, with `lib` as the loaded library
    (the package's own, or another source's built the same way)."""
    def call(q, k, v, meta, scale):
        saved = cpu_attention._library
        cpu_attention._library = lib
        try:
            tok = meta.token_batch
            return cpu_attention.paged_decode_attention_cpu(q, k, v, tok.block_tables, tok.context_lens, scale)
        finally:
            cpu_attention._library = saved
    return call


def measure(cfg: Any, prompts: Sequence[int], impls: dict[str, Any], repeats: int = 30) -> dict[str, Any]:
    """Best milliseconds per implementation (`impls`: name -> fn(q, k, v, meta, scale)) for one layer's
    attention over the chunk `prompts`, and whether each gives the first's output bit for bit."""
    q, kv, meta = chunk_inputs(cfg, prompts)
    k, v = kv.k_cache[0], kv.v_cache[0]
    scale = cfg.head_dim ** -0.5
    best = {name: float("inf") for name in impls}
    outs: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        for _ in range(repeats):
            for name, fn in impls.items():
                start = time.perf_counter()
                out = fn(q, k, v, meta, scale)
                best[name] = min(best[name], time.perf_counter() - start)
                outs.setdefault(name, out)
    first = outs[next(iter(impls))]
    flops = 4 * cfg.num_attention_heads * cfg.head_dim * sum(p * (p + 1) // 2 for p in prompts)
    return {"prompts": list(prompts), "flops": flops,
            "ms": {name: t * 1e3 for name, t in best.items()},
            "gflop_per_s": {name: flops / t / 1e9 for name, t in best.items()},
            "same_bits_as_c": {name: bool(torch.equal(o.view(torch.int32), first.view(torch.int32)))
                               for name, o in outs.items()}}


def run(source: str | None = None, repeats: int = 30) -> dict[str, Any]:
    from inflight.model.loading import load_tiny
    from inflight.threads import configure_threads, machine_load

    threads = configure_threads()
    if cpu_attention.load() is None:
        return {"status": "unavailable", "reason": cpu_attention.build_error()}
    impls = {"c": _kernel_call(cpu_attention._library)}
    if source is not None:
        if not Path(source).is_file():
            return {"status": "unavailable", "reason": f"{source}: no such file"}
        other = c_build.LazyLibrary(Path(source), cpu_attention.FLAGS, cpu_attention.SYMBOLS, cpu_attention._declare)
        if other.load() is None:
            return {"status": "unavailable", "reason": f"{source}: {other.build_error()}"}
        impls["source"] = _kernel_call(other)
    reference = AttentionBackend("torch")
    impls["torch"] = lambda q, k, v, meta, scale: reference(q, k, v, meta, scale)
    cfg = load_tiny()[0].config
    before = machine_load()
    chunks = {name: measure(cfg, prompts, impls, repeats) for name, prompts in CHUNKS.items()}
    return {"status": "ok", "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m inflight.bench.kernels.prompt_attention " + " ".join(sys.argv[1:]),
            "threads": threads.threads, "kernel_threads": cpu_attention.parallel_backend(),
            "tile_lanes": skinny_gemm.lanes(), "source": source, "repeats": repeats,
            "model": {"heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim},
            "machine_before": asdict(before), "machine_after": asdict(machine_load()), "chunks": chunks}


def report(res: dict[str, Any]) -> str:
    if res["status"] != "ok":
        return f"the C kernel is unavailable here: {res['reason']}"
    names = {"c": "C kernel (this checkout)", "source": f"C kernel ({res['source']})", "torch": "torch reference"}
    lines = [f"one layer's attention over a prefill chunk, tiny model ({res['model']['heads']} heads, "
             f"{res['model']['kv_heads']} kv heads, D {res['model']['head_dim']}), {res['threads']} threads, "
             f"tiles of {res['tile_lanes']} lanes; best of {res['repeats']}, alternating:"]
    for chunk, r in res["chunks"].items():
        lines.append(f"  {chunk:8} " + "; ".join(
            f"{names[n]} {r['ms'][n]:.3f} ms ({r['gflop_per_s'][n]:.0f} GFLOP/s)"
            + ("" if n == "c" else (", same bits" if r["same_bits_as_c"][n] else ", other bits"))
            for n in r["ms"]))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inflight.bench.kernels.prompt_attention",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--source", help="another checkout's paged_decode.c, timed beside this one")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--out", help="write the results JSON here")
    a = p.parse_args(argv)
    res = run(a.source, a.repeats)
    return print_and_save(res, report(res), a.out)


if __name__ == "__main__":
    raise SystemExit(main())
