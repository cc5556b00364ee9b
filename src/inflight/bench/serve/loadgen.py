"""`python -m inflight.bench.serve`: a load generator for any OpenAI-compatible server, modelled on
`vllm bench serve` (same flags, same result fields).

    python -m inflight.serve --port 8000 &                 # this book's server (or vllm serve / transformers serve)
    python -m inflight.bench.serve --base-url http://127.0.0.1:8000 --num-prompts 200 \\
        --request-rate 8 --goodput ttft:500 tpot:100 --save-result

Requests arrive as a Poisson process at `--request-rate` per second (`--burstiness` < 1: burstier,
gamma-distributed gaps; `inf`: all at once); `--max-concurrency` caps how many are in flight, and
the time a request waits for a slot is recorded apart (its TTFT starts when it is sent). Each
request is streamed and timed token by token (`inflight.bench.serve.client`); the figures are
vLLM's (`inflight.bench.serve.stats`). A pure HTTP client: it imports no engine code.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from inflight.bench.serve.client import RequestResult, send_request, stream_payload
from inflight.bench.serve.stats import calculate_metrics, parse_goodput

__all__ = ["SampleRequest", "random_requests", "arrival_times", "benchmark", "run_benchmark", "sweep", "main"]

# words of the tiny model's world (Python functions), so prompts look like its training text
_WORDS = ("def", "return", "self", "if", "else", "for", "in", "import", "value", "name", "path", "items", "None",
          "True", "len", "list", "dict", "key", "data", "result", "args", "line", "open", "with", "as", "not")


@dataclass
class SampleRequest:
    prompt: str
    output_len: int


def random_requests(n: int, input_len: int, output_len: int, range_ratio: float = 0.0, seed: int = 0) -> list[SampleRequest]:
    """`n` prompts of about `input_len` characters (Python-like words) each asking for `output_len`
    tokens, both drawn from [len * (1 - range_ratio), len * (1 + range_ratio)]."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lo, hi = max(1, int(input_len * (1 - range_ratio))), max(1, int(input_len * (1 + range_ratio)))
        want = rng.randint(lo, hi)
        words = []
        while sum(len(w) + 1 for w in words) < want:
            words.append(rng.choice(_WORDS))
        text = " ".join(words)[:want]
        olo, ohi = max(1, int(output_len * (1 - range_ratio))), max(1, int(output_len * (1 + range_ratio)))
        out.append(SampleRequest(text, rng.randint(olo, ohi)))
    return out


def arrival_times(n: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """When each request is sent (seconds from the start): gaps from a gamma distribution of mean
    1/rate (shape `burstiness`; 1 = Poisson), rescaled so that n requests take n/rate seconds."""
    if not request_rate > 0 or not burstiness > 0:  # (NaN too)
        raise ValueError(f"request_rate and burstiness must be positive, got {request_rate}, {burstiness}")
    if request_rate == math.inf or n == 0:
        return [0.0] * n
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=n)
    t = np.cumsum(gaps)
    t *= (n / request_rate) / t[-1]
    return [0.0] + [float(x) for x in t[:-1]]


async def benchmark(base_url: str, requests: Sequence[SampleRequest], *, model: str | None = None,
                    endpoint: str = "/v1/completions", request_rate: float = math.inf, burstiness: float = 1.0,
                    max_concurrency: int | None = None, goodput: dict[str, float] | None = None,
                    ignore_eos: bool = True, api_key: str | None = None, seed: int = 0, disable_tqdm: bool = False,
                    percentiles: Sequence[float] = (50, 90, 99), extra_body: dict | None = None,
                    timeout_s: float = 600.0) -> dict[str, Any]:
    """Send `requests` at their arrival times; the results dict (vLLM's fields)."""
    import httpx

    # every setting is checked before the first request: a bad one must not cost a whole run
    _check_settings(len(requests), max_concurrency, percentiles)
    times = arrival_times(len(requests), request_rate, burstiness, seed)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits, headers=headers) as client:
        if model is None:
            model = await _served_model(client, base_url.rstrip("/"))
        url = base_url.rstrip("/") + endpoint
        chat = endpoint.endswith("chat/completions")
        slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        bar = None if disable_tqdm else _progress(len(requests))

        async def one(req: SampleRequest, at: float, start: float) -> RequestResult:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            queued = time.perf_counter()
            payload = stream_payload(model, req.prompt, req.output_len, chat=chat, ignore_eos=ignore_eos, extra=extra_body)
            if slots is None:
                res = await send_request(client, url, payload)
            else:
                async with slots:
                    wait = time.perf_counter() - queued
                    res = await send_request(client, url, payload)
                    res.client_queue_time = wait
            if bar is not None:
                bar.update(1)
            return res

        start = time.perf_counter()
        results = await asyncio.gather(*(one(r, t, start) for r, t in zip(requests, times)))
        duration = time.perf_counter() - start
        if bar is not None:
            bar.close()
    out = {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": "openai-chat" if chat else "openai",
           "base_url": base_url, "endpoint": endpoint, "model_id": model, "num_prompts": len(requests),
           "request_rate": "inf" if request_rate == math.inf else request_rate, "burstiness": burstiness,
           "max_concurrency": max_concurrency, "goodput_slos_ms": goodput or None}
    out.update(calculate_metrics(list(results), duration, goodput, percentiles))
    return out


