"""How a ratio over a peer is measured, and what bounds it.

- `fair` — the protocol: each system in its own process at its own best settings (thread counts,
  OpenMP wait policies), taking turns round after round, every process's tokens checked;
- `contender` — `python -m inflight.bench.protocol.contender`: the process it runs for one mode;
- `side_by_side` — `python -m inflight.bench.protocol.side_by_side`: the paged engine against the
  transformers peers by that protocol;
- `busy` — `python -m inflight.bench.protocol.busy`: the engine in either import order, quiet and
  beside one competitor per core;
- `floor` — how far a run is from the fastest its own work allows on this machine.
"""
