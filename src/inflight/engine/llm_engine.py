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

import dataclasses
import time
from collections import deque
from functools import partial
from typing import Any, Sequence as Seq

import torch

from inflight import checks
from inflight.engine.engine_args import (allocate_pools, check_stats_window, check_tokenizer, engine_device,
                                         eos_token_ids, id_key as _id_key, model_attr, params_per_prompt as _params_per_prompt)
from inflight.engine.invariants import check_batch_writes, check_requests
from inflight.engine.kv_transfer import admit_prefilled, check_payload, drop_arrived, ship_kv
from inflight.engine.liveness import EngineStalledError, check_progress
from inflight.engine.cuda_graphs import DecodeGraphRunner, wants_cuda_graphs
from inflight.engine.executor import ParallelModelRunner, TensorParallelEngine, parallel_executor
from inflight.engine.detokenizer import IncrementalDetokenizer
from inflight.engine.model_runner import ModelRunner, StepTimes, default_num_blocks
from inflight.engine.logprobs import StepLogprobs
from inflight.engine.output_processor import advance_request, request_heads, snapshot
from inflight.engine.outputs import RequestOutput, RunTotals, StepStats, step_stats
from inflight.engine.parallel_sampling import SampleGroup, request_finished, request_samples
from inflight.engine.prefix_cache import cache_stats
from inflight.engine.priority import check_aging, priority_key
from inflight.engine.sampling import SamplingParams, sample_seed
from inflight.engine.scheduler import Scheduler, SchedulerConfig, StepEvents, SchedulerOutput
from inflight.engine.sequence import Sequence, fail
from inflight.engine.spec_decode.speculator import Speculator
from inflight.model.sampler import Sampler, make_generator

__all__ = ["LLMEngine", "SamplingParams", "RequestOutput", "StepStats", "EngineStalledError"]


