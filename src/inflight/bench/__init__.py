"""`python -m inflight.bench`: the serving benchmark the book and the README quote.

One concept a module: `config` (modes, `BenchConfig`, `BenchSetup`), `prompts` (token ids for the
workloads of `inflight.sim.workloads`), `record` (`RunRecord`, the arrival clock), `runners` (our
sequential / static / contiguous / paged runs), `peers` (transformers), `metrics` (summaries,
ideal speedup, device limits, targets), `report` (table, text, JSON), `suite` (the whole run),
`models` (which model to serve), `__main__` (the CLI); `attention`, `prefix` and `profiling` are
the paged-KV chapter's, the sharing chapter's and the shared instruments. `fair` is the comparison
protocol (each system in its own process at its best settings, alternating, tokens checked) and
`contender` the process it runs for one mode. More have their own command line: `side_by_side` (the
engine against the transformers peers by that protocol), `busy` (the engine in either import order,
quiet and beside one competitor per core) and `soak` (100,000 requests through one engine: memory
stays flat).

`from inflight import bench` gives the names a chapter uses (`bench.run_benchmark`,
`bench.BenchConfig`, `bench.format_table`, ...), imported lazily from the module that defines them.
"""
from __future__ import annotations

from inflight._lazy import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "MODES": "config", "MODE_TITLES": "config", "BenchConfig": "config", "BenchSetup": "config",
    "quick_config": "config",
    "BenchRequest": "prompts", "Workload": "prompts", "make_workload": "prompts",
    "RunRecord": "record",
    "run_static": "runners", "run_engine": "runners",
    "to_transformers": "peers", "run_hf_static": "peers", "run_hf_continuous": "peers",
    "check_outputs": "metrics", "summarize": "metrics", "ideal_speedup": "metrics", "device_limits": "metrics",
    "format_table": "report", "format_report": "report", "format_fair": "report", "save_results": "report",
    "compare": "fair", "median_runs": "side_by_side",
    "run_mode": "suite", "run_checked": "suite", "run_benchmark": "suite",
    "random_model": "models", "load_model": "models",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
