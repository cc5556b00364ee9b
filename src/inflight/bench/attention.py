"""`python -m inflight.bench.attention`: the paged-KV chapter's figures.

1. KV memory utilization (any machine): contiguous max-length reservation vs paged blocks of
   8/16/32 tokens on two workloads (short long-tailed chat, ShareGPT-like), with the paging ceiling.
2. On CUDA only: the Triton paged decode kernel vs contiguous `scaled_dot_product_attention`
   (and the plain-torch paged reference) at batch 32–128 and contexts 512–4096, with the memory
   bandwidth each achieves against the device's peak. On a CPU this section says it is skipped.

Prints a table and saves `results/attention_<device>.json`.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["kv_utilization_figures", "kernel_benchmark", "peak_bandwidth_gbs", "device_name", "collect", "main"]

# Peak DRAM bandwidth (GB/s) of common GPUs, used when the driver does not report clock and bus width.
_PEAK_GBS = [("H200", 4800), ("H100 PCIe", 2000), ("H100", 3350), ("A100-SXM4-80GB", 2039), ("A100 80GB PCIe", 1935),
             ("A100", 1555), ("L40S", 864), ("L4", 300), ("A10G", 600), ("A10", 600), ("T4", 320),
             ("V100", 900), ("RTX 4090", 1008), ("RTX 3090", 936)]


def device_name(device: str | None = None) -> str:
    """A file-name-friendly device name: the GPU's name, or "cpu"."""
    import torch

    if (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda"):
        name = torch.cuda.get_device_name(0)
        return re.sub(r"[^A-Za-z0-9]+", "-", name.replace("NVIDIA", "")).strip("-").lower() or "cuda"
    return "cpu"


def peak_bandwidth_gbs(device_index: int = 0) -> float | None:
    """The GPU's peak memory bandwidth in GB/s (from clock × bus width, else a table), or None."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device_index)
    clock_khz = getattr(props, "memory_clock_rate", 0) or 0
    bus_bits = getattr(props, "memory_bus_width", 0) or 0
    if clock_khz and bus_bits:
        return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9  # double data rate
    for key, gbs in _PEAK_GBS:
        if key.lower() in props.name.lower():
            return float(gbs)
    return None


def kv_utilization_figures(n_short: int = 2000, n_sharegpt: int = 1000, seed: int = 0,
                           block_sizes: Sequence[int] = (8, 16, 32)) -> dict[str, Any]:
    """Utilization, ceiling and mean running requests of each layout on both workloads."""
    from inflight.sim import kv_sim as km
    from inflight.sim import workloads

    out: dict[str, Any] = {}
    for name, requests, max_len in [
        ("short_chat", workloads.short_chat(n_short, seed), None),
        ("sharegpt_like", workloads.clip_to_context(workloads.sharegpt_like(n_sharegpt, seed), 2048), 2048),
    ]:
        runs = km.utilization_table(requests, block_sizes, max_len=max_len)
        out[name] = {"n_requests": len(requests), "runs": {k: r.summary() for k, r in runs.items()},
                     "rule_of_thumb": {f"paged-{bs}": round(km.tail_waste_estimate(requests, bs), 4) for bs in block_sizes}}
    return out


def _timer(device: str, repeats: int) -> Callable[[Callable[[], Any]], float]:
    """Milliseconds per call: triton's do_bench on CUDA (cache flushed, CUDA events); wall clock elsewhere."""
    if device.startswith("cuda"):
        from triton.testing import do_bench

        return lambda fn: float(do_bench(fn, warmup=25, rep=100))

    def wall(fn):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[len(times) // 2]

    return wall


def kernel_benchmark(batches: Sequence[int] = (32, 64, 128), contexts: Sequence[int] = (512, 1024, 2048, 4096), *,
                     num_heads: int = 32, kv_heads: int = 8, head_dim: int = 128, block_size: int = 16,
                     dtype: str = "float16", device: str = "cuda", repeats: int = 3, seed: int = 0,
                     with_reference: bool = True) -> list[dict[str, Any]]:
    """Time the Triton paged decode kernel against contiguous SDPA (and the torch paged reference).

    Shapes default to a Llama-3-8B layer (32 query heads, 8 kv heads, head_dim 128, fp16). Each
    sequence's blocks are scattered randomly through the pool, as they are in a running server.
    """
    import torch
    import torch.nn.functional as F

    from inflight.model.triton_attention import paged_decode_attention

    dt = getattr(torch, dtype)
    timer = _timer(device, repeats)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rows = []
    for B in batches:
        for ctx in contexts:
            blocks_per_seq = math.ceil(ctx / block_size)
            num_blocks = B * blocks_per_seq
            k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(device, dt)
            v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(device, dt)
            q = torch.randn(B, num_heads, head_dim, generator=gen).to(device, dt)
            block_tables = torch.randperm(num_blocks, generator=gen).view(B, blocks_per_seq).to(device, torch.int32)
            context_lens = torch.full((B,), ctx, dtype=torch.int32, device=device)
            scale = head_dim ** -0.5
            # the contiguous baseline holds the same keys/values in [B, kv_heads, ctx, D]
            pos = torch.arange(ctx, device=device)
            slots = (block_tables[:, pos // block_size].long() * block_size + pos % block_size)  # [B, ctx]
            k = k_cache.view(-1, kv_heads, head_dim)[slots].permute(0, 2, 1, 3).contiguous()
            v = v_cache.view(-1, kv_heads, head_dim)[slots].permute(0, 2, 1, 3).contiguous()
            q4 = q.unsqueeze(2)  # [B, H, 1, D]

            def sdpa():
                try:  # torch >= 2.5 reads each kv head once for its whole query group
                    return F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True)
                except TypeError:  # older torch: repeat the kv heads (more traffic; noted in the row)
                    g = num_heads // kv_heads
                    return F.scaled_dot_product_attention(q4, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), scale=scale)

            def triton_kernel():
                return paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)

            out_t = triton_kernel()
            out_s = sdpa().squeeze(2)
            kv_bytes = 2 * B * ctx * kv_heads * head_dim * k_cache.element_size()
            row = {"batch": B, "context": ctx, "block_size": block_size, "dtype": dtype,
                   "kv_bytes": kv_bytes, "max_abs_err_vs_sdpa": float((out_t.float() - out_s.float()).abs().max())}
            row["triton_ms"] = timer(triton_kernel)
            row["sdpa_ms"] = timer(sdpa)
            if with_reference:
                try:
                    from inflight.model.attention import paged_attention
                    from inflight.model.attention_metadata import AttentionMetadata

                    meta = AttentionMetadata.build([1] * B, [ctx] * B, block_tables.tolist(), block_size, device)
                    row["torch_paged_ms"] = timer(lambda: paged_attention(q, k_cache, v_cache, meta, scale))
                except Exception as exc:  # missing module or out of memory: report, don't fail the run
                    row["torch_paged_ms"] = None
                    row["torch_paged_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
            for name in ("triton", "sdpa"):
                row[f"{name}_gbs"] = kv_bytes / (row[f"{name}_ms"] * 1e-3) / 1e9
            row["triton_overhead"] = row["triton_ms"] / row["sdpa_ms"] - 1
            rows.append(row)
            del k_cache, v_cache, k, v
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    return rows


def collect(quick: bool = False, device: str | None = None) -> dict[str, Any]:
    """Every figure of this benchmark as one JSON-able dict."""
    import torch

    from inflight.device import describe_device

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    res: dict[str, Any] = {"device": describe_device(), "device_name": device_name(device), "torch": torch.__version__,
                           "kv_utilization": kv_utilization_figures(*((500, 300) if quick else (2000, 1000)))}
    if device.startswith("cuda"):
        from inflight.model.triton_attention import HAS_TRITON

        if HAS_TRITON:
            res["peak_gbs"] = peak_bandwidth_gbs()
            res["kernel"] = kernel_benchmark(batches=(32, 128) if quick else (32, 64, 128),
                                             contexts=(512, 4096) if quick else (512, 1024, 2048, 4096))
        else:
            res["kernel_skipped"] = "triton is not installed"
    else:
        res["kernel_skipped"] = "no GPU: the Triton-vs-SDPA kernel section needs CUDA"
    return res


def report(res: dict[str, Any]) -> str:
    """The figures as a plain-text table."""
    lines = [f"== KV memory utilization ({res['device']}) =="]
    for wl, data in res["kv_utilization"].items():
        lines.append(f"{wl} ({data['n_requests']} requests)")
        lines.append(f"  {'layout':<12}{'utilization':>12}{'ceiling':>9}{'rule of thumb':>15}{'running':>9}{'steps':>7}")
        for name, r in data["runs"].items():
            thumb = data["rule_of_thumb"].get(name)
            lines.append(f"  {name:<12}{r['utilization']:>12.1%}{r['ceiling']:>9.1%}"
                         f"{(f'{thumb:.1%}' if thumb else '-'):>15}{r['mean_running']:>9.1f}{r['steps']:>7}")
    lines.append("== Paged decode attention: Triton kernel vs contiguous SDPA ==")
    if "kernel" not in res:
        lines.append(f"  skipped: {res.get('kernel_skipped')}")
        return "\n".join(lines)
    peak = res.get("peak_gbs")
    lines.append(f"  peak bandwidth: {peak:.0f} GB/s" if peak else "  peak bandwidth: unknown")
    lines.append(f"  {'batch':>5}{'ctx':>6}{'triton ms':>11}{'sdpa ms':>9}{'torch-paged ms':>16}"
                 f"{'triton GB/s':>13}{'sdpa GB/s':>11}{'overhead':>10}")
    for r in res["kernel"]:
        ref = r.get("torch_paged_ms")
        frac = f" ({r['triton_gbs'] / peak:.0%} of peak)" if peak else ""
        lines.append(f"  {r['batch']:>5}{r['context']:>6}{r['triton_ms']:>11.3f}{r['sdpa_ms']:>9.3f}"
                     f"{(f'{ref:.3f}' if ref else '-'):>16}{r['triton_gbs']:>13.0f}{r['sdpa_gbs']:>11.0f}"
                     f"{r['triton_overhead']:>+10.0%}{frac}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests and kernel sizes")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default results/attention_<device>.json)")
    args = parser.parse_args(argv)
    res = collect(quick=args.quick)
    print(report(res))
    out = args.out or Path("results") / f"attention_{res['device_name']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