def _check_settings(num_requests: int, max_concurrency: int | None, percentiles: Sequence[float]) -> None:
    if num_requests < 1:
        raise ValueError("no requests to send (num_prompts must be at least 1)")
    if max_concurrency is not None and (type(max_concurrency) is not int or max_concurrency < 1):
        raise ValueError(f"max_concurrency must be a positive integer or None (no limit), got {max_concurrency!r}")
    bad = [p for p in percentiles if not 0 <= p <= 100]  # (NaN too)
    if bad:
        raise ValueError(f"percentiles must be between 0 and 100, got {bad}")


async def _served_model(client: Any, base_url: str) -> str:
    """The first model `base_url/v1/models` lists; ConnectionError naming what went wrong if none."""
    import httpx

    try:
        response = await client.get(base_url + "/v1/models")
    except httpx.HTTPError as exc:
        raise ConnectionError(f"cannot reach {base_url}: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise ConnectionError(f"{base_url}/v1/models answered HTTP {response.status_code}: {response.text[:300]}")
    try:
        return response.json()["data"][0]["id"]
    except (ValueError, LookupError, TypeError):
        raise ConnectionError(f"{base_url}/v1/models lists no model: {response.text[:300]}") from None


def _progress(total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="requests", unit="req")


def run_benchmark(base_url: str, requests: Sequence[SampleRequest], **kw: Any) -> dict[str, Any]:
    """`benchmark(...)` from synchronous code — also inside a notebook, whose event loop is already
    running (then it runs on a thread of its own)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(benchmark(base_url, requests, **kw))
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["out"] = asyncio.run(benchmark(base_url, requests, **kw))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["err"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "err" in box:
        raise box["err"]
    return box["out"]


def sweep(base_url: str, rates: Sequence[float], make_requests, **kw: Any) -> list[dict[str, Any]]:
    """One run per request rate (fresh requests from `make_requests(rate)` each time): a list of plain
    rows — rate, throughput, goodput, TTFT and ITL percentiles in ms — that a table or a figure reads."""
    rows = []
    for rate in rates:
        r = run_benchmark(base_url, make_requests(rate), request_rate=rate, **kw)
        rows.append({"request_rate": rate, "completed": r["completed"], "failed": r["failed"],
                     "request_throughput": r["request_throughput"], "output_throughput": r["output_throughput"],
                     "request_goodput": r["request_goodput"],
                     **{k: r[k] for k in r if k.endswith("_ms") and k.split("_")[1] in ("ttft", "itl", "tpot", "e2el")}})
    return rows


def print_result(r: dict[str, Any]) -> None:
    """vLLM's summary table."""
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    rows = [("Successful requests:", r["completed"]), ("Failed requests:", r["failed"]),
            ("Maximum request concurrency:", r["max_concurrency"]), ("Request rate configured (RPS):", r["request_rate"]),
            ("Benchmark duration (s):", r["duration"]), ("Total input tokens:", r["total_input_tokens"]),
            ("Total generated tokens:", r["total_output_tokens"]), ("Request throughput (req/s):", r["request_throughput"]),
            ("Request goodput (req/s):", r["request_goodput"]), ("Output token throughput (tok/s):", r["output_throughput"])]
    for label, v in rows:
        if v is not None:
            print(f"{label:<40} {v:<10.2f}" if isinstance(v, float) else f"{label:<40} {v}")
    for name, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                        ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        print("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        for k, v in r.items():
            if k.endswith(f"_{name}_ms") and not k.startswith("std"):
                print(f"{k.split('_')[0].capitalize() + ' ' + name.upper() + ' (ms):':<40} {v:<10.2f}")
    print("=" * 50)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m inflight.bench.serve", description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--endpoint", default="/v1/completions", choices=("/v1/completions", "/v1/chat/completions"))
    p.add_argument("--model", default=None, help="model name to send (default: the server's first)")
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--random-input-len", type=int, default=64, help="prompt length in characters")
    p.add_argument("--random-output-len", type=int, default=64, help="tokens to generate")
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--request-rate", type=float, default=math.inf, help="requests per second (default inf: all at once)")
    p.add_argument("--burstiness", type=float, default=1.0)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--goodput", nargs="+", default=None, metavar="NAME:MS", help="SLOs, e.g. ttft:500 tpot:100")
    p.add_argument("--metric-percentiles", default="50,90,99")
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="don't send ignore_eos (for servers without vLLM's extension)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--disable-tqdm", action="store_true")
    p.add_argument("--save-result", action="store_true")
    p.add_argument("--result-filename", default=None)
    p.add_argument("--quick", action="store_true", help="a smoke run: 8 short requests")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.num_prompts, args.random_input_len, args.random_output_len = 8, 16, 8
    reqs = random_requests(args.num_prompts, args.random_input_len, args.random_output_len, args.random_range_ratio,
                           args.seed)
    try:
        percentiles = [float(p) for p in args.metric_percentiles.split(",")]
        result = run_benchmark(args.base_url, reqs, model=args.model, endpoint=args.endpoint,
                               request_rate=args.request_rate, burstiness=args.burstiness,
                               max_concurrency=args.max_concurrency, goodput=parse_goodput(args.goodput),
                               ignore_eos=args.ignore_eos, api_key=args.api_key, seed=args.seed,
                               disable_tqdm=args.disable_tqdm, percentiles=percentiles)
    except (ValueError, ConnectionError) as exc:  # a bad setting, or no server to measure: say which, no traceback
        print(f"python -m inflight.bench.serve: error: {exc}", file=sys.stderr)
        return 2
    print_result(result)
    if args.save_result:
        name = args.result_filename or f"serve-{result['request_rate']}qps-{result['date']}.json"
        Path(name).write_text(json.dumps(result, indent=1) + "\n")
        print(f"saved {name}")
    return 0 if result["completed"] else 1


if __name__ == "__main__":
    sys.exit(main())
