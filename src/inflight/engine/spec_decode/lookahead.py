"""The scheduler's side of speculative decoding: lookahead slots before the pass, verified tokens after it.

`plan_lookahead` (called by `Scheduler.budget` once every running request's own tokens are planned)
gives each decoding request's proposals token slots and KV blocks from what the step has left —
vLLM's `num_lookahead_tokens` — so speculation never takes a token or a block from anyone and never
causes a preemption. `append_verified` (called by `Scheduler.update`) appends what the rejection
sampler kept, advances the computed count past the accepted proposals only, and gives back the
blocks of the rejected ones.
"""
from __future__ import annotations

from typing import Any, Callable

from inflight.engine.block_manager import blocks_needed
from inflight.engine.logprobs import record_sampled
from inflight.engine.parallel_sampling import write_cost
from inflight.engine.prefix_cache import cache_full_blocks
from inflight.engine.sequence import Sequence, append_token

__all__ = ["plan_lookahead", "take_verified", "append_verified", "keep_computed_blocks"]


def plan_lookahead(running: list[Sequence], allocator: Any, watermark_blocks: int, tokens: int) -> None:
    """Trim each decoding request's `spec_token_ids` to the leftover `tokens` and free blocks (above
    the watermark, after every planned token's blocks), in running order, and schedule them."""
    spec = [s for s in running if s.spec_token_ids]
    if not spec:
        return
    bs = allocator.block_size
    free = allocator.num_free - watermark_blocks - sum(max(0, write_cost(allocator, s))
                                                       for s in running if s.num_scheduled_tokens)
    for s in spec:
        if s.num_scheduled_tokens != 1 or s.num_tokens - s.num_computed_tokens != 1:
            s.spec_token_ids = []  # (only a decode verifies proposals)
            continue
        c = s.num_computed_tokens
        base = max(blocks_needed(c + 1, bs), len(s.block_table))  # what its own token already takes
        k = min(len(s.spec_token_ids), max(tokens, 0))
        while k and blocks_needed(c + 1 + k, bs) - base > free:
            k -= 1
        free -= max(0, blocks_needed(c + 1 + k, bs) - base)
        tokens -= k
        s.spec_token_ids = s.spec_token_ids[:k]
        s.num_scheduled_tokens = 1 + k


def take_verified(sched: Any, s: Sequence, spec: list[int], got: Any, now: float, rows: list | None,
                  stop_check: Callable[[Sequence, float], object] | None) -> bool:
    """After the pass, for `s`, which verified its proposals `spec`: if the rejection sampler kept a
    list of tokens, log the draft and append them (`append_verified`), True. Otherwise (`got` is -1,
    its row failed; or `s` had already ended) only its lookahead blocks go back, False: the
    scheduler then treats `got` as an ordinary draw."""
    if isinstance(got, list) and s.finish_reason is None:
        sched.events.drafts.append((len(spec), len(got) - 1))
        append_verified(sched, s, got, now, rows, stop_check)
        return True
    keep_computed_blocks(sched.allocator, s)
    return False


def append_verified(sched: Any, s: Sequence, got: list[int], now: float, rows: list | None,
                    stop_check: Callable[[Sequence, float], object] | None) -> None:
    """Append the tokens a verifying step kept for `s` one by one, until one ends it (`stop_check`,
    the stop strings, runs after each: it ends where one-token steps would); then `s`'s computed
    tokens are its last real token and the accepted proposals — not the new token — and the blocks
    past them go back to the pool."""
    cfg = sched.config
    for j, token in enumerate(got):
        append_token(s, token, now, cfg.eos_token_ids, cfg.max_model_len)
        record_sampled(s, rows[j] if rows is not None else None)
        if s.finish_reason is None and stop_check is not None and j < len(got) - 1:
            stop_check(s, now)
        if s.finish_reason is not None:
            break
    s.num_computed_tokens = s.num_tokens - 1
    keep_computed_blocks(sched.allocator, s)
    if cfg.enable_prefix_caching:
        cache_full_blocks(sched.allocator, s)


def keep_computed_blocks(allocator: Any, s: Sequence) -> None:
    """Give back the blocks past `s`'s computed tokens (the lookahead of rejected proposals)."""
    keep = blocks_needed(s.num_computed_tokens, allocator.block_size)
    if len(s.block_table) > keep:
        allocator.free(s.block_table[keep:])
        del s.block_table[keep:]
