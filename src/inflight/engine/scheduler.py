"""The scheduler behind `LLMEngine`: one iteration = reap → budget → admit → preempt → decode.

Each step is its own short method so the book can show it and an exercise can reorder them:

1. `reap`    — requests that finished in the previous step leave; their KV blocks go back to the pool.
2. `budget`  — what this step may hand out: free blocks minus blocks already promised to running
               requests' next tokens minus a watermark, the token budget, the free batch slots.
3. `admit`   — swapped-out requests come back first, then waiting ones in (priority, arrival)
               order, while slots, tokens and blocks allow; prompts may be prefilled in chunks.
               With prefix caching, a request starts from the longest cached prefix of its
               tokens (shared blocks) and only the rest is allocated and computed. The watermark
               keeps blocks free for running requests to grow into; when nothing runs it keeps
               them for nobody, so the head of the queue may use the whole pool. That is what
               makes the submission rule (`inflight.engine.liveness`) enough: every request that
               fits the pool can start, and so every accepted request makes progress.
4. `preempt` — give every running request the blocks its next tokens need (a sample first gets its
               own copy of a block it shares: copy-on-write, `inflight.engine.parallel_sampling`);
               when the pool is dry, evict the lowest-priority (latest-arrived) running request by
               recompute or swap.
5. decode    — `batch()` describes the ragged batch (prefill chunks + decode tokens) for the model,
               and `update()` advances every request by what the forward pass computed.

The scheduler knows nothing about tensors: swapping goes through a `swapper` (two callbacks) and
copy-on-write through `copy_blocks`, so the same code drives the real engine and the simulated KV
pool of the chapter's exercise.
vLLM's counterpart is `vllm/v1/core/sched/scheduler.py` (`Scheduler.schedule`).
"""
from __future__ import annotations

import bisect
from typing import Callable, Iterable, Mapping

from inflight.engine.block_manager import BlockAllocator, blocks_needed
from inflight.engine.budget import Budget, BudgetInputs, PlannedRequest, compute_budget
from inflight.engine.invariants import check_scheduler
from inflight.engine.liveness import check_can_run
from inflight.engine.logprobs import StepLogprobs, record_prompt, record_sampled, wants_prompt_logprobs
from inflight.engine.parallel_sampling import draws, fork, grow, request_samples, shares_write_block, write_cost
from inflight.engine.prefix_cache import cache_full_blocks, cached_prefix
from inflight.engine.priority import choose_victim
from inflight.engine.scheduler_types import NoCopy, SchedulerConfig, SchedulerOutput, StepEvents, Swapper
from inflight.engine.sequence import Sequence, SequenceStatus, append_token, fail
from inflight.engine.spec_decode.lookahead import keep_computed_blocks, plan_lookahead, take_verified

__all__ = ["SchedulerConfig", "Budget", "SchedulerOutput", "StepEvents", "Scheduler", "Swapper", "STEP_ORDER"]

#: The order of one iteration (the chapter's exercise asks for exactly this).
STEP_ORDER = ("reap", "budget", "admit", "preempt", "decode")


