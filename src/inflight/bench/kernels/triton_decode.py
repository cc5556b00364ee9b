"""The paged decode kernel against contiguous SDPA: the kernel half of `python -m inflight.bench.kernels.attention`.

For each (batch, context) it times, on the same keys and values: the Triton kernel as the engine
calls it (split into partitions when `plan_decode` chooses to), the same kernel forced to one
partition (the single-pass kernel it replaced), PyTorch's `scaled_dot_product_attention` on a
contiguous copy (what a server without paging runs) and the plain-torch paged reference. It reports
each one's time, the ratio to SDPA, the bandwidth achieved against the GPU's peak and a measured
copy, and which of issue 14's targets each size meets. `--sweep` adds every partition size,
`--tune` the tile shapes (block_n × num_warps × num_stages), so one GPU run shows whether the
heuristic and the defaults are the right ones.

On a CPU the kernel only runs under `TRITON_INTERPRET=1` (the tests use that to exercise this code
path at tiny sizes); timings there are wall-clock and mean nothing.
"""
from __future__ import annotations

import math
import os
import time
from typing import Any, Callable, Sequence

__all__ = ["kernel_benchmark", "tile_sweep", "peak_bandwidth_gbs", "copy_bandwidth_gbs", "kernel_summary",
           "kernel_report_lines", "TARGET_RATIO", "TARGET_PEAK_FRACTION", "LARGE_KV_BYTES"]

# Issue 14, target 3: at batch 32-128, contexts 512-4096 (Llama-3-8B layer, fp16, blocks of 16)
TARGET_RATIO = 1.1  # kernel time / contiguous SDPA time, at every size
TARGET_PEAK_FRACTION = 0.70  # of peak HBM bandwidth, at the large sizes:
LARGE_KV_BYTES = 2**29  # 512 MiB of K/V read per call (e.g. batch 32 × 4096, 128 × 1024)

# Peak DRAM bandwidth (GB/s) of common GPUs, used when the driver does not report clock and bus width.
_PEAK_GBS = [("H200", 4800), ("H100 PCIe", 2000), ("H100", 3350), ("A100-SXM4-80GB", 2039), ("A100 80GB PCIe", 1935),
             ("A100", 1555), ("L40S", 864), ("L4", 300), ("A10G", 600), ("A10", 600), ("T4", 320),
             ("V100", 900), ("RTX 4090", 1008), ("RTX 3090", 936)]


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


def _timer(device: str, repeats: int) -> Callable[[Callable[[], Any]], float]:
    """Milliseconds per call: triton's do_bench on CUDA (L2 flushed, CUDA events, median); wall clock elsewhere."""
    if device.startswith("cuda"):
        from triton.testing import do_bench

        return lambda fn: float(do_bench(fn, warmup=25, rep=100, return_mode="median"))

    def wall(fn):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[len(times) // 2]

    return wall


def copy_bandwidth_gbs(device: str = "cuda", nbytes: int = 2**30) -> float | None:
    """A device-to-device copy's bandwidth (bytes read + written per second): the practical ceiling."""
    import torch

    if not device.startswith("cuda"):
        return None
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = _timer(device, 1)(lambda: dst.copy_(src))
    del src, dst
    return 2 * nbytes / (ms * 1e-3) / 1e9


def _check_kernel_device(device: str) -> None:
    from inflight.model.triton_attention import HAS_TRITON

    if not HAS_TRITON:
        raise RuntimeError("the paged decode kernel needs triton, which is not installed here")
    if not device.startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"the paged decode kernel needs CUDA (device {device!r} given); on a CPU it runs "
                           "only under TRITON_INTERPRET=1, as the tests do, and its timings there mean nothing")


