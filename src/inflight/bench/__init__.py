"""`python -m inflight.bench`: the serving benchmark the book and the README quote, and the others.

The folder shows what each measures:

- `offline/` — offline serving, `python -m inflight.bench` itself (`__main__` is its command line):
  the same requests served by our engine's modes and by the transformers peers, every mode's tokens
  checked; `offline.prefix` and `offline.soak` have their own command lines;
- `protocol/` — how a ratio over a peer is measured (`fair`: each system in its own process at its
  best settings, alternating, tokens checked; `contender`, `side_by_side`, `busy`) and what bounds
  it (`floor`);
- `serve/` — the server: `python -m inflight.bench.serve` (a load generator for any
  OpenAI-compatible server, a pure HTTP client) and the benchmarks built on it (`cost`, `compare`,
  `chaos`);
- `kernels/` — one operation at a time (`attention`, `triton_decode`, `cpu`, `prompt_attention`,
  `decode_step`);
- `profiling` — the instruments all of them share (timers, the machine's roofs, profiler tables).

`from inflight import bench` gives the names a chapter uses (`bench.run_benchmark`,
`bench.BenchConfig`, `bench.format_table`, ...), imported lazily from the module that defines them.
"""
from __future__ import annotations

from inflight._lazy import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    **dict.fromkeys(("MODES", "MODE_TITLES", "BenchConfig", "BenchSetup", "quick_config"), "offline.config"),
    **dict.fromkeys(("BenchRequest", "Workload", "make_workload"), "offline.prompts"),
    **dict.fromkeys(("RunRecord",), "offline.record"),
    **dict.fromkeys(("run_static", "run_engine"), "offline.runners"),
    **dict.fromkeys(("to_transformers", "run_hf_static", "run_hf_continuous"), "offline.peers"),
    **dict.fromkeys(("check_outputs", "summarize", "ideal_speedup", "device_limits"), "offline.metrics"),
    **dict.fromkeys(("format_table", "format_report", "format_fair", "save_results"), "offline.report"),
    **dict.fromkeys(("compare",), "protocol.fair"),
    **dict.fromkeys(("median_runs",), "protocol.side_by_side"),
    **dict.fromkeys(("run_mode", "run_checked", "run_benchmark"), "offline.suite"),
    **dict.fromkeys(("random_model", "load_model"), "offline.models"),
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