class LLMEngine(TensorParallelEngine):
    """Continuous batching over a paged KV cache (see the module docstring).

    `num_blocks=None` sizes the pool from memory (`model_runner.default_num_blocks`: on CUDA a
    fraction of the memory free after the weights; on CPU enough for `max_batch_size` requests of
    512 tokens). `watermark` is the fraction of the pool admission leaves free so that running
    requests can grow without being preempted at once. `swap_blocks` sizes the CPU pool of
    `preemption="swap"` (default `model_runner.default_swap_blocks`); when it is full, a victim is
    recomputed instead. `max_batched_tokens` defaults to 512 with chunked prefill, else to the
    model's context. `debug=True` checks the scheduler's invariants after every step. A contiguous
    cache is `block_size=max_model_len`, `num_blocks=max_batch_size`. On CUDA, decode-only steps replay
    CUDA graphs captured per batch-size bucket when the engine is built (`inflight.engine.cuda_graphs`);
    `enforce_eager=True` runs every step eagerly, as on a CPU.

    `enable_prefix_caching=True` shares the KV blocks of common prompt prefixes between requests
    (`inflight.engine.prefix_cache`): admission takes the longest cached prefix and computes only the rest.
    Priorities (`SamplingParams.priority` or `add_request(..., priority=)`, lower first, ties by
    arrival) order admission and preemption; `priority_aging` (seconds of waiting worth one
    priority level, None = strict priorities) bounds how long a low-priority request can starve
    (`inflight.engine.priority`).

    A long-running engine keeps flat memory: it forgets a request once its final output has been
    returned (by `step()` or `generate()`, as vLLM does), `stats` holds the last `stats_window`
    steps (None: all of them) and `summary()` reads running totals over the engine's whole life.
    `speculative_config`: speculative decoding, vLLM's keys (`inflight.engine.spec_decode`). A `kv_connector`
    ships finished requests' prompt KV; `add_prefilled_request` decodes on from one (`engine.kv_transfer`)."""

    def __init__(self, model: Any, *, block_size: int = 16, num_blocks: int | None = None, max_batch_size: int = 64,
                 max_batched_tokens: int | None = None, preemption: str = "recompute",
                 enable_chunked_prefill: bool = True, watermark: float = 0.0, tokenizer: Any = None,
                 debug: bool = False, device: str | torch.device | None = None, swap_blocks: int | None = None,
                 max_model_len: int | None = None, seed: int = 0, enable_prefix_caching: bool = False,
                 priority_aging: float | None = None, stats_window: int | None = 10_000,
                 enforce_eager: bool = False, speculative_config: dict | None = None, kv_connector: Any = None):
        if not hasattr(model, "config") or not callable(model):
            raise TypeError(f"model must be an inflight LlamaModel (or obey its forward signature), got {type(model).__name__}")
        self.model, self.config, self.tokenizer = model, model.config, check_tokenizer(tokenizer)
        self.debug = checks.flag("debug", debug)
        enable_chunked_prefill = checks.flag("enable_chunked_prefill", enable_chunked_prefill)  # (the budget reads it)
        self.block_size = checks.integer("block_size", block_size, minimum=1)
        watermark = checks.number("watermark", watermark, minimum=0.0)
        if watermark >= 1:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {watermark}")
        self.priority_aging = check_aging(priority_aging)
        self.device = engine_device(model, device)
        self.dtype = model_attr(model, "dtype", torch.float32)
        if max_model_len is None:
            max_model_len = self.config.max_position_embeddings
        self.max_model_len = checks.integer("max_model_len", max_model_len, minimum=1)  # (0 or False is not "unset")
        max_batch_size = checks.integer("max_batch_size", max_batch_size, minimum=1)
        if max_batched_tokens is None:
            max_batched_tokens = max(512 if enable_chunked_prefill else self.max_model_len, max_batch_size)
        self.executor = parallel_executor(model, kv_connector)  # tensor parallelism: the workers' driver, or None
        if num_blocks is None:  # (with tensor parallelism, what each device's memory holds of its own heads)
            num_blocks = (self.executor.determine_num_blocks if self.executor is not None else partial(
                default_num_blocks, self.config, self.dtype, self.device))(self.block_size, max_batch_size, self.max_model_len)
        num_blocks = checks.integer("num_blocks", num_blocks, minimum=1)
        if swap_blocks is not None:
            swap_blocks = checks.integer("swap_blocks", swap_blocks, minimum=1, maximum=checks.INT64_MAX)
        sampler = Sampler(checks.seed("seed", seed))
        self.enable_prefix_caching = checks.flag("enable_prefix_caching", enable_prefix_caching)
        self.eos_token_ids = eos_token_ids(self.config, tokenizer)
        sched_cfg = SchedulerConfig(max_batch_size=max_batch_size, max_batched_tokens=max_batched_tokens,
                                    enable_chunked_prefill=enable_chunked_prefill, preemption=preemption,
                                    watermark_blocks=int(watermark * num_blocks), max_model_len=self.max_model_len,
                                    eos_token_ids=self.eos_token_ids, enable_prefix_caching=self.enable_prefix_caching)
        self.stats: deque[StepStats] = deque(maxlen=check_stats_window(stats_window))  # the last steps, one record each
        # on CUDA, decode steps replay CUDA graphs (`enforce_eager=True`: never); their padding rows
        # write to one extra block past the allocator's pool
        use_graphs = wants_cuda_graphs(self.device, checks.flag("enforce_eager", enforce_eager)) and self.executor is None
        self.kv_cache, self.allocator, cpu_pool, self.swapper = allocate_pools(
            self.config, num_blocks, self.block_size, self.dtype, self.device, use_graphs, self.enable_prefix_caching,
            preemption, swap_blocks, self.executor)
        self.scheduler = Scheduler(self.allocator, sched_cfg, cpu_pool, self.swapper, self.kv_cache.copy_blocks)
        graphs = DecodeGraphRunner(model, self.kv_cache, max_batch_size=max_batch_size, max_model_len=self.max_model_len,
                                   scratch_block=num_blocks, capture=self.device.type == "cuda") if use_graphs else None
        self.runner = (ParallelModelRunner(self.executor, self.kv_cache, sampler) if self.executor is not None
                       else ModelRunner(model, self.kv_cache, sampler, graphs))
        self.speculator = Speculator.build(speculative_config, self, num_blocks, max_batch_size)  # (k = 0: off)
        self.requests: dict[str, Sequence] = {}       # every request submitted whose final output is not out yet
        self.totals = RunTotals()                     # over the engine's whole life
        self._undelivered: list[RequestOutput] = []   # final outputs of requests that ended inside generate()
        self.kv_connector, self._arrived = kv_connector, deque()  # disaggregation: KV out; (request, payload)s in
        self._next_id = self._next_seq_no = self._step_no = 0  # the next automatic id, submission order, steps

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    # -- submission ------------------------------------------------------------------------------
    def add_request(self, prompt: str | Seq[int], sampling_params: SamplingParams | None = None,
                    request_id: str | int | None = None, arrival_time: float | None = None,
                    priority: int | None = None) -> str:
        """Validate and queue one request; returns its id. A bad request raises (ValueError/TypeError)
        and leaves the engine exactly as it was. `arrival_time` is on `time.perf_counter()`'s clock;
        `priority` (lower = sooner) overrides `sampling_params.priority`."""
        seq = self._make_sequence(prompt, sampling_params, request_id, arrival_time, priority)
        self.requests[seq.request_id] = seq
        self.scheduler.add(seq)
        return seq.request_id

    def check_request(self, prompt: str | Seq[int], sampling_params: SamplingParams | None = None
                      ) -> tuple[list[int], SamplingParams]:
        """Every check a request must pass, as (prompt token ids, a validated copy of its parameters);
        a bad request raises ValueError/TypeError naming the problem. It reads only what the
        constructor fixed (model, tokenizer, pool size), so a server may call it from another thread
        than the one stepping the engine, to refuse a bad request before queueing it."""
        params = SamplingParams() if sampling_params is None else sampling_params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        # a validated copy: the request keeps what it was sent with, whatever the caller changes later
        params = dataclasses.replace(params)
        ids = checks.prompt(prompt, self.config.vocab_size, self.tokenizer)
        if len(ids) > self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens, longer than the model's context of {self.max_model_len}")
        checks.token_ids("stop_token_ids", params.stop_token_ids, self.config.vocab_size)
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings are checked on the text, which needs a tokenizer: pass tokenizer=... "
                             "or use stop_token_ids")
        self.scheduler.check_can_run(len(ids), params.max_tokens, params.n)
        return ids, params

    def _make_sequence(self, prompt, params, request_id, arrival_time, priority=None) -> Sequence:
        """A checked request (`check_request`), before anything changes."""
        ids, params = self.check_request(prompt, params)
        priority = params.priority if priority is None else checks.priority("priority", priority)
        now = time.perf_counter() if arrival_time is None else checks.number("arrival_time", arrival_time)
        request_id = self._new_request_id(request_id)
        # each sample its own stream: seed + i for sample i (parallel sampling; n=1 is seed itself)
        generators = [make_generator(sample_seed(params.seed, i)) for i in range(params.n)]
        seq = Sequence(request_id, ids, params, now, seq_no=self._next_seq_no, generator=generators[0])
        if params.n > 1:  # the carrier of the request's samples (inflight.engine.parallel_sampling)
            seq.group = SampleGroup(params.n, generators)
            seq.group.samples.append(seq)
        self._next_seq_no += 1
        seq.priority = priority
        seq.sort_key = priority_key(priority, now, seq.seq_no, self.priority_aging)
        if self.tokenizer is not None:
            seq.detokenizer = IncrementalDetokenizer(self.tokenizer, params.stop, params.skip_special_tokens)
        return seq

    def _new_request_id(self, request_id: Any) -> str:
        if request_id is None:
            while str(self._next_id) in self.requests:
                self._next_id += 1
            self._next_id += 1
            return str(self._next_id - 1)
        request_id = _id_key(request_id)
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        return request_id

    def add_prefilled_request(self, payload: Any, sampling_params: SamplingParams | None = None,
                              request_id: str | int | None = None, arrival_time: float | None = None) -> str:
        """Queue a request whose prompt another engine ran (`payload`: a `KVPayload`); it decodes on from
        there (`inflight.engine.kv_transfer`). `max_tokens` counts the tokens already sampled; returns its id."""
        check_payload(payload, self.kv_cache, self.config.vocab_size, sampling_params)
        seq = self._make_sequence(payload.prompt_token_ids, sampling_params, request_id, arrival_time)
        self.requests[seq.request_id] = seq
        self._arrived.append((seq, payload))
        return seq.request_id

    def abort_request(self, request_id: str | int) -> None:
        """Stop a request now — every one of its samples — and give its KV blocks back. An id the
        engine does not hold (unknown, or already finished) is ignored; an id that is not a str or an
        int is a TypeError."""
        seq = self.requests.get(_id_key(request_id))
        if seq is None:
            return
        if drop_arrived(self._arrived, seq):  # (prefilled elsewhere, not admitted yet)
            return self._forget(seq)
        now = time.perf_counter()
        for s in request_samples(seq):
            if s.finish_reason is None:  # (a sample that ended already leaves at the next reap, as it would)
                self.scheduler.abort(s)
                s.finish_reason, s.finish_time = "abort", now
        self._forget(seq)
        if not self.scheduler.has_unfinished():  # the last one: an idle engine holds no blocks (as after a step)
            self.scheduler.reap()

    def has_unfinished_requests(self) -> bool:
        """Whether a request still needs a step (or has a final output `step()` has yet to return)."""
        return bool(self._undelivered or self._arrived) or self.scheduler.has_unfinished()

    # -- the iteration ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One iteration; returns the requests that got a new token (or ended) in it — and first the
        final outputs of requests that ended while `generate()` ran. Once a request's final output
        is returned, the engine forgets it."""
        outs = self._step()
        if self._undelivered:
            outs, self._undelivered = self._undelivered + outs, []
        return outs

    def _step(self, final_only: bool = False) -> list[RequestOutput]:
        sched = self.scheduler
        t0 = time.perf_counter()
        arrived = admit_prefilled(sched, self._arrived, self.kv_cache, self.eos_token_ids, self.max_model_len)
        events = sched.begin_step()
        sched.reap()                      # 1. reap
        self.speculator.propose(sched.running)  # (speculative decoding: proposals, before the budget)
        budget = sched.budget()           # 2. budget
        for s in sched.admit(budget):     # 3. admit
            if s.first_scheduled_time is None:
                s.first_scheduled_time = t0   # (its queue time ends with this step)
        sched.preempt()                   # 4. preempt
        batch = sched.batch()             # 5. decode: the batch ...
        if self.debug:
            check_batch_writes(batch, self.allocator)
        t1 = time.perf_counter()
        try:  # (requests whose forward pass alone fails are left out of it, to end with an error)
            batch, tokens, failures, times, lps, broken = self.runner.run_isolating(batch) if batch.seqs else \
                (batch, [], {}, StepTimes(), StepLogprobs(), {})
        except BaseException:             # (a failed forward pass, or Ctrl-C): nothing is half-done
            sched.release_unused(batch)
            raise
        now = time.perf_counter()
        sched.release_unused(SchedulerOutput(list(broken), 0, 0))  # (ended: they leave at the next reap)
        for s, why in broken.items():
            fail(s, f"the model's forward pass failed for it ({why})", now)
        touched = arrived + sched.update(batch, tokens, now, failures, lps, self.speculator.stop_check) + list(broken)  # ... then the bookkeeping
        self.speculator.record(events)
        if self.kv_connector is not None:
            ship_kv(self.kv_connector, self.kv_cache, touched)
        outs = self._outputs(touched, now, final_only)
        if not sched.has_unfinished():    # an idle engine holds no blocks: there may be no next step for a while
            sched.reap()
        self._record(batch, events, outs, t0, t1, times)
        check_progress(sched, batch)
        if self.debug:
            self.check_invariants()
        return outs

    def spec_decode_stats(self) -> dict:  # (chapter 12: counters, acceptance rate, mean accepted length; {}: off)
        return self.speculator.stats()

    def _record(self, batch: SchedulerOutput, events: StepEvents, outs: list[RequestOutput], t0: float, t1: float,
                times: StepTimes) -> None:
        self._step_no += 1
        st = step_stats(self._step_no, batch, self.scheduler, events, sum(o.finished for o in outs), t0, t1, times)
        self.stats.append(st)
        self.totals.add(st)

    def _forget(self, seq: Sequence) -> None:  # (it has ended and its final output is out)
        held = self.requests.pop(seq.request_id, None)
        if self.debug:
            assert held is seq, f"request {seq.request_id} ended twice"

    def _outputs(self, touched: list[Sequence], now: float, final_only: bool = False) -> list[RequestOutput]:
        """The step's outputs, one per request touched (all its samples in it; `final_only`: those
        that ended, vLLM's FINAL_ONLY, for `generate()`); the requests that ended are forgotten. If
        decoding is interrupted (Ctrl-C in a slow tokenizer), the step's tokens still stand and no ended
        request is lost: their final outputs go out with the next `step()` (text None if not decoded)."""
        heads = request_heads(touched)
        outs: list[RequestOutput] = []
        done = 0  # (heads advanced)
        try:
            for s in heads:
                texts = advance_request(s, now, self.tokenizer, self.eos_token_ids)  # (stop strings: every step)
                if not final_only or request_finished(s):
                    outs.append(snapshot(s, texts))
                done += 1
        finally:
            if done < len(heads):  # interrupted
                self._undelivered += [o for o in outs if o.finished] + \
                    [snapshot(s, None) for s in heads[done:] if request_finished(s)]
            for s in heads:
                if request_finished(s):
                    self._forget(s)
        return outs

    def get_output(self, request_id: str | int) -> RequestOutput:
        """The current state of a request the engine still holds (an unfinished one)."""
        key = _id_key(request_id)
        seq = self.requests.get(key)
        if seq is None:
            raise KeyError(f"no unfinished request {key!r}: unknown, or it ended and its final output was already "
                           "returned (by step() or generate()); the engine forgets a request then")
        return snapshot(seq, [None if s.detokenizer is None else s.detokenizer.text(False)
                              for s in request_samples(seq)])

    # -- batch API -------------------------------------------------------------------------------
    def generate(self, prompts: Seq[str] | Seq[Seq[int]] | str, sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run every prompt to completion; outputs in prompt order. All are validated before any is queued
        (a bad one raises, naming its index, and changes nothing). Requests added with `add_request` run
        alongside; those that end meanwhile have their final outputs returned by the next `step()`."""
        prompts = checks.prompt_list(prompts)
        params = _params_per_prompt(sampling_params, len(prompts))
        use_tqdm = checks.flag("use_tqdm", use_tqdm)
        seqs = self._make_all(prompts, params)
        for s in seqs:
            self.scheduler.add(s)
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(seqs), desc="generate", unit="req")
        mine = {s.request_id: i for i, s in enumerate(seqs)}
        final: list[RequestOutput | None] = [None] * len(seqs)
        remaining = len(seqs)
        try:
            while remaining and self.scheduler.has_unfinished():
                for out in self._step(final_only=True):
                    i = mine.get(out.request_id)
                    if i is None:
                        if out.finished:  # someone else's request: its final output waits for the next step()
                            self._undelivered.append(out)
                    elif out.finished:
                        final[i], remaining = out, remaining - 1
                        if bar is not None:
                            bar.update(1)
        finally:  # (interrupted, the requests stay queued: step() carries on with them)
            if bar is not None:
                bar.close()
        assert not remaining, "generate(): requests left unfinished although the scheduler has no work"
        return final  # type: ignore[return-value]

    def _make_all(self, prompts: list, params: list) -> list[Sequence]:
        """Validate every prompt (reserving ids as it goes); on the first bad one undo and raise."""
        seqs: list[Sequence] = []
        counters = self._next_id, self._next_seq_no
        for i, (p, sp) in enumerate(zip(prompts, params)):
            try:
                seqs.append(self._make_sequence(p, sp, None, None))
            except BaseException as exc:
                for s in seqs:  # leave the engine exactly as it was
                    del self.requests[s.request_id]
                self._next_id, self._next_seq_no = counters
                if isinstance(exc, (ValueError, TypeError)):
                    raise type(exc)(f"prompt {i}: {exc}") from None
                raise
            self.requests[seqs[-1].request_id] = seqs[-1]  # reserve the id (so the next one differs)
        return seqs

    # -- checks and numbers ----------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Scheduler invariants plus: the engine holds exactly the unfinished requests."""
        self.scheduler.check_invariants()
        check_requests(self.scheduler, self.requests.values(), [s for s, _ in self._arrived])

    def summary(self) -> dict:
        """Totals over every step of the engine's life so far (seconds and counts)."""
        return {**self.totals.as_dict(), "swap_bytes": self.swapper.bytes_moved if self.swapper is not None else 0,
                **self.prefix_cache_stats(), **self.spec_decode_stats()}

    def prefix_cache_stats(self) -> dict:
        """Prefix-cache counters (zeros when caching is off): lookups, hits, tokens served, hit rate."""
        return cache_stats(getattr(self.allocator, "stats", None))

    def reset_prefix_cache(self) -> None:
        """Forget every cached block nobody holds (vLLM's `reset_prefix_cache`); a no-op when caching is off."""
        if self.enable_prefix_caching:
            self.allocator.reset_cache()