def _decode_inputs(B: int, ctx: int, num_heads: int, kv_heads: int, head_dim: int, block_size: int,
                   dtype: Any, device: str, seed: int) -> dict[str, Any]:
    """One decode step's tensors: a paged cache with scattered blocks, and the same K/V contiguous."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    blocks_per_seq = math.ceil(ctx / block_size)
    num_blocks = B * blocks_per_seq
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    v_cache = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    q = torch.randn(B, num_heads, head_dim, generator=gen, device=device, dtype=dtype)
    # each sequence's blocks scattered through the pool, as they are in a running server
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
    block_tables = perm.view(B, blocks_per_seq).to(device, torch.int32)
    context_lens = torch.full((B,), ctx, dtype=torch.int32, device=device)
    pos = torch.arange(ctx, device=device)
    slots = block_tables[:, pos // block_size].long() * block_size + pos % block_size  # [B, ctx]
    # the contiguous baseline holds the same keys/values in [B, kv_heads, ctx, D]
    k = k_cache.view(-1, kv_heads, head_dim)[slots].permute(0, 2, 1, 3).contiguous()
    v = v_cache.view(-1, kv_heads, head_dim)[slots].permute(0, 2, 1, 3).contiguous()
    return {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_tables": block_tables,
            "context_lens": context_lens, "k": k, "v": v}


def _sdpa(t: dict[str, Any], scale: float) -> Callable[[], Any]:
    import torch.nn.functional as F

    q4, k, v = t["q"].unsqueeze(2), t["k"], t["v"]  # q [B, H, 1, D]
    group = q4.shape[1] // k.shape[1]

    def sdpa():
        try:  # torch >= 2.5 reads each kv head once for its whole query group
            return F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True)
        except TypeError:  # older torch: repeat the kv heads (more traffic)
            return F.scaled_dot_product_attention(q4, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                                  scale=scale)

    return sdpa


def _kernel(t: dict[str, Any], scale: float, **options: Any) -> Callable[[], Any]:
    from inflight.model.triton_attention import paged_decode_attention

    args = (t["q"], t["k_cache"], t["v_cache"], t["block_tables"], t["context_lens"], scale)
    return lambda: paged_decode_attention(*args, **options)


def _torch_paged_ms(t: dict[str, Any], scale: float, timer: Callable, device: str) -> dict[str, Any]:
    """The plain-torch paged reference (gather, then attention); an error is reported, not raised."""
    try:
        from inflight.model.attention import paged_attention
        from inflight.model.attention_metadata import AttentionMetadata

        B, block_size = t["q"].shape[0], t["k_cache"].shape[1]
        ctx = int(t["k"].shape[2])
        meta = AttentionMetadata.build([1] * B, [ctx] * B, t["block_tables"].tolist(), block_size, device)
        return {"torch_paged_ms": timer(lambda: paged_attention(t["q"], t["k_cache"], t["v_cache"], meta, scale))}
    except Exception as exc:  # missing module or out of memory: report, don't fail the run
        return {"torch_paged_ms": None, "torch_paged_error": f"{type(exc).__name__}: {str(exc)[:120]}"}


def _err(a: Any, b: Any) -> float:
    return float((a.float() - b.float()).abs().max())


def _kernel_row(t: dict[str, Any], ctx: int, scale: float, timer: Callable, device: str, num_sms: int,
                with_reference: bool, sweep_sizes: Sequence[int]) -> dict[str, Any]:
    """Every timing of one (batch, context): split kernel, single pass, SDPA, reference, sweep."""
    from inflight.model.triton_attention import plan_decode

    q, k_cache = t["q"], t["k_cache"]
    B, _, D = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    max_context = t["block_tables"].shape[1] * block_size
    plan = plan_decode(B, kv_heads, D, max_context, num_sms)
    split, single, sdpa = _kernel(t, scale), _kernel(t, scale, partition_size=ctx), _sdpa(t, scale)
    ref = sdpa().squeeze(2)
    kv_bytes = 2 * B * ctx * kv_heads * D * k_cache.element_size()
    row = {"batch": B, "context": ctx, "block_size": block_size, "dtype": str(q.dtype).replace("torch.", ""),
           "kv_bytes": kv_bytes, "partitions": plan.num_partitions, "partition_size": plan.partition_size,
           "block_n": plan.block_n, "max_abs_err_vs_sdpa": _err(split(), ref),
           "single_pass_err_vs_sdpa": _err(single(), ref)}
    row["triton_ms"], row["single_pass_ms"], row["sdpa_ms"] = timer(split), timer(single), timer(sdpa)
    if with_reference:
        row.update(_torch_paged_ms(t, scale, timer, device))
    for name in ("triton", "single_pass", "sdpa"):
        row[f"{name}_gbs"] = kv_bytes / (row[f"{name}_ms"] * 1e-3) / 1e9
    row["ratio_to_sdpa"] = row["triton_ms"] / row["sdpa_ms"]
    row["single_pass_ratio_to_sdpa"] = row["single_pass_ms"] / row["sdpa_ms"]
    row["triton_overhead"] = row["ratio_to_sdpa"] - 1
    if sweep_sizes:  # the same kernel at fixed partition sizes: is the heuristic's choice the best?
        sizes = {plan_decode(B, kv_heads, D, max_context, num_sms, partition_size=ps).partition_size
                 for ps in sweep_sizes}
        row["sweep_ms"] = {str(ps): timer(_kernel(t, scale, partition_size=ps)) for ps in sorted(sizes) if ps < ctx}
        row["sweep_ms"]["single"] = row["single_pass_ms"]
    return row


def kernel_benchmark(batches: Sequence[int] = (32, 64, 128), contexts: Sequence[int] = (512, 1024, 2048, 4096), *,
                     num_heads: int = 32, kv_heads: int = 8, head_dim: int = 128, block_size: int = 16,
                     dtype: str = "float16", device: str = "cuda", repeats: int = 3, seed: int = 0,
                     with_reference: bool = True, sweep: Sequence[int] = ()) -> list[dict[str, Any]]:
    """Time the Triton paged decode kernel (split and single-pass) against contiguous SDPA.

    Shapes default to a Llama-3-8B layer (32 query heads, 8 kv heads, head_dim 128, fp16, blocks of
    16). `sweep` lists partition sizes (tokens) to time as well. Each row carries the bandwidth's
    share of the device's peak and the targets it meets (see `kernel_summary`).
    """
    import torch

    from inflight.model.triton_attention import sm_count

    _check_kernel_device(device)
    timer = _timer(device, repeats)
    num_sms = sm_count(torch.device(device))
    peak = peak_bandwidth_gbs() if device.startswith("cuda") else None
    rows = []
    for B in batches:
        for ctx in contexts:
            t = _decode_inputs(B, ctx, num_heads, kv_heads, head_dim, block_size, getattr(torch, dtype), device, seed)
            row = _kernel_row(t, ctx, head_dim ** -0.5, timer, device, num_sms, with_reference, sweep)
            row.update(_row_targets(row, peak))
            rows.append(row)
            del t
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    return rows


def _row_targets(row: dict[str, Any], peak: float | None) -> dict[str, Any]:
    frac = row["triton_gbs"] / peak if peak else None
    large = row["kv_bytes"] >= LARGE_KV_BYTES
    return {"peak_fraction": frac, "single_pass_peak_fraction": row["single_pass_gbs"] / peak if peak else None,
            "large": large, "meets_ratio": row["ratio_to_sdpa"] <= TARGET_RATIO,
            "meets_bandwidth": (frac >= TARGET_PEAK_FRACTION) if (large and frac is not None) else None}


def tile_sweep(sizes: Sequence[tuple[int, int]] = ((32, 512), (128, 4096)), *,
               block_ns: Sequence[int] = (32, 64, 128), num_warps: Sequence[int] = (4, 8),
               num_stages: Sequence[int] = (1, 2, 3, 4), device: str = "cuda", dtype: str = "float16",
               num_heads: int = 32, kv_heads: int = 8, head_dim: int = 128, block_size: int = 16,
               seed: int = 0) -> list[dict[str, Any]]:
    """The kernel (its own partition plan) at each tile shape, with SDPA's time at that size; a
    failing compile (e.g. out of shared memory) is recorded, not raised."""
    import torch

    from inflight.model.triton_attention import plan_decode, sm_count

    _check_kernel_device(device)
    timer, num_sms = _timer(device, 3), sm_count(torch.device(device))
    out = []
    for B, ctx in sizes:
        t = _decode_inputs(B, ctx, num_heads, kv_heads, head_dim, block_size, getattr(torch, dtype), device, seed)
        sdpa = _sdpa(t, head_dim ** -0.5)
        ref, sdpa_ms = sdpa().squeeze(2), timer(sdpa)
        kv_bytes = 2 * B * ctx * kv_heads * head_dim * t["k_cache"].element_size()
        for bn in block_ns:
            for w in num_warps:
                for s in num_stages:
                    plan = plan_decode(B, kv_heads, head_dim, t["block_tables"].shape[1] * block_size, num_sms, block_n=bn)
                    entry = {"batch": B, "context": ctx, "block_n": bn, "num_warps": w, "num_stages": s,
                             "partitions": plan.num_partitions, "sdpa_ms": sdpa_ms}
                    fn = _kernel(t, head_dim ** -0.5, block_n=bn, num_warps=w, num_stages=s)
                    try:
                        entry["err_vs_sdpa"] = _err(fn(), ref)
                        entry["ms"] = timer(fn)
                        entry["gbs"] = kv_bytes / (entry["ms"] * 1e-3) / 1e9
                        entry["ratio_to_sdpa"] = entry["ms"] / sdpa_ms
                    except Exception as exc:  # e.g. out of shared memory at deep pipelines
                        entry["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                    out.append(entry)
        del t
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return out


def kernel_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How many sizes meet each target, split kernel and single pass side by side."""
    large = [r for r in rows if r["large"] and r["peak_fraction"] is not None]
    return {
        "ratio_target": f"<= {TARGET_RATIO}x contiguous SDPA",
        "bandwidth_target": f">= {TARGET_PEAK_FRACTION:.0%} of peak at K/V >= {LARGE_KV_BYTES / 2**20:.0f} MiB",
        "sizes": len(rows),
        "meets_ratio": sum(r["meets_ratio"] for r in rows),
        "single_pass_meets_ratio": sum(r["single_pass_ratio_to_sdpa"] <= TARGET_RATIO for r in rows),
        "large_sizes": len(large),
        "meets_bandwidth": sum(bool(r["meets_bandwidth"]) for r in large),
        "worst_ratio": max((r["ratio_to_sdpa"] for r in rows), default=None),
        "worst_single_pass_ratio": max((r["single_pass_ratio_to_sdpa"] for r in rows), default=None),
    }


