"""Offline serving: the parts of `python -m inflight.bench` (requests served by the engine and its
peers in one process, no HTTP), one concept a module.

`config` (modes, `BenchConfig`, `BenchSetup`), `prompts` (token ids for the workloads of
`inflight.sim.workloads`), `models` (which model to serve), `record` (`RunRecord`, the arrival
clock), `runners` (our sequential / static / contiguous / paged runs), `peers` (transformers),
`agreement` (when a batched mode computed the same thing), `metrics` (summaries, ideal speedup,
device limits, targets), `report` (table, text, JSON), `suite` (the whole run). Two more have their
own command line: `prefix` (`python -m inflight.bench.offline.prefix`: prefix caching on and off)
and `soak` (`python -m inflight.bench.offline.soak`: 100,000 requests through one engine, memory
stays flat).
"""
