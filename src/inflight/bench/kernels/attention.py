"""`python -m inflight.bench.kernels.attention`: the paged-KV chapter's figures.

1. KV memory utilization (any machine): contiguous max-length reservation vs paged blocks of
   8/16/32 tokens on two workloads (short long-tailed chat, ShareGPT-like), with the paging ceiling.
2. On CUDA only: the Triton paged decode kernel (split into partitions, and single-pass) vs
   contiguous `scaled_dot_product_attention` (and the plain-torch paged reference) at batch 32–128
   and contexts 512–4096, with the memory bandwidth each achieves against the device's peak and
   the targets met (`inflight.bench.kernels.triton_decode`). On a CPU this section says it is skipped.

Prints a table and saves `results/attention_<device>.json`.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from inflight.bench.kernels.triton_decode import kernel_benchmark, kernel_figures, kernel_report_lines, peak_bandwidth_gbs

__all__ = ["kv_utilization_figures", "kernel_benchmark", "peak_bandwidth_gbs", "device_name", "collect", "main"]


def device_name(device: str | None = None) -> str:
    """A file-name-friendly device name: the GPU's name, or "cpu"."""
    import torch

    if (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda"):
        name = torch.cuda.get_device_name(0)
        return re.sub(r"[^A-Za-z0-9]+", "-", name.replace("NVIDIA", "")).strip("-").lower() or "cuda"
    return "cpu"


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


def collect(quick: bool = False, device: str | None = None, **kernel_options: Any) -> dict[str, Any]:
    """Every figure of this benchmark as one JSON-able dict (`kernel_options`: see `kernel_figures`)."""
    import torch

    from inflight.device import describe_device

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    res: dict[str, Any] = {"device": describe_device(), "device_name": device_name(device), "torch": torch.__version__,
                           "kv_utilization": kv_utilization_figures(*((500, 300) if quick else (2000, 1000)))}
    res.update(kernel_figures(device, quick=quick, **kernel_options))
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
    lines += kernel_report_lines(res)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests and kernel sizes")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default results/attention_<device>.json)")
    kernel = parser.add_argument_group("the decode kernel (CUDA only)")
    kernel.add_argument("--batches", type=int, nargs="+", default=None, help="batch sizes (default 32 64 128)")
    kernel.add_argument("--contexts", type=int, nargs="+", default=None, help="context lengths (default 512 ... 4096)")
    kernel.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    kernel.add_argument("--sweep", action="store_true", help="also time every partition size 128 ... 2048")
    kernel.add_argument("--tune", action="store_true", help="also time tile shapes (block_n x num_warps x num_stages)")
    args = parser.parse_args(argv)
    res = collect(quick=args.quick, batches=args.batches, contexts=args.contexts, dtype=args.dtype,
                  sweep=args.sweep, tune=args.tune)
    print(report(res))
    out = args.out or Path("results") / f"attention_{res['device_name']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
