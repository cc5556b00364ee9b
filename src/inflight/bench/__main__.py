"""`python -m inflight.bench`: the serving benchmark the book and the README quote.

Six ways of serving the same requests with the same weights — sequential, static batches, our
engine over a contiguous and over a paged KV cache, transformers `generate` and transformers'
continuous batching (`inflight.bench.offline.config` lists them) — each checked token for token against
the sequential run before any speed is reported. Prints a report; `--out` saves the JSON.

`--matrix` runs the workload matrix instead (`inflight.bench.protocol.matrix`): the fair comparison
with `generate` on twelve shapes of work and on the benchmark's own, each with its ideal, its floor
and the engine's time split (`--cells` to choose some, `--fair-rounds` rounds, 5 by default).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from inflight.bench.offline.config import MODES, BenchConfig, quick_config

__all__ = ["main", "parse_modes", "results_path"]

WORKLOADS = ("long_tailed", "uniform", "online")


def parse_modes(text: str) -> list[str]:
    """"1,4" or "static, hf_continuous" -> mode names; 5 means both transformers peers."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if part.isdigit() and 1 <= int(part) <= 4:
            out.append(MODES[int(part) - 1])
        elif part == "5":
            out += ["hf_static", "hf_continuous"]
        elif part in MODES:
            out.append(part)
        else:
            raise argparse.ArgumentTypeError(f"unknown mode {part!r}: use 1-5 or {', '.join(MODES)}")
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m inflight.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="CI smoke: tiny workload, under a minute")
    p.add_argument("--workload", default=None,
                   help="comma list of long_tailed, uniform, online (default: all; --quick: long_tailed,online)")
    p.add_argument("--modes", type=parse_modes, default=None, help=f"comma list of 1-5 or {', '.join(MODES)}")
    p.add_argument("--model", default=None, help="checkpoint folder or hub id (default: the shipped tiny model)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None,
                   help="e.g. bfloat16 (default float32: half precision makes greedy tokens depend on the batch, and the check refuses such modes)")
    p.add_argument("-n", "--num-requests", type=int, default=None)
    p.add_argument("-B", "--batch-size", type=int, default=None, help="slots of the static/contiguous modes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--fair-rounds", type=int, default=None,
                   help="rounds of the fair comparison with the peers (bench.protocol.fair; 0: none; default 5, --quick 1)")
    p.add_argument("--no-attention-bench", action="store_true")
    p.add_argument("--no-prefix-bench", action="store_true", help="skip the prefix-caching section")
    p.add_argument("--no-decode-step", action="store_true", help="skip the batch-1 decode step timing")
    p.add_argument("--logprob-tolerance", type=float, default=None,
                   help="half precision: accepted teacher-forced deviation in nats (default per dtype, bench.offline.agreement)")
    p.add_argument("--matrix", action="store_true",
                   help="the workload matrix instead (inflight.bench.protocol.matrix; with --cells, --fair-rounds, --out)")
    p.add_argument("--cells", nargs="*", default=None, help="with --matrix: the cells to run (default all)")
    p.add_argument("--out", default=None, help="write the results JSON here (e.g. results/bench_cpu.json); a "
                   "folder: bench_gpu_<gpu>.json or bench_cpu.json in it")
    return p


def config_from_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> BenchConfig:
    """The run the flags ask for: --quick's or the full configuration, with the flags applied."""
    cfg = quick_config() if args.quick else BenchConfig()
    if args.workload:
        cfg.workloads = [w.strip() for w in args.workload.split(",") if w.strip()]
        unknown = set(cfg.workloads) - set(WORKLOADS)
        if unknown:
            p.error(f"unknown workload(s) {sorted(unknown)}")
    if args.modes:
        cfg.modes = args.modes
        cfg.online_modes = [m for m in cfg.online_modes if m in cfg.modes] or cfg.online_modes
    for flag, value in (("--num-requests", args.num_requests), ("--batch-size", args.batch_size)):
        if value is not None and value < 1:
            p.error(f"{flag} must be >= 1")
    if args.fair_rounds is not None:
        if args.fair_rounds < 0:
            p.error("--fair-rounds must be >= 0")
        cfg = replace(cfg, fair_rounds=args.fair_rounds)
    return replace(cfg, n=args.num_requests or cfg.n, batch_size=args.batch_size or cfg.batch_size, seed=args.seed,
                   model=args.model, device=args.device, dtype=args.dtype, threads=args.threads,
                   attention_bench=not args.no_attention_bench, prefix_bench=not args.no_prefix_bench,
                   decode_step_bench=not args.no_decode_step, logprob_tolerance=args.logprob_tolerance)


def results_path(out: str, device: str) -> Path:
    """`out` itself, or in a folder (one that exists, or a path ending in /) the run's own name:
    `bench_gpu_<gpu name>.json` on CUDA (e.g. bench_gpu_h200.json), else `bench_cpu.json`."""
    path = Path(out)
    if not (path.is_dir() or out.endswith(("/", "\\"))):
        return path
    from inflight.bench.kernels.attention import device_name

    return path / (f"bench_gpu_{device_name(device)}.json" if device.startswith("cuda") else "bench_cpu.json")


def main(argv: Sequence[str] | None = None) -> int:
    from inflight.bench.offline.report import format_report, save_results
    from inflight.bench.offline.suite import run_benchmark

    p = _parser()
    args = p.parse_args(argv)
    if args.matrix or args.cells:
        return _matrix(p, args)
    cfg = config_from_args(p, args)
    if args.out:  # the fair comparison's reference tokens go beside the results
        where = results_path(args.out, args.device or "cpu")
        cfg = replace(cfg, fair_reference=str(where.with_name(where.stem + "_reference_tokens.json")))
    results = run_benchmark(cfg)
    print()
    print(format_report(results))
    if args.out:
        out = results_path(args.out, results["model"]["device"])
        save_results(results, out)
        print(f"\nresults written to {out}")
    return 0


def _matrix(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """`--matrix`: the fair protocol on every cell of `bench.protocol.cells` (its own CLI, same flags)."""
    from inflight.bench.protocol import matrix

    if not args.matrix:
        p.error("--cells goes with --matrix")
    argv = ["--rounds", str(5 if args.fair_rounds is None else args.fair_rounds)]
    argv += ["--cells", *args.cells] if args.cells else []
    argv += ["--out", args.out] if args.out else []
    return matrix.main(argv)


if __name__ == "__main__":
    sys.exit(main())
