"""The numbers a serving benchmark reports, from what each client saw (vLLM's `calculate_metrics` in
`vllm/benchmarks/serve.py`, same names and units): TTFT, TPOT, ITL and end-to-end latency (mean,
median, std and chosen percentiles, in ms), throughput, and goodput — requests per second that met
every service-level objective (`--goodput ttft:MS tpot:MS e2el:MS`).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from inflight.bench.serve.client import RequestResult

__all__ = ["parse_goodput", "is_good", "calculate_metrics", "METRICS"]

METRICS = ("ttft", "tpot", "itl", "e2el")
_SLO_KEYS = ("ttft", "tpot", "e2el")


def parse_goodput(items: Sequence[str] | None) -> dict[str, float]:
    """`["ttft:200", "tpot:50"]` -> {"ttft": 200.0, "tpot": 50.0} (milliseconds)."""
    slos: dict[str, float] = {}
    for item in items or ():
        name, sep, value = item.partition(":")
        if not sep or name not in _SLO_KEYS:
            raise ValueError(f"--goodput takes NAME:MILLISECONDS with NAME in {_SLO_KEYS}, got {item!r}")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"--goodput {item!r}: {value!r} is not a number of milliseconds") from None
        if not ms > 0:
            raise ValueError(f"--goodput {item!r}: the objective must be a positive number of milliseconds")
        slos[name] = ms
    return slos


def tpot(r: RequestResult) -> float:
    """Seconds per output token after the first: (latency - TTFT) / (tokens - 1); 0 for one token."""
    return (r.latency - r.ttft) / (r.output_len - 1) if r.output_len > 1 else 0.0


def is_good(r: RequestResult, slos: dict[str, float]) -> bool:
    """Whether a completed request met every objective (ms)."""
    seen = {"ttft": r.ttft, "tpot": tpot(r), "e2el": r.latency}
    return r.success and all(seen[k] * 1000 <= v for k, v in slos.items())


def _summary(name: str, values: list[float], percentiles: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(values or [0.0], dtype=float) * 1000
    out = {f"mean_{name}_ms": float(arr.mean()), f"median_{name}_ms": float(np.median(arr)),
           f"std_{name}_ms": float(arr.std())}
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(arr, p))
    return out


def calculate_metrics(results: list[RequestResult], duration: float, slos: dict[str, float] | None = None,
                      percentiles: Sequence[float] = (50, 90, 99)) -> dict[str, Any]:
    """The run's figures (vLLM's names); per-request lists included for plots."""
    done = [r for r in results if r.success]
    slos = slos or {}
    out_tokens = sum(r.output_len for r in done)
    in_tokens = sum(r.prompt_len for r in done)
    m: dict[str, Any] = {
        "duration": duration, "completed": len(done), "failed": len(results) - len(done),
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "request_throughput": len(done) / duration if duration > 0 else 0.0,
        "request_goodput": (sum(is_good(r, slos) for r in done) / duration if duration > 0 else 0.0) if slos else None,
        "output_throughput": out_tokens / duration if duration > 0 else 0.0,
        "total_token_throughput": (in_tokens + out_tokens) / duration if duration > 0 else 0.0,
    }
    series = {"ttft": [r.ttft for r in done], "tpot": [tpot(r) for r in done if r.output_len > 1],
              "itl": [x for r in done for x in r.itl], "e2el": [r.latency for r in done]}
    for name in METRICS:
        m.update(_summary(name, series[name], percentiles))
    m.update({"input_lens": [r.prompt_len for r in results], "output_lens": [r.output_len for r in results],
              "ttfts": [r.ttft for r in results], "itls": [r.itl for r in results],
              "latencies": [r.latency for r in results], "start_times": [r.start_time for r in results],
              "queue_times": [r.client_queue_time for r in results],
              "generated_texts": [r.generated_text for r in results], "errors": [r.error for r in results]})
    return m
