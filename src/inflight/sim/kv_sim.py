"""How much of the reserved KV memory holds real tokens, step by step, on a workload.

Two layouts serve the same requests from the same pool of token slots:

* contiguous — each running request reserves `max_len` slots up front (its largest possible
  length), the way a server without paging must;
* paged — each request holds `ceil(tokens / block_size)` blocks from a `BlockAllocator`, one more
  whenever its last block fills; when the pool runs dry the latest arrival is preempted
  (its blocks freed, recomputed later): the engine's rule, vLLM's under its priority policy.

Both run the engine's own scheduler (`inflight.sim.engine_sim.SimEngine`, no model): a request
admitted at step t has its whole prompt's KV written in that step, one more token's KV every step
after, and its blocks go back at the reap after its last token. Utilization = Σ_steps tokens in
the cache / Σ_steps reserved slots. The paged *ceiling* is what paging cannot avoid: each
request's unfilled tail of its last block, Σ ceil(tokens_i / bs) · bs.

Workloads come from `inflight.sim.workloads` (chapter 5 uses `short_chat` and `sharegpt_like`
fitted to a 2048-token context with `clip_to_context`); `lengths_of` also takes plain pairs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from inflight.engine.block_manager import blocks_needed
from inflight.sim.engine_sim import SimEngine
from inflight.sim.workloads import Request

__all__ = ["KVTimeline", "simulate_kv", "kv_engine", "kv_steps", "lengths_of", "utilization_table", "tail_waste_estimate",
           "requests_that_fit"]


def lengths_of(requests: Iterable[Any]) -> list[tuple[int, int]]:
    """(prompt_len, output_len) pairs from `Request`s (anything with those attributes) or pairs."""
    out = []
    for r in requests:
        p, o = (r.prompt_len, r.output_len) if hasattr(r, "prompt_len") else r
        if p < 0 or o < 1:
            raise ValueError(f"need prompt_len >= 0 and output_len >= 1, got ({p}, {o})")
        out.append((int(p), int(o)))
    return out


@dataclass
class KVTimeline:
    """Per-step record of one run: tokens held, slots reserved, the paging ceiling, requests running."""

    layout: str
    block_size: int  # for "contiguous": the reservation per request (max_len)
    pool_slots: int
    tokens: np.ndarray
    reserved: np.ndarray
    ceiling_reserved: np.ndarray
    running: np.ndarray
    preemptions: int = 0
    finished: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return len(self.tokens)

    @property
    def utilization(self) -> float:
        """Fraction of reserved slots (summed over steps) that held a real token."""
        return float(self.tokens.sum() / max(1, self.reserved.sum()))

    @property
    def ceiling(self) -> float:
        """Utilization if the only waste were each request's unfilled last block."""
        return float(self.tokens.sum() / max(1, self.ceiling_reserved.sum()))

    @property
    def mean_running(self) -> float:
        """Requests held in memory at once, averaged over the run."""
        return float(self.running.mean()) if self.steps else 0.0

    def summary(self) -> dict:
        return {"layout": self.layout, "block_size": self.block_size, "pool_slots": self.pool_slots,
                "utilization": round(self.utilization, 4), "ceiling": round(self.ceiling, 4),
                "mean_running": round(self.mean_running, 2), "steps": self.steps,
                "preemptions": self.preemptions}


def kv_engine(requests: Iterable[Any], layout: str = "paged", *, block_size: int = 16,
              max_len: int | None = None, pool_slots: int | None = None,
              max_batch_size: int | None = None, watermark: float = 0.01) -> tuple[SimEngine, int]:
    """The engine `simulate_kv` runs (its arguments), before its first step, and the pool's slots
    (`pool_slots`, or its default). Its blocks are `sim.scheduler.block_size` slots: `block_size`
    for the paged layout, `max_len` for the contiguous one."""
    reqs = lengths_of(requests)
    if not reqs:
        raise ValueError("no requests")
    if layout not in ("paged", "contiguous"):
        raise ValueError(f"layout must be 'paged' or 'contiguous', got {layout!r}")
    if not 0 <= watermark < 1:
        raise ValueError(f"watermark must be in [0, 1), got {watermark}")
    longest = max(p + o for p, o in reqs)
    max_len = max_len or (max(p for p, _ in reqs) + max(o for _, o in reqs))
    if max_len < longest:
        raise ValueError(f"max_len {max_len} is shorter than the longest request ({longest} tokens)")
    pool_slots = pool_slots or 32 * max_len
    unit = block_size if layout == "paged" else max_len  # contiguous: one "block" = one max-length reservation
    num_blocks = pool_slots // unit
    if num_blocks * unit < longest or num_blocks < 1:
        raise ValueError(f"a pool of {pool_slots} slots ({num_blocks} blocks of {unit}) cannot hold "
                         f"the longest request ({longest} tokens)")
    batch = max_batch_size or len(reqs)
    sim = SimEngine([Request(str(i), p, o) for i, (p, o) in enumerate(reqs)], num_blocks=num_blocks,
                    block_size=unit, max_batch_size=batch, max_batched_tokens=max(batch, 10**9),
                    enable_chunked_prefill=False,
                    watermark_blocks=int(watermark * num_blocks) if layout == "paged" else 0)
    return sim, pool_slots


