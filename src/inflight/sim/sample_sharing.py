"""What sharing a prompt's blocks saves when requests ask for several samples (chapter 5; the
PagedAttention paper's §6.3).

The engine's own scheduler over a simulated pool (`SimEngine`, no model) runs requests of `n`
samples each: one prefill, then samples that share the prompt's blocks by reference count and copy
the last, partly filled one on their first write (`inflight.engine.parallel_sampling`). At every
step it counts

* **blocks in use** — what the pool really holds, each shared block once;
* **blocks without sharing** — the lengths of all the samples' block tables added up: what the
  same samples would hold if each kept its own copy of the prompt, as `n` separate requests do.

The paper's measure of the saving (its Fig. 15) is the blocks saved by sharing over the blocks
without sharing; here both are summed over the steps of the run.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from inflight.engine.block_manager import blocks_needed
from inflight.engine.parallel_sampling import request_samples
from inflight.sim.engine_sim import SimEngine
from inflight.sim.kv_sim import lengths_of
from inflight.sim.workloads import Request

__all__ = ["SharingRun", "sample_run", "workload_run", "blocks_with_and_without"]


@dataclass
class SharingRun:
    """A run's blocks, step by step, with sharing (`in_use`) and as unshared copies (`without`);
    and, for a single request, its samples' block tables and the reference counts at the peak."""

    n: int
    block_size: int
    in_use: np.ndarray
    without: np.ndarray
    tables: list[list[int]] = field(default_factory=list)
    refs: dict[int, int] = field(default_factory=dict)
    copies: int = 0  # copy-on-write copies made

    @property
    def steps(self) -> int:
        return len(self.in_use)

    @property
    def saving(self) -> float:
        """The paper's memory saving: blocks saved by sharing / blocks without sharing (over all steps)."""
        total = float(self.without.sum())
        return 1 - float(self.in_use.sum()) / total if total else 0.0

    @property
    def peak_in_use(self) -> int:
        return int(self.in_use.max()) if self.steps else 0

    @property
    def peak_without(self) -> int:
        return int(self.without.max()) if self.steps else 0


def blocks_with_and_without(prompt_len: int, output_len: int, n: int, block_size: int) -> tuple[int, int]:
    """The most blocks `n` samples of one request hold — sharing the prompt's full blocks, and as
    `n` unshared copies — when each has written all but its last token."""
    longest = blocks_needed(prompt_len + output_len - 1, block_size)
    shared = prompt_len // block_size
    return shared + n * (longest - shared), n * longest


def _run(sim: SimEngine, n: int, watch: Sequence[str] = ()) -> SharingRun:
    """Step `sim` to the end, counting blocks; keep the tables of the `watch`ed request at its peak."""
    copies = []
    sim.scheduler.copy_blocks = copies.extend
    in_use, without, tables, refs = [], [], [], {}
    alloc = sim.scheduler.allocator
    while not sim.done():
        sim.run_step(lambda e: e.step_in_order())
        in_use.append(alloc.num_used)
        without.append(sum(len(s.block_table) for s in sim.scheduler.running))
        if watch and in_use[-1] >= max(in_use):
            samples = [s for c in sim.seqs if c.request_id in watch for s in request_samples(c)]
            tables = [list(s.block_table) for s in samples]
            refs = {b: alloc.ref_count(b) for t in tables for b in t}
    return SharingRun(n, sim.scheduler.block_size, np.array(in_use), np.array(without), tables, refs, len(copies))


def sample_run(prompt_len: int, output_len: int, n: int, block_size: int = 16) -> SharingRun:
    """One request of `n` samples, alone in a pool it fits: its blocks at every step, and its
    samples' block tables when it holds the most."""
    need, _ = blocks_with_and_without(prompt_len, output_len, n, block_size)
    sim = SimEngine([Request("r", prompt_len, output_len, 0)], num_blocks=need, block_size=block_size,
                    max_batch_size=max(n, 1), max_batched_tokens=max(prompt_len, n, 16), samples={"r": n})
    return _run(sim, n, watch=("r",))


def workload_run(requests: Iterable[Any], n: int, *, block_size: int = 16, num_blocks: int = 2048,
                 max_batch_size: int = 64, max_batched_tokens: int = 2048) -> SharingRun:
    """A workload whose every request asks for `n` samples, all arriving at step 0, through one pool."""
    reqs = [Request(i, p, o, 0) for i, (p, o) in enumerate(lengths_of(requests))]
    sim = SimEngine(reqs, num_blocks=num_blocks, block_size=block_size, max_batch_size=max_batch_size,
                    max_batched_tokens=max_batched_tokens, samples={str(r.id): n for r in reqs})
    return _run(sim, n)