def kernel_report_lines(res: dict[str, Any]) -> list[str]:
    """The kernel figures of `collect()` as plain-text lines."""
    lines = ["== Paged decode attention: Triton kernel vs contiguous SDPA =="]
    if "kernel" not in res:
        return lines + [f"  skipped: {res.get('kernel_skipped')}"]
    peak, copy = res.get("peak_gbs"), res.get("copy_gbs")
    lines.append(f"  peak bandwidth: {f'{peak:.0f} GB/s' if peak else 'unknown'}; device-to-device copy: "
                 f"{f'{copy:.0f} GB/s' if copy else 'not measured'}; {res.get('num_sms', '?')} SMs")
    lines.append(f"  {'batch':>5}{'ctx':>6}{'parts':>6}{'split ms':>10}{'single ms':>10}{'sdpa ms':>9}{'ref ms':>8}"
                 f"{'split/sdpa':>11}{'single/sdpa':>12}{'split GB/s':>11}{'of peak':>8}  targets")
    for r in res["kernel"]:
        ref = r.get("torch_paged_ms")
        frac = f"{r['peak_fraction']:.0%}" if r.get("peak_fraction") is not None else "-"
        met = "ratio " + ("yes" if r["meets_ratio"] else "NO")
        if r["meets_bandwidth"] is not None:
            met += ", bandwidth " + ("yes" if r["meets_bandwidth"] else "NO")
        lines.append(f"  {r['batch']:>5}{r['context']:>6}{r['partitions']:>6}{r['triton_ms']:>10.3f}"
                     f"{r['single_pass_ms']:>10.3f}{r['sdpa_ms']:>9.3f}{(f'{ref:.3f}' if ref else '-'):>8}"
                     f"{r['ratio_to_sdpa']:>11.2f}{r['single_pass_ratio_to_sdpa']:>12.2f}{r['triton_gbs']:>11.0f}"
                     f"{frac:>8}  {met}")
        if r.get("sweep_ms"):
            best = min(r["sweep_ms"], key=r["sweep_ms"].get)
            lines.append("        sweep (partition size: ms) " + ", ".join(
                f"{k}: {v:.3f}" for k, v in r["sweep_ms"].items()) + f"; best {best}")
    s = res.get("kernel_summary")
    if s:
        lines.append(f"  targets: ratio {s['ratio_target']}: {s['meets_ratio']}/{s['sizes']} sizes (single pass "
                     f"{s['single_pass_meets_ratio']}/{s['sizes']}), worst {s['worst_ratio']:.2f}x; bandwidth "
                     f"{s['bandwidth_target']}: {s['meets_bandwidth']}/{s['large_sizes']} large sizes")
    tune = res.get("kernel_tune", [])
    for B, ctx in sorted({(e["batch"], e["context"]) for e in tune}):
        tried = [e for e in tune if (e["batch"], e["context"]) == (B, ctx)]
        ok = [e for e in tried if "ms" in e]
        if ok:
            e = min(ok, key=lambda e: e["ms"])
            lines.append(f"  tune batch {B} ctx {ctx}: best of {len(ok)} tile shapes ({len(tried) - len(ok)} failed): "
                         f"block_n {e['block_n']}, num_warps {e['num_warps']}, num_stages {e['num_stages']}, "
                         f"{e['partitions']} partitions: {e['ms']:.3f} ms, {e['gbs']:.0f} GB/s, "
                         f"{e['ratio_to_sdpa']:.2f}x SDPA")
    return lines


