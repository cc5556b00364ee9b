"""The server's benchmarks: HTTP clients against a running OpenAI-compatible server.

- `loadgen` — `python -m inflight.bench.serve`: the load generator, modelled on `vllm bench serve`
  (same flags, same result fields); with `client` (one streamed request, timed per token) and
  `stats` (TTFT, TPOT, ITL, goodput) it is a pure HTTP client — no engine, model or server code —
  so it measures vLLM's server as well as this book's;
- `process` — servers (ours, `transformers serve`) as processes of their own on loopback ports;
- `cost` — `python -m inflight.bench.serve.cost`: the server against the offline engine;
- `compare` — `python -m inflight.bench.serve.compare`: this server beside `transformers serve`;
- `chaos` — `python -m inflight.bench.serve.chaos`: the server under misbehaving clients.

`from inflight.bench.serve import run_benchmark` (and the load generator's other public names)
imports them lazily from `loadgen`, so this package costs nothing to import.
"""
from __future__ import annotations

from inflight._lazy import lazy_exports

_EXPORTS = {name: "loadgen" for name in
            ("SampleRequest", "random_requests", "arrival_times", "benchmark", "run_benchmark", "sweep", "main")}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
