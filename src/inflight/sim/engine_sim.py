"""`SimEngine`: the engine's real scheduler over a simulated KV pool — no tensors, no model.

The same five steps as `LLMEngine` (`reap`, `budget`, `admit`, `preempt`, `decode`), callable one
by one so that chapter 6's exercise can put them in any order and measure what that order does,
and so that chapter 5's KV-utilisation simulator (`inflight.sim.kv_sim`) runs the very admission,
growth and preemption rules the engine runs. `decode()` "runs" the batch: every scheduled token
counts as computed and each request whose prefill is complete gets one token (id 1, never a stop
token). Steps are the clock: TTFT is measured in steps. With `enable_prefix_caching`, prompts share
cached blocks as in the engine (`prompts` gives their token ids; by default every prompt is all 1s).
`samples` asks for `n` samples of some requests (parallel sampling, as `SamplingParams(n=...)`):
one prefill, then samples that share the prompt's blocks and copy the last one on their first write.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from inflight.checks import integer, token_ids
from inflight.engine.block_manager import BlockAllocator, blocks_needed
from inflight.engine.prefix_cache import PrefixCachingBlockAllocator
from inflight.engine.sampling import SamplingParams
from inflight.engine.budget import Budget, BudgetInputs
from inflight.engine.parallel_sampling import SampleGroup
from inflight.engine.scheduler import Scheduler, SchedulerConfig
from inflight.engine.sequence import Sequence as Seq
from inflight.sim.workloads import Request

__all__ = ["SimEngine"]


class SimEngine:
    """The engine's scheduler over a simulated KV pool: same five steps, no tensors, no model.

    `decode()` "runs" the batch: every scheduled token counts as computed and each request whose
    prefill is complete gets one token. Steps are the clock (TTFT is measured in steps)."""

    def __init__(self, requests: Sequence[Request], num_blocks: int, block_size: int = 4, max_batch_size: int = 4,
                 max_batched_tokens: int = 64, enable_chunked_prefill: bool = True, preemption: str = "recompute",
                 watermark_blocks: int = 0, enable_prefix_caching: bool = False,
                 prompts: Mapping[str, Sequence[int]] | None = None, samples: Mapping[str, int] | None = None):
        """`requests`: `inflight.sim.workloads.Request`s (prompt_len, output_len, arrival step);
        `prompts`: the token ids of some of them, by request id (the others are all 1s); `samples`:
        how many samples some of them ask for, by request id (the others one)."""
        cfg = SchedulerConfig(max_batch_size=max_batch_size, max_batched_tokens=max_batched_tokens,
                              enable_chunked_prefill=enable_chunked_prefill, preemption=preemption,
                              watermark_blocks=watermark_blocks, max_model_len=10**6,
                              enable_prefix_caching=enable_prefix_caching)
        cpu = BlockAllocator(num_blocks, block_size) if preemption == "swap" else None
        pool = PrefixCachingBlockAllocator if cfg.enable_prefix_caching else BlockAllocator
        self.scheduler = Scheduler(pool(num_blocks, block_size), cfg, cpu)
        self.prompts = {str(k): token_ids(f"prompts[{k!r}]", v) for k, v in (prompts or {}).items()}
        self.samples = {str(k): integer(f"samples[{k!r}]", v, minimum=1) for k, v in (samples or {}).items()}
        for r in requests:
            self._check(r)
        self.pending = sorted(enumerate(requests), key=lambda ir: (ir[1].arrival, ir[0]))
        self._budget = Budget(0, 0, 0)  # the last budget computed: admit() spends it, stale or not
        self.seqs: list[Seq] = []
        self.step_no = 0
        self.log: list[dict] = []
        self.calls: list[str] = []
        self.overcommitted = 0

    def _check(self, r: Request) -> None:
        """A request the engine would accept: positive lengths, an arrival step, and a pool it fits."""
        if not isinstance(r, Request):
            raise TypeError(f"requests must be inflight.sim.workloads.Request, got {type(r).__name__}")
        prompt_len = len(self.prompts[str(r.id)]) if str(r.id) in self.prompts else \
            integer(f"request {r.id!r}: prompt_len", r.prompt_len, minimum=1)
        if prompt_len < 1:
            raise ValueError(f"request {r.id!r}: empty prompt")
        output_len = integer(f"request {r.id!r}: output_len", r.output_len, minimum=1)
        integer(f"request {r.id!r}: arrival", r.arrival, minimum=0)
        try:
            self.scheduler.check_can_run(prompt_len, output_len, self.samples.get(str(r.id), 1))
        except ValueError as exc:
            raise ValueError(f"request {r.id!r}: {exc}") from None

    # the five steps, as the learner calls them
    def reap(self):
        self.calls.append("reap")
        return self.scheduler.reap()

    def budget(self, compute: Callable[[BudgetInputs], Budget] | None = None):
        """The scheduler's budget step; `compute` replaces `inflight.engine.budget.compute_budget`
        (chapter 6's exercise runs the learner's version this way)."""
        self.calls.append("budget")
        self._budget = self.scheduler.budget(compute) if compute is not None else self.scheduler.budget()
        return self._budget

    def admit(self):
        """Admit, and measure overcommitment: blocks handed out that the running requests' plan needed."""
        self.calls.append("admit")
        sched = self.scheduler
        bs = sched.block_size
        before = sched.allocator.num_free
        plan = [(s.num_computed_tokens + s.num_scheduled_tokens, len(s.block_table))
                for s in sched.running if s.finish_reason is None]  # the running requests' plan, before admission
        admitted = sched.admit(self._budget)
        taken = before - sched.allocator.num_free
        if taken:  # compare what admission took with what the running requests' plan left free
            promised = sum(max(0, blocks_needed(n, bs) - held) for n, held in plan)
            really_free = max(0, before - promised - sched.config.watermark_blocks)
            self.overcommitted += max(0, taken - really_free)
        return admitted

    def preempt(self):
        self.calls.append("preempt")
        return self.scheduler.preempt()

    def decode(self):
        self.calls.append("decode")
        sched = self.scheduler
        batch = sched.batch()
        sched.update(batch, [1] * sched.num_draws(batch), float(self.step_no))  # token 1 is never a stop token here
        self._batch = batch
        return batch

    def step_in_order(self) -> None:
        """One iteration in the engine's order: reap → budget → admit → preempt → decode."""
        self.reap()
        self.budget()
        self.admit()
        self.preempt()
        self.decode()

    # the clock
    def arrive(self) -> None:
        while self.pending and self.pending[0][1].arrival <= self.step_no:
            i, r = self.pending.pop(0)
            tokens = list(self.prompts.get(str(r.id), [1] * r.prompt_len))
            n = self.samples.get(str(r.id), 1)
            seq = Seq(str(r.id), tokens, SamplingParams(max_tokens=r.output_len, ignore_eos=True, n=n),
                      arrival_time=float(self.step_no), seq_no=i)
            if n > 1:  # the carrier of its samples, as the engine builds it
                seq.group = SampleGroup(n)
                seq.group.samples.append(seq)
            self.seqs.append(seq)
            self.scheduler.add(seq)

    def run_step(self, step: Callable[["SimEngine"], Any]) -> dict:
        """Deliver this step's arrivals, run `step(self)` once, and record what it did."""
        self.arrive()
        ev = self.scheduler.begin_step()
        self._batch = None
        self.overcommitted = 0
        waiting_before = len(self.scheduler.waiting) + len(self.scheduler.swapped)
        step(self)
        b = self._batch
        rec = {
            "admitted": len(ev.admitted) + len(ev.swapped_in),
            "reaped": len(ev.reaped),
            "preempted": len(ev.preempted),
            "batch": len(b.seqs) if b is not None else 0,
            "tokens": b.num_tokens if b is not None else 0,
            "wasted_tokens": ev.wasted_tokens,
            "tokens_without_kv": ev.tokens_without_kv,
            "overcommitted_blocks": ev.overcommitted_blocks + self.overcommitted,
            # blocks nobody used during the forward pass although requests were waiting for memory
            "idle_blocks": ev.free_blocks_at_decode if (b is not None and waiting_before and len(ev.admitted) == 0
                                                        and self.scheduler.waiting) else 0,
            "decoded": b is not None,
        }
        self.log.append(rec)
        self.step_no += 1
        return rec

    def abort(self, request_id: str) -> bool:
        """Drop an arrived, unfinished request wherever it is (its blocks go back); False if none."""
        for s in self.seqs:
            if s.request_id == str(request_id) and s.finish_reason is None:
                self.scheduler.abort(s)
                s.finish_reason = "abort"
                return True
        return False

    def done(self) -> bool:
        return not self.pending and not self.scheduler.has_unfinished()
