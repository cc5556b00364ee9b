"""Step 2 of an iteration: what admission may hand out in this step.

`Scheduler.budget` first *plans* the running requests' tokens (decodes first, one token each, then
the next chunk of any prompt still being prefilled), then asks `compute_budget` what is left:

* blocks — the free blocks, minus the blocks the running requests' planned tokens will need beyond
  the blocks they already hold (a decode needs a new block only when its last block is full),
  minus a safety *watermark* kept free so that running requests can grow;
* tokens — the step's token budget (`max_batched_tokens`) minus the tokens already planned;
* slots — `max_batch_size` minus the requests already running.

Because the running requests' next blocks are reserved *before* admission spends the budget,
admission can never take them: preemption then only fires when the running requests alone need
more than the pool has — whichever of admit and preempt runs first (they commute). vLLM's v1
scheduler (`Scheduler.schedule` in `vllm/v1/core/sched/scheduler.py`) gets the same guarantee by
order instead: it allocates for the running requests first, preempting as needed, and admits
waiting requests only if nobody was preempted in that step.

Chapter 6's exercise asks for `compute_budget`; the engine calls this very function.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from inflight.engine.block_manager import blocks_needed

__all__ = ["Budget", "PlannedRequest", "BudgetInputs", "compute_budget"]


@dataclass
class Budget:
    """What admission may hand out in this step (admission spends it)."""

    blocks: int    # free blocks - promised to running requests - watermark (negative: they need more than is free)
    tokens: int    # tokens left in this step's forward pass
    slots: int     # requests that may still join the batch
    # the blocks kept back in `blocks`: a request that would run alone may use them (the scheduler
    # fills this in; `compute_budget` leaves it 0, and two budgets compare by the three numbers above)
    watermark: int = field(default=0, compare=False)


@dataclass(frozen=True)
class PlannedRequest:
    """A running request as the budget sees it, after this step's plan."""

    num_computed_tokens: int   # tokens whose keys and values are already in the cache
    num_scheduled_tokens: int  # tokens this step will compute for it (1 for a decode, a chunk for a prefill)
    num_blocks: int            # blocks it holds now


@dataclass(frozen=True)
class BudgetInputs:
    """Everything `compute_budget` reads: the running requests' plan, the pool and the limits."""

    running: tuple[PlannedRequest, ...]
    num_free_blocks: int
    block_size: int
    watermark_blocks: int
    max_batched_tokens: int
    max_batch_size: int


def compute_budget(state: BudgetInputs) -> Budget:
    """Blocks, tokens and slots left for admission once the running requests' planned tokens are reserved."""
    promised = sum(max(0, blocks_needed(r.num_computed_tokens + r.num_scheduled_tokens, state.block_size)
                       - r.num_blocks) for r in state.running)
    return Budget(blocks=state.num_free_blocks - promised - state.watermark_blocks,
                  tokens=state.max_batched_tokens - sum(r.num_scheduled_tokens for r in state.running),
                  slots=state.max_batch_size - len(state.running))
