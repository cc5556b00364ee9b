"""Every accepted request makes progress: the submission rule, and what happens if it ever fails.

The submission rule (`check_can_run`): a request is accepted only if its KV cache at its longest —
prompt plus every token but the last, or the model's context — fits the whole pool. Admission and
growth agree with it: the watermark is waived for a request that would run alone, so with nothing
running the head of the queue always starts, and a request running alone can always grow. So any
accepted request, once the requests ahead of it have finished, gets the pool to itself and finishes.

If that reasoning ever fails — a step with unfinished requests that schedules no token and changes
nothing — every later step would do exactly the same: the scheduler is deterministic and its state
did not move. `check_progress` notices that step and raises `EngineStalledError` with a diagnosis
(who is stuck, what it needs, what the budget offered) instead of letting the engine spin.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from inflight.engine.block_manager import blocks_needed

if TYPE_CHECKING:  # pragma: no cover
    from inflight.engine.scheduler import Scheduler
    from inflight.engine.scheduler_types import SchedulerOutput

__all__ = ["check_can_run", "check_samples_fit", "samples_blocks", "samples_room", "max_kv_tokens", "check_progress",
           "describe_stall", "EngineStalledError"]


class EngineStalledError(RuntimeError):
    """A step made no progress although requests are unfinished (the message says who and why)."""


def max_kv_tokens(num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> int:
    """The most tokens a request ever holds in the KV cache: its prompt, plus every generated token
    but the last (the last one is sampled, never computed), and never more than the context allows."""
    return max(num_prompt_tokens, min(num_prompt_tokens + max_tokens, max_model_len) - 1)


def check_can_run(num_prompt_tokens: int, max_tokens: int, max_model_len: int, num_blocks: int,
                  block_size: int, n: int = 1, max_batch_size: int | None = None) -> None:
    """Refuse (ValueError) a request that could never finish in a pool of `num_blocks` blocks, or
    whose `n` samples could not run side by side (`check_samples_fit`)."""
    most = max_kv_tokens(num_prompt_tokens, max_tokens, max_model_len)
    need = blocks_needed(most, block_size)
    if need > num_blocks:
        raise ValueError(f"this request can need {most} tokens of KV = {need} blocks, more than the whole pool "
                         f"({num_blocks} blocks of {block_size}): it could never finish. "
                         "Lower max_tokens or give the engine more blocks.")
    if n > 1:
        check_samples_fit(n, num_prompt_tokens, max_tokens, max_model_len, num_blocks, block_size, max_batch_size)


def samples_blocks(n: int, num_prompt_tokens: int, max_tokens: int, max_model_len: int, block_size: int) -> int:
    """The most blocks `n` samples of one prompt hold at once: the prompt's full blocks once (they
    share them), and each sample's own blocks from the prompt's last, partly filled one on."""
    shared = num_prompt_tokens // block_size
    own = blocks_needed(max_kv_tokens(num_prompt_tokens, max_tokens, max_model_len), block_size) - shared
    return shared + n * own


def samples_room(n: int, num_prompt_tokens: int, max_model_len: int, num_blocks: int, block_size: int) -> int:
    """The largest `max_tokens` that `n` samples of a prompt can all reach side by side in the pool
    (sharing the prompt's full blocks) and in the context: what `check_samples_fit` accepts, at most."""
    shared = num_prompt_tokens // block_size
    most = (shared + (num_blocks - shared) // n) * block_size  # tokens of KV one sample may hold
    return min(most + 1, max_model_len) - num_prompt_tokens


def check_samples_fit(n: int, num_prompt_tokens: int, max_tokens: int, max_model_len: int, num_blocks: int,
                      block_size: int, max_batch_size: int | None = None) -> None:
    """Refuse (ValueError) `n` samples of a request that cannot all run at once: more samples than
    batch slots (they decode side by side from their fork on), or more KV at their longest, sharing
    the prompt's full blocks, than the whole pool. (Each sample alone fitting would keep the engine
    live, but samples that cannot fit together would preempt each other all the way.)"""
    if max_batch_size is not None and n > max_batch_size:
        raise ValueError(f"n={n} samples, more than max_batch_size ({max_batch_size}): a request's samples run "
                         "side by side in one batch. Lower n or raise max_batch_size.")
    need = samples_blocks(n, num_prompt_tokens, max_tokens, max_model_len, block_size)
    if need > num_blocks:
        raise ValueError(f"n={n} samples of this request can hold {need} blocks at once (the prompt's "
                         f"{num_prompt_tokens // block_size} full blocks shared), more than the whole pool "
                         f"({num_blocks} blocks of {block_size}). Lower n or max_tokens, or give the engine more blocks.")


def check_progress(sched: "Scheduler", batch: "SchedulerOutput") -> None:
    """Raise `EngineStalledError` if this step left unfinished requests without scheduling a token
    or changing anything (no reap, admission, swap-in or preemption): the next step would be the same."""
    if batch.seqs or not sched.has_unfinished():
        return
    ev = sched.events
    if ev.reaped or ev.admitted or ev.swapped_in or ev.preempted or ev.forked:
        return  # the state moved: the next step is a different step
    raise EngineStalledError(describe_stall(sched))


def describe_stall(sched: "Scheduler") -> str:
    """Who is stuck and why, in the budget's own numbers."""
    b = sched.events.budget
    pending = len(sched.waiting) + len(sched.swapped) + sum(s.finish_reason is None for s in sched.running)
    lines = [f"engine stalled: {pending} unfinished request(s), but this step scheduled no token and changed "
             "nothing, so every later step would do the same."]
    if b is not None:
        free = sched.allocator.num_free
        lines.append(f"The budget: {b.blocks} block(s) = {free} free - {free - b.blocks - b.watermark} promised to "
                     f"running requests - {b.watermark} kept as watermark (usable too by a request that would run "
                     f"alone); {b.tokens} token(s), {b.slots} slot(s); {len(sched.running)} running.")
    head, where = (sched.swapped[0], "first swapped-out") if sched.swapped else \
        (sched.waiting[0], "first waiting") if sched.waiting else (None, "")
    if head is not None and b is not None:
        tokens, blocks = sched.admission_cost(head, b)
        lines.append(f"The {where} request {head.request_id!r} ({head.num_tokens} tokens, "
                     f"{head.num_computed_tokens} computed) would take {tokens} token(s) and {blocks} block(s) "
                     f"of a pool of {sched.allocator.num_blocks}; nothing behind it may go first.")
        lines.append(f"Abort it (engine.abort_request({head.request_id!r})) to let the others go on. Please report "
                     "this: the submission check (inflight.engine.liveness) should have refused it.")
    for s in sched.running:
        if s.finish_reason is None:
            lines.append(f"running {s.request_id!r}: {s.num_computed_tokens}/{s.num_tokens} tokens computed, "
                         f"{len(s.block_table)} block(s), {s.num_scheduled_tokens} scheduled")
    return "\n".join(lines)
