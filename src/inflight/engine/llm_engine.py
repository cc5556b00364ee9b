"""`LLMEngine`: continuous batching over a paged KV cache, serving a real model.

    engine = LLMEngine(model, tokenizer=tok)
    outs = engine.generate(["Once upon a time"], SamplingParams(max_tokens=32))

Every `step()` runs the five-step iteration of `inflight.engine.scheduler.Scheduler`: reap finished
requests, compute the block budget, admit waiting requests, preempt under pressure, and decode one
ragged batch (prefill chunks + decode tokens) through the model (`inflight.engine.model_runner`).
Per-step Python work is one pass over the batch building plain lists, then one tensor each — the
model's forward pass should be where the time goes. vLLM's counterpart is `vllm/v1/engine/llm_engine.py`.
"""
from __future__ import annotations

import itertools
import time
from typing import Any, Sequence as Seq

import torch

from inflight import checks
from inflight.engine.block_manager import BlockAllocator
from inflight.engine.invariants import check_requests
from inflight.engine.model_runner import ModelRunner, KVSwapper, StepTimes, default_num_blocks, default_swap_blocks
from inflight.engine.outputs import RequestOutput, StepStats
from inflight.engine.prefix_cache import PrefixCachingBlockAllocator
from inflight.engine.priority import check_aging, priority_key
from inflight.engine.sampling import SamplingParams
from inflight.engine.scheduler import Scheduler, SchedulerConfig, StepEvents, SchedulerOutput
from inflight.engine.sequence import Sequence, SequenceStatus
from inflight.model.kv_cache import KVCache
from inflight.model.sampler import Sampler, make_generator

__all__ = ["LLMEngine", "SamplingParams", "RequestOutput", "StepStats"]