def kernel_figures(device: str, *, quick: bool = False, batches: Sequence[int] | None = None,
                   contexts: Sequence[int] | None = None, dtype: str = "float16", sweep: bool = False,
                   tune: bool = False) -> dict[str, Any]:
    """The kernel section of `collect()`: rows, summary, optional sweeps; on a CPU, why it is skipped."""
    import torch

    from inflight.model.triton_attention import HAS_TRITON, sm_count

    if not device.startswith("cuda"):
        return {"kernel_skipped": "no GPU: the Triton kernel needs CUDA (on a CPU the tests run it under "
                                  "TRITON_INTERPRET=1 for correctness only)"}
    if not HAS_TRITON:
        return {"kernel_skipped": "triton is not installed"}
    import triton

    batches = batches or ((32, 128) if quick else (32, 64, 128))
    contexts = contexts or ((512, 4096) if quick else (512, 1024, 2048, 4096))
    res: dict[str, Any] = {"triton": triton.__version__, "num_sms": sm_count(torch.device(device)),
                           "peak_gbs": peak_bandwidth_gbs(), "copy_gbs": copy_bandwidth_gbs(device)}
    res["kernel"] = kernel_benchmark(batches, contexts, dtype=dtype, device=device,
                                     sweep=(128, 256, 512, 1024, 2048) if sweep else ())
    res["kernel_summary"] = kernel_summary(res["kernel"])
    if tune:
        res["kernel_tune"] = tile_sweep(device=device, dtype=dtype)
    return res
