"""`python -m inflight.bench.serve.compare`: this book's server beside `transformers serve`.

The same model weights (the shipped tiny model; for transformers saved as a Hugging Face checkpoint
with a byte-level tokenizer that gives the same token ids), the same greedy requests, the same load
generator (`inflight.bench.serve`), Poisson arrivals at each request rate. Each server runs in its
own process at its own settings — ours with its defaults, `transformers serve` with its continuous
batching (`--continuous-batching`, its defaults) — and only while it is measured; the two take turns,
round after round. Requests carry no `ignore_eos` (transformers refuses the field), so both stop
where the model does. Reported per server and rate: throughput, p99 TTFT, and goodput (requests per
second meeting `--goodput`'s objectives).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import inflight  # noqa: F401  (before torch: the OpenMP wait policy)
from inflight.bench.serve.loadgen import random_requests, run_benchmark
from inflight.bench.serve.process import run_record, save_result, save_tiny_as_hf, start_inflight, start_transformers
from inflight.bench.serve.stats import parse_goodput

__all__ = ["main"]

FIELDS = ("output_throughput", "request_throughput", "request_goodput", "p99_ttft_ms", "median_ttft_ms",
          "median_tpot_ms", "p99_itl_ms", "completed", "failed")


def _measure(start, rates, args, goodput) -> dict:
    srv = start()
    try:
        warm = run_benchmark(srv.base_url, random_requests(4, args.input_len, 8, seed=99), ignore_eos=False,
                             disable_tqdm=True)
        assert warm["completed"] == 4, warm["errors"]
        out = {}
        for rate in rates:
            n = max(16, int(rate * args.duration))
            reqs = random_requests(n, args.input_len, args.output_len, seed=int(rate * 1000))
            r = run_benchmark(srv.base_url, reqs, request_rate=rate, goodput=goodput, ignore_eos=False,
                              disable_tqdm=True)
            out[str(rate)] = {k: r[k] for k in FIELDS}
        return out
    finally:
        srv.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inflight.bench.serve.compare", description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="4,8,16", help="request rates (requests/s), comma-separated")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of arrivals per rate")
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--goodput", nargs="+", default=["ttft:500", "tpot:50"])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--quick", action="store_true", help="a smoke run: one low rate, two seconds, one round")
    args = p.parse_args(argv)
    if args.quick:
        args.rates, args.duration, args.rounds, args.output_len = "2", 2.0, 1, 8
    rates = [float(r) for r in args.rates.split(",")]
    goodput = parse_goodput(args.goodput)
    from inflight.threads import LoadWatch

    folder = save_tiny_as_hf(Path(tempfile.mkdtemp(prefix="inflight-tiny-hf-")))
    servers = {"inflight": lambda: start_inflight([]),
               "transformers": lambda: start_transformers(folder, ["--continuous-batching"])}
    rounds = []
    with LoadWatch() as watch:
        for i in range(args.rounds):
            order = list(servers) if i % 2 == 0 else list(reversed(servers))
            rounds.append({name: _measure(servers[name], rates, args, goodput) for name in order})
            print(f"round {i + 1}: " + json.dumps(rounds[-1]), flush=True)
    summary = {name: {str(r): {k: statistics.median(rd[name][str(r)][k] for rd in rounds) for k in FIELDS}
                      for r in rates} for name in servers}
    for r in rates:
        ours, theirs = summary["inflight"][str(r)], summary["transformers"][str(r)]
        ratio = ours["request_goodput"] / theirs["request_goodput"] if theirs["request_goodput"] else float("inf")
        summary.setdefault("goodput_ratio", {})[str(r)] = ratio
        print(f"rate {r:g}/s: tokens/s {ours['output_throughput']:.0f} vs {theirs['output_throughput']:.0f}, "
              f"p99 TTFT {ours['p99_ttft_ms']:.0f} vs {theirs['p99_ttft_ms']:.0f} ms, goodput "
              f"{ours['request_goodput']:.2f} vs {theirs['request_goodput']:.2f} req/s ({ratio:.1f}x)")
    print(f"machine busy during the run: {watch.busy}")
    result = {**run_record("inflight.bench.serve.compare", argv, watch), "goodput_slos_ms": goodput,
              "settings": vars(args) | {"output": str(args.output)}, "rounds": rounds, "summary": summary}
    save_result(result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