class LLMEngine:
    """Continuous batching over a paged KV cache (see the module docstring).

    `num_blocks=None` sizes the pool from memory (`model_runner.default_num_blocks`: on CUDA a
    fraction of the memory free after the weights; on CPU enough for `max_batch_size` requests of
    512 tokens). `watermark` is the fraction of the pool admission leaves free so that running
    requests can grow without being preempted at once. `swap_blocks` sizes the CPU pool of
    `preemption="swap"` (default `model_runner.default_swap_blocks`); when it is full, a victim is
    recomputed instead. `max_batched_tokens` defaults to 512 with chunked prefill, else to the
    model's context. `debug=True` checks the scheduler's invariants after every step. A contiguous
    cache is `block_size=max_model_len`, `num_blocks=max_batch_size`.

    `enable_prefix_caching=True` shares the KV blocks of common prompt prefixes between requests
    (`inflight.engine.prefix_cache`): admission takes the longest cached prefix and computes only the rest.
    Priorities (`SamplingParams.priority` or `add_request(..., priority=)`, lower first, ties by
    arrival) order admission and preemption; `priority_aging` (seconds of waiting worth one
    priority level, None = strict priorities) bounds how long a low-priority request can starve
    (`inflight.engine.priority`)."""

    def __init__(self, model: Any, *, block_size: int = 16, num_blocks: int | None = None, max_batch_size: int = 64,
                 max_batched_tokens: int | None = None, preemption: str = "recompute",
                 enable_chunked_prefill: bool = True, watermark: float = 0.0, tokenizer: Any = None,
                 debug: bool = False, device: str | torch.device | None = None, swap_blocks: int | None = None,
                 max_model_len: int | None = None, seed: int = 0, enable_prefix_caching: bool = False,
                 priority_aging: float | None = None):
        if not hasattr(model, "config") or not callable(model):
            raise TypeError(f"model must be an inflight LlamaModel (or obey its forward signature), got {type(model).__name__}")
        self.model, self.config, self.tokenizer, self.debug = model, model.config, tokenizer, debug
        self.block_size = checks.integer("block_size", block_size, minimum=1)
        watermark = checks.number("watermark", watermark, minimum=0.0)
        if watermark >= 1:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {watermark}")
        self.priority_aging = check_aging(priority_aging)
        self.device = torch.device(device) if device is not None else _model_attr(model, "device", torch.device("cpu"))
        self.dtype = _model_attr(model, "dtype", torch.float32)
        self.max_model_len = checks.integer("max_model_len", max_model_len or self.config.max_position_embeddings,
                                            minimum=1)
        max_batch_size = checks.integer("max_batch_size", max_batch_size, minimum=1)
        if max_batched_tokens is None:
            max_batched_tokens = max(512 if enable_chunked_prefill else self.max_model_len, max_batch_size)
        if num_blocks is None:
            num_blocks = default_num_blocks(self.config, self.dtype, self.device, self.block_size, max_batch_size,
                                            self.max_model_len)
        num_blocks = checks.integer("num_blocks", num_blocks, minimum=1)
        self.kv_cache = KVCache.for_model(self.config, num_blocks, self.block_size, dtype=self.dtype, device=self.device)
        self.enable_prefix_caching = bool(enable_prefix_caching)
        pool = PrefixCachingBlockAllocator if self.enable_prefix_caching else BlockAllocator
        self.allocator = pool(num_blocks, self.block_size)
        self.eos_token_ids = _eos_token_ids(self.config, tokenizer)
        sched_cfg = SchedulerConfig(max_batch_size=max_batch_size, max_batched_tokens=max_batched_tokens,
                                    enable_chunked_prefill=enable_chunked_prefill, preemption=preemption,
                                    watermark_blocks=int(watermark * num_blocks), max_model_len=self.max_model_len,
                                    eos_token_ids=self.eos_token_ids, enable_prefix_caching=self.enable_prefix_caching)
        cpu_pool, self.swapper = None, None
        if preemption == "swap":
            n_cpu = default_swap_blocks(self.kv_cache) if swap_blocks is None else \
                checks.integer("swap_blocks", swap_blocks, minimum=1)
            cpu_pool, self.swapper = BlockAllocator(n_cpu, self.block_size), KVSwapper(self.kv_cache, n_cpu)
        self.scheduler = Scheduler(self.allocator, sched_cfg, cpu_pool, self.swapper)
        self.runner = ModelRunner(model, self.kv_cache, Sampler(checks.integer("seed", seed)))
        self.requests: dict[str, Sequence] = {}       # every request submitted and not yet reported done
        self.finished_ids: set[str] = set()           # debug: every request ends exactly once
        self.stats: list[StepStats] = []
        self._counter = itertools.count()
        self._seq_nos = itertools.count()
        self._step_no = 0

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    # -- submission ------------------------------------------------------------------------------
    def add_request(self, prompt: str | Seq[int], sampling_params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None,
                    priority: int | None = None) -> str:
        """Validate and queue one request; returns its id. A bad request raises (ValueError/TypeError)
        and leaves the engine exactly as it was. `arrival_time` is on `time.perf_counter()`'s clock;
        `priority` (lower = sooner) overrides `sampling_params.priority`."""
        seq = self._make_sequence(prompt, sampling_params, request_id, arrival_time, priority)
        self.requests[seq.request_id] = seq
        self.scheduler.add(seq)
        return seq.request_id

    def _make_sequence(self, prompt, params, request_id, arrival_time, priority=None) -> Sequence:
        """Every check a request must pass, before anything changes."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        params.validate()  # fields may have been changed after construction
        ids = checks.prompt(prompt, self.config.vocab_size, self.tokenizer)
        if len(ids) > self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens, longer than the model's context of {self.max_model_len}")
        checks.token_ids("stop_token_ids", params.stop_token_ids, self.config.vocab_size)
        self.scheduler.check_can_run(len(ids), params.max_tokens)
        request_id = self._new_request_id(request_id)
        priority = params.priority if priority is None else checks.integer("priority", priority)
        now = time.perf_counter() if arrival_time is None else checks.number("arrival_time", arrival_time)
        seq = Sequence(request_id, ids, params, now, seq_no=next(self._seq_nos), generator=make_generator(params.seed))
        seq.priority = priority
        seq.sort_key = priority_key(priority, now, seq.seq_no, self.priority_aging)
        return seq

    def _new_request_id(self, request_id: Any) -> str:
        if request_id is None:
            request_id = str(next(self._counter))
            while request_id in self.requests:
                request_id = str(next(self._counter))
            return request_id
        if str(request_id) in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        return str(request_id)

    def abort_request(self, request_id: str) -> None:
        """Stop a request now and give its KV blocks back (unknown or finished ids are ignored)."""
        seq = self.requests.get(str(request_id))
        if seq is None or seq.status is SequenceStatus.FINISHED or seq.finish_reason is not None:
            return  # unknown, or already done (a finished request's blocks go back at the next reap)
        self.scheduler.abort(seq)
        seq.finish_reason = "abort"
        seq.finish_time = time.perf_counter()
        self._done(seq)

    def has_unfinished_requests(self) -> bool:
        """Whether any request still needs a step. When none does, the blocks of requests that
        finished in the last step are returned now (the next step's reap would have done it)."""
        if self.scheduler.has_unfinished():
            return True
        self._reap_all()
        return False

    # -- the iteration ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One iteration; returns the requests that got a new token (or finished) in it."""
        touched = self._step()
        return [self._output(s) for s in touched]

    def _step(self) -> list[Sequence]:
        sched = self.scheduler
        t0 = time.perf_counter()
        events = sched.begin_step()
        for seq in sched.reap():          # 1. reap
            self._done(seq)
        budget = sched.budget()           # 2. budget
        sched.admit(budget)               # 3. admit
        sched.preempt()                   # 4. preempt
        batch = sched.batch()             # 5. decode: the batch ...
        t1 = time.perf_counter()
        tokens, times = self.runner.run(batch) if batch.seqs else ([], StepTimes())
        touched = sched.update(batch, tokens, time.perf_counter())  # ... then the bookkeeping
        self._record(batch, events, touched, t0, t1, times)
        if self.debug:
            self.check_invariants()
        return touched

    def _record(self, batch: SchedulerOutput, events: StepEvents, touched: list[Sequence], t0: float, t1: float,
                times: StepTimes) -> None:
        sched = self.scheduler
        self._step_no += 1
        bookkeeping = time.perf_counter() - t1 - times.prepare - times.forward
        self.stats.append(StepStats(
            step=self._step_no, batch_size=len(batch.seqs), num_prefill_tokens=batch.num_prefill_tokens,
            num_decode_tokens=batch.num_decode_tokens, num_running=len(sched.running), num_waiting=len(sched.waiting),
            num_swapped=len(sched.swapped), blocks_used=self.allocator.num_used, num_preempted=len(events.preempted),
            blocks_swapped=events.blocks_swapped_out + events.blocks_swapped_in,
            num_finished=sum(s.finish_reason is not None for s in touched),
            schedule_time=t1 - t0, prepare_time=times.prepare, forward_time=times.forward,
            sample_time=bookkeeping, start_time=t0))

    def _done(self, seq: Sequence) -> None:
        if self.debug:
            assert seq.request_id not in self.finished_ids, f"request {seq.request_id} ended twice"
        self.finished_ids.add(seq.request_id)

    def _output(self, s: Sequence) -> RequestOutput:
        out = s.output_token_ids
        text = self.tokenizer.decode(out) if self.tokenizer is not None else None
        return RequestOutput(s.request_id, s.prompt_token_ids, out, text, s.finish_reason, s.finish_reason is not None,
                             s.arrival_time, s.first_token_time, s.finish_time, list(s.token_times), s.num_preemptions,
                             s.num_cached_tokens)

    def get_output(self, request_id: str) -> RequestOutput:
        """The current state of a request."""
        return self._output(self.requests[str(request_id)])

    # -- batch API -------------------------------------------------------------------------------
    def generate(self, prompts: Seq[str] | Seq[Seq[int]] | str, sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run every prompt to completion; outputs in prompt order. All prompts are validated before
        any is queued, so a bad one raises (naming its index) and leaves the engine untouched."""
        prompts = checks.prompt_list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"{len(params)} sampling_params for {len(prompts)} prompts: give one, or one per prompt")
        seqs = self._make_all(prompts, params)
        for s in seqs:
            self.scheduler.add(s)
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(seqs), desc="generate", unit="req")
        wanted = set(id(s) for s in seqs)
        remaining = len(seqs)
        while remaining and self.has_unfinished_requests():
            for s in self._step():
                if s.finish_reason is not None and id(s) in wanted:
                    remaining -= 1
                    if bar is not None:
                        bar.update(1)
        self._reap_all()
        if bar is not None:
            bar.close()
        return [self._output(s) for s in seqs]

    def _make_all(self, prompts: list, params: list) -> list[Sequence]:
        """Validate every prompt (reserving ids as it goes); on the first bad one undo and raise."""
        seqs: list[Sequence] = []
        for i, (p, sp) in enumerate(zip(prompts, params)):
            try:
                seqs.append(self._make_sequence(p, sp, None, None))
            except (ValueError, TypeError) as exc:
                for s in seqs:  # leave the engine exactly as it was
                    del self.requests[s.request_id]
                raise type(exc)(f"prompt {i}: {exc}") from None
            self.requests[seqs[-1].request_id] = seqs[-1]  # reserve the id (so the next one differs)
        return seqs

    def _reap_all(self) -> None:
        """Return the blocks of requests that finished in the last step (the next step would do it)."""
        for seq in self.scheduler.reap():
            self._done(seq)

    # -- checks and numbers ----------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Scheduler invariants plus: every submitted request is either queued or ended exactly once."""
        self.scheduler.check_invariants()
        check_requests(self.scheduler, self.requests.values())
        ended = {rid for rid, s in self.requests.items() if s.finish_reason is not None}
        assert self.finished_ids <= ended, "a request was reaped without finishing"

    def summary(self) -> dict:
        """Totals over every step so far (seconds and counts)."""
        st = self.stats
        tot = lambda f: sum(getattr(s, f) for s in st)  # noqa: E731
        return {"steps": len(st), "prefill_tokens": tot("num_prefill_tokens"), "decode_tokens": tot("num_decode_tokens"),
                "preemptions": tot("num_preempted"), "blocks_swapped": tot("blocks_swapped"),
                "schedule_time": tot("schedule_time"), "prepare_time": tot("prepare_time"),
                "forward_time": tot("forward_time"), "sample_time": tot("sample_time"),
                "swap_bytes": self.swapper.bytes_moved if self.swapper is not None else 0,
                **self.prefix_cache_stats()}

    def prefix_cache_stats(self) -> dict:
        """Prefix-cache counters (zeros when caching is off): lookups, hits, tokens served, hit rate."""
        st = getattr(self.allocator, "stats", None)
        if st is None:
            return {"prefix_cache_queries": 0, "prefix_cache_hits": 0, "prefix_cache_hit_tokens": 0,
                    "prefix_cache_query_tokens": 0, "prefix_cache_hit_rate": 0.0, "prefix_cache_evictions": 0}
        return {"prefix_cache_queries": st.requests, "prefix_cache_hits": st.requests_hit,
                "prefix_cache_hit_tokens": st.hit_tokens, "prefix_cache_query_tokens": st.query_tokens,
                "prefix_cache_hit_rate": st.hit_rate, "prefix_cache_evictions": st.evictions}

    def reset_prefix_cache(self) -> None:
        """Forget every cached block nobody holds (vLLM's `reset_prefix_cache`); a no-op when caching is off."""
        if self.enable_prefix_caching:
            self.allocator.reset_cache()


def _eos_token_ids(config: Any, tokenizer: Any) -> frozenset[int]:
    """End-of-sequence ids from the model's config and the tokenizer (either may name one)."""
    eos = set(getattr(config, "eos_token_ids", None) or [])
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        eos.add(int(tokenizer.eos_token_id))
    return frozenset(eos)


def _model_attr(model: Any, attr: str, default: Any) -> Any:
    """The model's `device` or `dtype`: its own attribute when it has one (LlamaModel does), else
    its first parameter's, else `default` (a model without parameters, e.g. a stand-in in tests)."""
    value = getattr(model, attr, None)
    if isinstance(value, (torch.device, torch.dtype)):
        return value
    try:
        return getattr(next(model.parameters()), attr)
    except (AttributeError, StopIteration):
        return default