def kv_steps(sim: SimEngine) -> Iterator[SimEngine]:
    """Step `sim` (from `kv_engine`) in the engine's order until every request is done, yielding it
    after each step: its scheduler's running requests, their block tables and computed tokens are
    what the pool holds then."""
    requests = [r for _, r in sim.pending]
    guard = 100 * (max((r.prompt_len + r.output_len for r in requests), default=0) + len(requests))
    while not sim.done():
        sim.run_step(SimEngine.step_in_order)
        yield sim
        if sim.step_no > guard:
            raise RuntimeError("the KV simulation made no progress")  # a guard: the engine's rules never loop


def simulate_kv(requests: Iterable[Any], layout: str = "paged", *, block_size: int = 16,
                max_len: int | None = None, pool_slots: int | None = None,
                max_batch_size: int | None = None, watermark: float = 0.01) -> KVTimeline:
    """Run `requests` (all waiting at step 0, FCFS) through a KV pool of `pool_slots` token slots.

    `layout`: "contiguous" (reserve `max_len` per request) or "paged" (blocks of `block_size`).
    `max_len` defaults to the workload's longest prompt + longest output (what a server must
    allow); `pool_slots` defaults to 32 contiguous reservations. `watermark`: the fraction of
    paged blocks admission leaves free for running requests to grow into (vLLM's 1%).
    The steps are the engine's own (`SimEngine`: reap, budget, admit, preempt, decode), with whole
    prompts prefilled at admission; each step records the tokens whose KV is in the cache."""
    sim, pool_slots = kv_engine(requests, layout, block_size=block_size, max_len=max_len, pool_slots=pool_slots,
                                max_batch_size=max_batch_size, watermark=watermark)
    unit = sim.scheduler.block_size
    tokens_t, reserved_t, ceiling_t, running_t = [], [], [], []
    preemptions = 0
    for sim in kv_steps(sim):
        preemptions += sim.log[-1]["preempted"]
        running = sim.scheduler.running  # (finished ones hold their blocks until the next reap)
        tokens_t.append(sum(s.num_computed_tokens for s in running))
        reserved_t.append(sim.scheduler.allocator.num_used * unit)
        ceiling_t.append(sum(blocks_needed(s.num_computed_tokens, unit) * unit for s in running))
        running_t.append(len(running))
    finished = sum(s.finish_reason is not None for s in sim.seqs)
    return KVTimeline(layout, unit, pool_slots, np.array(tokens_t), np.array(reserved_t),
                      np.array(ceiling_t), np.array(running_t), preemptions, finished)


def utilization_table(requests: Sequence[Any], block_sizes: Sequence[int] = (8, 16, 32), *,
                      max_len: int | None = None, pool_slots: int | None = None) -> dict[str, KVTimeline]:
    """The same workload and pool through the contiguous layout and paged layouts of each block size."""
    runs = {"contiguous": simulate_kv(requests, "contiguous", max_len=max_len, pool_slots=pool_slots)}
    for bs in block_sizes:
        runs[f"paged-{bs}"] = simulate_kv(requests, "paged", block_size=bs, max_len=max_len, pool_slots=pool_slots)
    return runs


def tail_waste_estimate(requests: Sequence[Any], block_size: int) -> float:
    """Rule of thumb for the paged ceiling: a request of L tokens wastes about (block_size - 1) / 2
    slots, so utilization ≈ E[L] / (E[L] + (block_size - 1) / 2), with L its length while it runs."""
    pairs = lengths_of(requests)
    # average tokens held over a request's life (prompt + growing output), weighted by how long it runs
    held = sum(o * p + o * (o + 1) / 2 for p, o in pairs) / sum(o for _, o in pairs)
    return held / (held + (block_size - 1) / 2)


def requests_that_fit(budget_bytes: int, bytes_per_token: int, *, max_len: int, typical_len: float,
                      block_size: int = 16) -> dict[str, int]:
    """How many requests a KV budget holds at once: contiguous (each reserves `max_len` tokens) vs
    paged (each holds ceil(typical_len / block_size) blocks)."""
    if budget_bytes < 0 or bytes_per_token < 1:
        raise ValueError("budget_bytes must be >= 0 and bytes_per_token >= 1")
    slots = budget_bytes // bytes_per_token
    per_request = math.ceil(typical_len / block_size) * block_size
    return {"slots": int(slots), "contiguous": int(slots // max_len),
            "paged": int((slots // block_size) // (per_request // block_size))}