class Scheduler:
    """Queues (waiting / running / swapped) over a `BlockAllocator`, advanced one iteration at a time."""

    def __init__(self, allocator: BlockAllocator, config: SchedulerConfig,
                 cpu_allocator: BlockAllocator | None = None, swapper: Swapper | None = None,
                 copy_blocks: Callable[[list[tuple[int, int]]], None] | None = None):
        """`copy_blocks(pairs)` copies the keys and values of device blocks `src` into `dst` for each
        `(src, dst)`: copy-on-write of a block the samples of a request share (None: nothing to copy,
        as in a simulated pool)."""
        if config.preemption == "swap" and cpu_allocator is None:
            raise ValueError("preemption='swap' needs a cpu_allocator (the CPU pool's blocks)")
        if config.enable_prefix_caching and not hasattr(allocator, "find_cached_prefix"):
            raise ValueError("enable_prefix_caching needs a PrefixCachingBlockAllocator (inflight.engine.prefix_cache)")
        if config.watermark_blocks >= allocator.num_blocks:
            raise ValueError(f"watermark_blocks ({config.watermark_blocks}) must be less than the pool's "
                             f"{allocator.num_blocks} blocks")
        self.allocator = allocator
        self.cpu_allocator = cpu_allocator
        self.swapper = swapper or NoCopy()
        self.copy_blocks = copy_blocks or (lambda pairs: None)
        self.config = config
        self.block_size = allocator.block_size
        self.waiting: list[Sequence] = []   # sorted by (priority, arrival, submission)
        self.running: list[Sequence] = []   # admission order
        self.swapped: list[Sequence] = []   # sorted like waiting
        self.events = StepEvents()
        self.num_preemptions = 0

    # -- queues ----------------------------------------------------------------------------------
    def check_can_run(self, num_prompt_tokens: int, max_tokens: int, n: int = 1) -> None:
        """Refuse (ValueError) a request that could never finish in this pool: the submission rule
        (`inflight.engine.liveness.check_can_run`), which admission and growth agree with; and `n`
        samples that could not run side by side (`check_samples_fit`)."""
        cfg = self.config
        check_can_run(num_prompt_tokens, max_tokens, cfg.max_model_len, self.allocator.num_blocks, self.block_size,
                      n, cfg.max_batch_size)

    def add(self, seq: Sequence) -> None:
        """Queue a new request (its place follows its priority, then its arrival)."""
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=_key)

    def has_unfinished(self) -> bool:
        """Whether a request still needs work (finished ones awaiting their reap don't count)."""
        return bool(self.waiting or self.swapped) or any(s.finish_reason is None for s in self.running)

    def abort(self, seq: Sequence) -> None:
        """Drop a request wherever it is and give its blocks back."""
        queue = {SequenceStatus.WAITING: self.waiting, SequenceStatus.RUNNING: self.running,
                 SequenceStatus.SWAPPED: self.swapped}.get(seq.status)
        if queue is not None:
            queue.remove(seq)
        self._release(seq)
        seq.status = SequenceStatus.FINISHED

    def begin_step(self) -> StepEvents:
        """Start a new iteration's log."""
        self.events = StepEvents()
        return self.events

    # -- 1. reap ---------------------------------------------------------------------------------
    def reap(self) -> list[Sequence]:
        """Remove the requests whose last token ended them (EOS, stop token, max_tokens) and free their blocks."""
        done = [s for s in self.running if s.finish_reason is not None]
        if done:
            self.running = [s for s in self.running if s.finish_reason is None]
            for s in done:
                self._release(s)
                s.num_scheduled_tokens = 0
                s.status = SequenceStatus.FINISHED
        self.events.reaped.extend(done)
        return done

    # -- 2. budget -------------------------------------------------------------------------------
    def budget(self, compute: Callable[[BudgetInputs], Budget] = compute_budget) -> Budget:
        """Plan the running requests' tokens (decodes first, then prefill chunks), then `compute` what
        is left of the pool (after their blocks are reserved), the token budget and the slots: what
        admission may use (`inflight.engine.budget`; chapter 6's exercise swaps in its own `compute`)."""
        cfg = self.config
        tokens = cfg.max_batched_tokens
        for s in self.running:  # decodes first: one token each, so a long prefill never starves them
            if s.num_tokens - s.num_computed_tokens == 1:
                s.num_scheduled_tokens = 1
                tokens -= 1
        for s in self.running:  # then the rest of any prompt being prefilled in chunks
            remaining = s.num_tokens - s.num_computed_tokens
            if remaining > 1:
                q = max(min(remaining, tokens) if cfg.enable_chunked_prefill else remaining, 0)
                s.num_scheduled_tokens = q
                tokens -= q
        plan_lookahead(self.running, alloc := self.allocator, cfg.watermark_blocks, tokens)  # (speculation: leftovers)
        # a shared block a sample writes into first is not one it can write: its copy is a new block
        plan = tuple(PlannedRequest(s.num_computed_tokens, s.num_scheduled_tokens, len(s.block_table)
                                    - (s.group is not None and s.num_scheduled_tokens > 0
                                       and shares_write_block(alloc, s)))
                     for s in self.running)
        b = compute(BudgetInputs(plan, alloc.num_free, self.block_size, cfg.watermark_blocks,
                                 cfg.max_batched_tokens, cfg.max_batch_size))
        reserved = sum(draws(s) - 1 for s in self.running if s.group is not None)  # slots of samples to fork
        b = Budget(b.blocks, b.tokens, b.slots - reserved, cfg.watermark_blocks)  # a copy: a learner's stays theirs
        self.events.budget = b
        return b

    # -- 3. admit --------------------------------------------------------------------------------
    def admit(self, budget: Budget) -> list[Sequence]:
        """Bring back swapped requests, then admit waiting ones in order, while `budget` allows
        (admission spends it).

        Strict order (no skipping ahead): if the head of the queue does not fit, nobody behind it
        is admitted this step — head-of-line blocking, the price of fairness. A request that would
        run alone may use the watermark's blocks too (there is no running request to keep them for)."""
        b = budget
        while self.swapped and b.slots > 0 and b.tokens > 0:
            s = self.swapped[0]
            q, need = self.admission_cost(s, b)
            if q == 0 or b.slots < draws(s) or not self._fits(need, b) or not self._can_allocate(need):
                break
            self.swapped.pop(0)
            self._swap_in(s, need)
            self._join(s, q, need, b)
            self.events.swapped_in.append(s)
        if self.swapped:  # swapped requests go first: no new admissions until they are all back
            return []
        admitted: list[Sequence] = []
        while self.waiting and b.slots > 0 and b.tokens > 0:
            s = self.waiting[0]
            q, need, cost, hit, cached = self._prompt_cost(s, b)
            if q == 0 or b.slots < draws(s) or not self._fits(cost, b) or not self._can_allocate(cost):
                break
            self.waiting.pop(0)
            self.allocate_prompt(s, need, hit, cached)
            self._join(s, q, cost, b)
            admitted.append(s)
        self.events.admitted.extend(admitted)
        return admitted

    def admission_cost(self, s: Sequence, b: Budget) -> tuple[int, int]:
        """What admitting `s` (a swapped or waiting request) would take now: (tokens, blocks)."""
        if s.status is SequenceStatus.SWAPPED:  # its KV comes back from the CPU pool
            q = self._chunk(s, b)
            return q, blocks_needed(s.num_computed_tokens + q, self.block_size)
        q, _, cost, _, _ = self._prompt_cost(s, b)
        return q, cost

    def _prompt_cost(self, s: Sequence, b: Budget) -> tuple[int, int, int, list[int], int]:
        """A waiting request's first chunk: its tokens q, the new blocks it needs, what that costs
        the pool, and the prefix-cache hit it starts from (blocks, tokens)."""
        # (prompt log-probabilities need the logits of every prompt token: no cached prefix until they are in)
        lookup = self.config.enable_prefix_caching and not wants_prompt_logprobs(s)
        hit, cached = cached_prefix(self.allocator, s) if lookup else ([], 0)
        q = self._chunk(s, b, cached)
        need = blocks_needed(cached + q, self.block_size) - len(hit)
        # reviving a cached block nobody holds uses up a free block, just like a new one
        return q, need, need + (self.allocator.blocks_to_revive(hit) if hit else 0), hit, cached

    def allocate_prompt(self, s: Sequence, need: int, hit: list[int] = (), cached: int = 0) -> None:
        """Give an admitted request the blocks for its first chunk: the `hit` blocks of the prefix
        cache (shared, covering `cached` tokens, which need no computing) and `need` new ones."""
        if self.config.enable_prefix_caching:
            self.allocator.acquire(hit)  # before allocate(), which could otherwise evict the hit
            self.allocator.record_lookup(s.num_tokens, cached)
            s.block_table, s.num_computed_tokens = list(hit), cached
            s.num_cached_blocks, s.num_cached_tokens = len(hit), cached
        s.block_table.extend(self.allocator.allocate(need))

    def _chunk(self, s: Sequence, b: Budget, cached: int = 0) -> int:
        """Tokens `s` would compute this step (after `cached` tokens from the prefix cache): all that
        remain, or a chunk that fits the token budget."""
        remaining = s.num_tokens - max(s.num_computed_tokens, cached)
        if self.config.enable_chunked_prefill:
            return min(remaining, b.tokens)
        if remaining <= b.tokens or b.tokens == self.config.max_batched_tokens:
            return remaining  # (an over-long prompt may run alone in an otherwise empty step)
        return 0

    def _fits(self, need: int, b: Budget) -> bool:
        """Whether `need` blocks fit the budget: within it, or — for a request that would run alone,
        which nobody's growth can preempt — within it plus the watermark."""
        return need <= b.blocks or (not self.running and need <= b.blocks + b.watermark)

    def _can_allocate(self, need: int) -> bool:
        if self.allocator.can_allocate(need):
            return True
        # the budget said yes but the pool says no: only a stale or skipped budget gets here
        self.events.overcommitted_blocks += need - self.allocator.num_free
        return False

    def _join(self, s: Sequence, q: int, need: int, b: Budget) -> None:
        s.status = SequenceStatus.RUNNING
        s.num_scheduled_tokens = q
        self.running.append(s)
        b.blocks -= need
        b.tokens -= q
        b.slots -= draws(s)  # a carrier holds the slots of the samples it forks into

    # -- 4. preempt ------------------------------------------------------------------------------
    def preempt(self) -> list[Sequence]:
        """Allocate the blocks each running request's scheduled tokens need; when the pool runs dry,
        preempt the lowest-priority (latest-arrived) running request until the rest fit."""
        alloc = self.allocator
        needs = [(s, write_cost(alloc, s) if s.group is not None else  # (a sample may need a copy too)
                  blocks_needed(s.num_computed_tokens + s.num_scheduled_tokens, self.block_size) - len(s.block_table))
                 for s in self.running if s.num_scheduled_tokens]
        needs = [(s, n) for s, n in needs if n > 0]
        victims: list[Sequence] = []
        if sum(n for _, n in needs) <= alloc.num_free:  # the common case: everything fits
            for s, _ in needs:
                grow(alloc, s, self.copy_blocks)
            return victims
        for s, _ in sorted(needs, key=lambda sn: _key(sn[0])):  # most important first
            # (asked again each time: a victim that shared s's block may have left s its only holder)
            while s.status is SequenceStatus.RUNNING and write_cost(alloc, s) > alloc.num_free:
                victim = self.choose_victim()
                self._preempt(victim)
                victims.append(victim)
            if s.status is SequenceStatus.RUNNING:  # (it may itself have been the victim)
                grow(alloc, s, self.copy_blocks)
        return victims

    def choose_victim(self) -> Sequence:
        """The running request to preempt: chapter 8's `choose_victim` over (request, effective
        priority, arrival), listed in submission order so a full tie takes the last submitted."""
        ordered = sorted(self.running, key=lambda s: s.seq_no)
        return choose_victim([(s, s.sort_key[0], s.sort_key[1]) for s in ordered])

    def _preempt(self, s: Sequence) -> None:
        self.running.remove(s)
        s.num_scheduled_tokens = 0
        s.spec_token_ids = []
        s.num_preemptions += 1
        self.num_preemptions += 1
        self.events.preempted.append(s)
        keep = blocks_needed(s.num_computed_tokens, self.block_size)  # blocks holding computed KV
        cpu = self.cpu_allocator
        swap = self.config.preemption == "swap" and keep > 0 and cpu is not None and cpu.can_allocate(keep)
        if swap:
            cpu_blocks = cpu.allocate(keep)
            self.swapper.swap_out(list(zip(s.block_table[:keep], cpu_blocks)))
        self.allocator.free(s.block_table)
        s.block_table, s.num_cached_blocks = [], 0
        if swap:
            s.cpu_block_table = cpu_blocks
            s.status = SequenceStatus.SWAPPED
            self.events.blocks_swapped_out += keep
            bisect.insort(self.swapped, s, key=_key)
        else:  # recompute (or the CPU pool is full): forget the KV, prefill everything again later
            s.num_computed_tokens = 0
            s.status = SequenceStatus.WAITING
            bisect.insort(self.waiting, s, key=_key)  # its early arrival puts it at the front

    def _swap_in(self, s: Sequence, need: int) -> None:
        blocks = self.allocator.allocate(need)
        self.swapper.swap_in(list(zip(blocks, s.cpu_block_table)))
        self.cpu_allocator.free(s.cpu_block_table)  # type: ignore[union-attr]
        self.events.blocks_swapped_in += len(s.cpu_block_table)
        s.cpu_block_table = []
        s.block_table = blocks

    # -- 5. decode: the batch description and the bookkeeping after the forward pass -------------
    def batch(self) -> SchedulerOutput:
        """The ragged batch for the model: every running request with tokens scheduled and KV slots for them."""
        seqs, prefill, decode = [], 0, 0
        for s in self.running:
            # (a stale plan can't overrun; proposals, if any, follow the last token)
            q = min(s.num_scheduled_tokens, s.num_tokens + len(s.spec_token_ids) - s.num_computed_tokens)
            s.num_scheduled_tokens = max(q, 0)
            if q <= 0:
                continue
            if len(s.block_table) * self.block_size < s.num_computed_tokens + q:  # no KV slot: can't run now
                self.events.tokens_without_kv += q
                continue
            seqs.append(s)
            if s.num_computed_tokens == s.num_tokens - 1:  # a decode (with its proposals: 1 + k tokens)
                decode += q
            else:
                prefill += q
        self.events.free_blocks_at_decode = self.allocator.num_free
        return SchedulerOutput(seqs, prefill, decode)

    def update(self, out: SchedulerOutput, sampled: Iterable[int | list[int]], now: float, errors: Mapping[int, str]
               | None = None, logprobs: StepLogprobs | None = None, stop_check: Callable | None = None) -> list[Sequence]:
        """After the forward pass: count the computed tokens and append one sampled token to each
        request whose prefill is complete (`sampled`: one id per draw, in batch order — `n` for a
        carrier whose prompt is now in, which forks into its samples here), with its log-probability
        if asked (`logprobs`, `inflight.engine.logprobs`). `errors[k]` says why the k-th draw gave no
        token: that sample ends with finish_reason "error" and the message, the others go on (so
        does a stop check that fails). Speculation: a list of the tokens kept (`spec_decode.lookahead`)."""
        it = iter(sampled)
        touched = []
        k = -1
        for s, first, rows in logprobs.prompt if logprobs is not None else ():
            record_prompt(s, first, rows)
        for s in out.seqs:  # (the plan, num_scheduled_tokens, stays until the next budget replaces it)
            spec, s.spec_token_ids = s.spec_token_ids, []
            s.num_computed_tokens += s.num_scheduled_tokens - len(spec)  # (proposals count once accepted)
            if self.config.enable_prefix_caching and not spec:
                cache_full_blocks(self.allocator, s)
            if s.num_computed_tokens < s.num_tokens:
                continue  # a prefill chunk: nothing to sample yet
            tokens = [next(it)] if s.group is None else [next(it) for _ in range(draws(s))]
            if spec and take_verified(self, s, spec, tokens[0], now, logprobs.spec.get(k + 1) if logprobs else None,
                                      stop_check):
                k += 1
                touched.append(s)
                continue
            if s.finish_reason is not None:  # decoding a request that had already finished: wasted work
                self.events.wasted_tokens += len(tokens)
                k += len(tokens)
                continue
            if len(tokens) > 1:  # the prompt is in: its request's other samples join, sharing its blocks
                self.events.forked.extend(fork(s, self.allocator, self.running))
            samples = request_samples(s) if len(tokens) > 1 else [s]
            for sample, token in zip(samples, tokens):
                k += 1
                if errors and k in errors:
                    fail(sample, f"sampling failed: {errors[k]}", now)
                else:
                    append_token(sample, token, now, self.config.eos_token_ids, self.config.max_model_len)
                    record_sampled(sample, logprobs.sampled.get(k) if logprobs is not None else None)
                touched.append(sample)
        return touched

    def release_unused(self, out: SchedulerOutput) -> None:
        """After a forward pass that raised: give back the blocks allocated for tokens that were not
        computed, so the engine stands as if this batch had been planned but not run (the next step
        plans again; nothing leaks)."""
        for s in out.seqs:
            keep_computed_blocks(self.allocator, s)

    def num_draws(self, out: SchedulerOutput) -> int:
        """Tokens the batch's sampling draws: one per request whose prefill completes, `n` for a
        carrier about to fork (what `update` then takes)."""
        return sum(draws(s) for s in out.seqs if s.num_computed_tokens + s.num_scheduled_tokens >= s.num_tokens)

    def check_invariants(self) -> None:
        """Raise AssertionError if the books don't balance (see `inflight.engine.invariants`)."""
        check_scheduler(self)

    def _release(self, s: Sequence) -> None:
        if s.block_table:
            self.allocator.free(s.block_table)
            s.block_table = []
            s.num_cached_blocks = 0
        if s.cpu_block_table and self.cpu_allocator is not None:
            self.cpu_allocator.free(s.cpu_block_table)
            s.cpu_block_table = []


def _key(s: Sequence):
    return s.sort_key
