"""`LLMEngine`: continuous batching over a paged KV cache, serving a real model.

    engine = LLMEngine(model, tokenizer=tok)
    outs = engine.generate(["Once upon a time"], SamplingParams(max_tokens=32))

Every `step()` runs the five-step iteration of `engine_scheduler.Scheduler`: reap finished
requests, compute the block budget, admit waiting requests, preempt under pressure, and decode one
ragged batch (prefill chunks + decode tokens) through the model. Per-step Python work is one pass
over the batch building plain lists, then one tensor each — the model's forward pass should be
where the time goes.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence as Seq

import torch

from inflight.engine.block_manager import BlockAllocator
from inflight.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from inflight.engine.priority import check_aging, priority_key
from inflight.model.attention_metadata import AttentionMetadata
from inflight.model.sampler import Sampler, make_generator
from inflight.model.kv_cache import KVCache, default_kv_budget_bytes, kv_bytes_per_token
from inflight.engine.prefix_cache import PrefixCachingBlockAllocator
from inflight.engine.sampling import SamplingParams
from inflight.engine.sequence import Sequence, SequenceStatus

__all__ = ["LLMEngine", "SamplingParams", "RequestOutput", "StepStats"]

#: On CPU, without `num_blocks`: enough blocks for `max_batch_size` requests of this many tokens each.
CPU_DEFAULT_TOKENS_PER_REQUEST = 512
#: On CUDA, without `num_blocks`: this fraction of the memory free after the weights are loaded.
GPU_MEMORY_FRACTION = 0.5


@dataclass
class RequestOutput:
    """A request's state as the caller sees it (a snapshot: later steps don't change it)."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated tokens only
    text: str | None
    finish_reason: str | None  # "stop" | "length" | "abort" | None while running
    finished: bool
    arrival_time: float
    first_token_time: float | None
    finish_time: float | None
    token_times: list[float] = field(default_factory=list, repr=False)
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens taken from the prefix cache at the last admission

    @property
    def ttft(self) -> float | None:
        """Time to first token (seconds): arrival to the first generated token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (seconds); None with fewer than two tokens."""
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)


@dataclass
class StepStats:
    """One iteration, measured: who ran, what it cost, where the time went (seconds)."""

    step: int
    batch_size: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    num_swapped: int
    blocks_used: int
    num_preempted: int
    blocks_swapped: int
    num_finished: int
    schedule_time: float   # reap + budget + admit + preempt (+ swap copies)
    prepare_time: float    # building input tensors and attention metadata
    forward_time: float    # the model
    sample_time: float     # sampling + bookkeeping after the forward pass
    start_time: float = 0.0

    @property
    def step_time(self) -> float:
        return self.schedule_time + self.prepare_time + self.forward_time + self.sample_time


class _TensorSwapper:
    """Copies KV blocks between the device cache and a CPU pool of the same per-block shape."""

    def __init__(self, kv: KVCache, num_cpu_blocks: int):
        pin = kv.device.type == "cuda"
        shape = (num_cpu_blocks, kv.block_size, kv.num_kv_heads, kv.head_dim)
        self.kv = kv
        self.k = [torch.zeros(shape, dtype=kv.dtype, pin_memory=pin) for _ in range(kv.num_layers)]
        self.v = [torch.zeros(shape, dtype=kv.dtype, pin_memory=pin) for _ in range(kv.num_layers)]
        self.bytes_moved = 0

    def _idx(self, pairs, which):
        return torch.tensor([p[which] for p in pairs], dtype=torch.long)

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        if not pairs:
            return
        dev, cpu = self._idx(pairs, 0).to(self.kv.device), self._idx(pairs, 1)
        for layer in range(self.kv.num_layers):
            self.k[layer][cpu] = self.kv.k_cache[layer][dev].to("cpu")
            self.v[layer][cpu] = self.kv.v_cache[layer][dev].to("cpu")
        self.bytes_moved += len(pairs) * self.kv.bytes_per_block

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        if not pairs:
            return
        dev, cpu = self._idx(pairs, 0).to(self.kv.device), self._idx(pairs, 1)
        for layer in range(self.kv.num_layers):
            self.kv.k_cache[layer][dev] = self.k[layer][cpu].to(self.kv.device, non_blocking=True)
            self.kv.v_cache[layer][dev] = self.v[layer][cpu].to(self.kv.device, non_blocking=True)
        self.bytes_moved += len(pairs) * self.kv.bytes_per_block


class LLMEngine:
    """Continuous batching over a paged KV cache (see the module docstring).

    `num_blocks=None` sizes the pool from memory: on CUDA `GPU_MEMORY_FRACTION` of the memory free
    after the weights; on CPU enough for `max_batch_size` requests of `CPU_DEFAULT_TOKENS_PER_REQUEST`
    tokens (capped by `kv_cache.default_kv_budget_bytes`). `watermark` is the fraction of the pool
    admission leaves free so that running requests can grow without being preempted at once.
    `swap_blocks` sizes the CPU pool of `preemption="swap"` (default: as many blocks as the device
    pool, on CUDA capped at a quarter of the host's RAM); when it is full, a victim is recomputed instead. `max_batched_tokens` defaults to 512 with
    chunked prefill, else to the model's context. `debug=True` checks the scheduler's invariants
    after every step. A contiguous cache is `block_size=max_model_len`, `num_blocks=max_batch_size`.

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
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {watermark}")
        self.priority_aging = check_aging(priority_aging)
        self.model = model
        self.config = model.config
        self.tokenizer = tokenizer
        self.debug = debug
        self.device = torch.device(device) if device is not None else _model_device(model)
        self.dtype = _model_dtype(model)
        self.max_model_len = int(max_model_len or self.config.max_position_embeddings)
        self.block_size = block_size
        if max_batched_tokens is None:
            max_batched_tokens = max(512, max_batch_size) if enable_chunked_prefill else max(self.max_model_len, max_batch_size)
        if num_blocks is None:
            num_blocks = self._default_num_blocks(max_batch_size)
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.kv_cache = KVCache.for_model(self.config, num_blocks, block_size, dtype=self.dtype, device=self.device)
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.allocator = (PrefixCachingBlockAllocator if self.enable_prefix_caching else BlockAllocator)(num_blocks, block_size)
        eos = set(getattr(self.config, "eos_token_ids", None) or [])
        if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
            eos.add(int(tokenizer.eos_token_id))
        self.eos_token_ids = frozenset(eos)
        sched_cfg = SchedulerConfig(max_batch_size=max_batch_size, max_batched_tokens=max_batched_tokens,
                                    enable_chunked_prefill=enable_chunked_prefill, preemption=preemption,
                                    watermark_blocks=int(watermark * num_blocks), max_model_len=self.max_model_len,
                                    eos_token_ids=self.eos_token_ids, enable_prefix_caching=self.enable_prefix_caching)
        cpu_alloc, self.swapper = None, None
        if preemption == "swap":
            n_cpu = num_blocks if swap_blocks is None else swap_blocks
            if swap_blocks is None and self.device.type == "cuda":
                # a GPU pool can be tens of GiB: mirroring it in pinned host memory could exhaust RAM
                # (Colab has 12 GiB), so the default CPU pool takes at most a share of RAM
                per_block = self.kv_cache.bytes_per_block
                host = default_kv_budget_bytes("cpu", cpu_fraction=0.25, cpu_cap_bytes=16 << 30)
                n_cpu = min(n_cpu, max(1, host // per_block))
            cpu_alloc = BlockAllocator(max(n_cpu, 1), block_size)
            self.swapper = _TensorSwapper(self.kv_cache, max(n_cpu, 1))
        self.scheduler = Scheduler(self.allocator, sched_cfg, cpu_alloc, self.swapper)
        self.sampler = Sampler(seed)
        self.requests: dict[str, Sequence] = {}       # every request submitted and not yet reported done
        self.finished_ids: set[str] = set()           # debug: every request ends exactly once
        self.stats: list[StepStats] = []
        self._counter = itertools.count()
        self._seq_nos = itertools.count()
        self._step_no = 0

    # -- sizing ----------------------------------------------------------------------------------
    def _default_num_blocks(self, max_batch_size: int) -> int:
        cfg = self.config
        per_block = kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, self.dtype) * self.block_size
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            # memory torch's caching allocator holds but no tensor uses (an earlier engine's cache,
            # deleted) is free to this process, though the driver counts it as used
            free += torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
            return max(1, int(free * GPU_MEMORY_FRACTION) // per_block)
        want = max_batch_size * -(-min(CPU_DEFAULT_TOKENS_PER_REQUEST, self.max_model_len) // self.block_size)
        cap = default_kv_budget_bytes("cpu") // per_block
        return max(1, min(want, cap))

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
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        params.validate()  # fields may have been changed after construction
        ids = self._tokenize(prompt)
        if not ids:
            raise ValueError("empty prompt: a request needs at least one token")
        if len(ids) > self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens, longer than the model's context of {self.max_model_len}")
        vocab = self.config.vocab_size
        bad = [t for t in params.stop_token_ids if t >= vocab]
        if bad:
            raise ValueError(f"stop_token_ids {bad} are outside the vocabulary (size {vocab})")
        # the most KV this request can ever hold: prompt + all but the last generated token
        most = max(len(ids), min(len(ids) + params.max_tokens, self.max_model_len) - 1)
        need = -(-most // self.block_size)
        if need > self.num_blocks:
            raise ValueError(f"this request can need {most} tokens of KV = {need} blocks, more than the whole pool "
                             f"({self.num_blocks} blocks of {self.block_size}): it could never finish. "
                             "Lower max_tokens or give the engine more blocks.")
        first = -(-len(ids) // self.block_size)
        if not self.scheduler.config.enable_chunked_prefill and first > self.num_blocks - self.scheduler.config.watermark_blocks:
            raise ValueError(f"prompt needs {first} blocks but admission keeps {self.scheduler.config.watermark_blocks} "
                             f"of the {self.num_blocks} blocks free (watermark): it could never be admitted")
        if request_id is None:
            request_id = str(next(self._counter))
            while request_id in self.requests:
                request_id = str(next(self._counter))
        else:
            request_id = str(request_id)
            if request_id in self.requests:
                raise ValueError(f"request_id {request_id!r} is already in use")
        if priority is None:
            priority = params.priority
        elif isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an int, got {type(priority).__name__}")
        now = time.perf_counter() if arrival_time is None else float(arrival_time)
        seq = Sequence(request_id, ids, params, now, seq_no=next(self._seq_nos), generator=make_generator(params.seed))
        seq.priority = priority
        seq.sort_key = priority_key(priority, now, seq.seq_no, self.priority_aging)
        return seq

    def _tokenize(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise TypeError("a string prompt needs a tokenizer: pass tokenizer=... to LLMEngine, or give token ids")
            # serving engines encode prompts with the tokenizer's special tokens (BOS)
            encode = getattr(self.tokenizer, "encode_prompt", self.tokenizer.encode)
            return list(encode(prompt))
        if isinstance(prompt, torch.Tensor):
            prompt = prompt.flatten().tolist()
        if not isinstance(prompt, Iterable):
            raise TypeError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        ids = list(prompt)
        vocab = self.config.vocab_size
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int):
                try:
                    import operator
                    t = operator.index(t)
                except TypeError:
                    raise TypeError(f"prompt token ids must be ints, got {t!r} ({type(t).__name__})") from None
            if not 0 <= t < vocab:
                raise ValueError(f"prompt token id {t} is outside the vocabulary [0, {vocab})")
        return [int(t) for t in ids]

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

    @torch.inference_mode()
    def _step(self) -> list[Sequence]:
        sched = self.scheduler
        t0 = time.perf_counter()
        events = sched.begin_step()
        for seq in sched.reap():          # 1. reap
            self._done(seq)
        sched.budget()                    # 2. budget
        sched.admit()                     # 3. admit
        sched.preempt()                   # 4. preempt
        batch = sched.batch()             # 5. decode: the batch ...
        t1 = time.perf_counter()
        touched: list[Sequence] = []
        t2 = t3 = t1
        if batch.seqs:
            inputs = self._prepare(batch)
            t2 = time.perf_counter()
            logits = self.model(*inputs)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # honest forward time
            t3 = time.perf_counter()
            sampling = inputs[-1].numel() if inputs[-1] is not None else 0
            seqs = self._sampling_seqs
            tokens = self.sampler(logits, [s.params.temperature for s in seqs], [s.params.top_p for s in seqs],
                                  [s.generator for s in seqs]) if sampling else []
            touched = sched.update(batch, tokens, time.perf_counter())  # ... then the bookkeeping
        t4 = time.perf_counter()
        self._step_no += 1
        self.stats.append(StepStats(
            step=self._step_no, batch_size=len(batch.seqs), num_prefill_tokens=batch.num_prefill_tokens,
            num_decode_tokens=batch.num_decode_tokens, num_running=len(sched.running), num_waiting=len(sched.waiting),
            num_swapped=len(sched.swapped), blocks_used=self.allocator.num_used, num_preempted=len(events.preempted),
            blocks_swapped=events.blocks_swapped_out + events.blocks_swapped_in,
            num_finished=sum(s.finish_reason is not None for s in touched),
            schedule_time=t1 - t0, prepare_time=t2 - t1, forward_time=t3 - t2, sample_time=t4 - t3, start_time=t0))
        if self.debug:
            self.check_invariants()
        return touched

    def _prepare(self, batch: SchedulerOutput):
        """Flatten the ragged batch: token ids, attention metadata and the rows to sample from."""
        input_ids: list[int] = []
        query_lens, context_lens, tables, logits_idx = [], [], [], []
        sampling_seqs = []
        pos = 0
        for s in batch.seqs:
            q, nc = s.num_scheduled_tokens, s.num_computed_tokens
            if q == 1:
                input_ids.append(s.token_ids[nc])
            else:
                input_ids.extend(s.token_ids[nc:nc + q])
            pos += q
            query_lens.append(q)
            context_lens.append(nc + q)
            tables.append(s.block_table)
            if nc + q == len(s.token_ids):  # prefill complete (or a decode): sample from its last row
                logits_idx.append(pos - 1)
                sampling_seqs.append(s)
        self._sampling_seqs = sampling_seqs
        meta = AttentionMetadata.build(query_lens, context_lens, tables, self.block_size, self.device)
        ids = torch.tensor(input_ids, dtype=torch.long).to(self.device, non_blocking=True)
        idx = torch.tensor(logits_idx, dtype=torch.long).to(self.device, non_blocking=True)
        return ids, meta.positions, meta, self.kv_cache, idx

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
        if isinstance(prompts, str) or (isinstance(prompts, Seq) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # one prompt
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"{len(params)} sampling_params for {len(prompts)} prompts: give one, or one per prompt")
        seqs = []
        for i, (p, sp) in enumerate(zip(prompts, params)):
            try:
                seqs.append(self._make_sequence(p, sp, None, None))
            except (ValueError, TypeError) as exc:
                for s in seqs:  # leave the engine exactly as it was
                    del self.requests[s.request_id]
                raise type(exc)(f"prompt {i}: {exc}") from None
            self.requests[seqs[-1].request_id] = seqs[-1]  # reserve the id (so the next one differs)
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

    def _reap_all(self) -> None:
        """Return the blocks of requests that finished in the last step (the next step would do it)."""
        for seq in self.scheduler.reap():
            self._done(seq)

    # -- checks and numbers ----------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Scheduler invariants plus: every submitted request is either queued or ended exactly once."""
        self.scheduler.check_invariants()
        sched = self.scheduler
        live = {s.request_id for q in (sched.waiting, sched.running, sched.swapped) for s in q if s.finish_reason is None}
        ended = {rid for rid, s in self.requests.items() if s.finish_reason is not None}
        assert not (live & ended), f"requests both live and ended: {sorted(live & ended)[:5]}"
        submitted = set(self.requests)
        assert live | ended == submitted, f"requests lost: {sorted(submitted - live - ended)[:5]}"
        reaped_or_aborted = {rid for rid in self.finished_ids}
        assert reaped_or_aborted <= ended, "a request was reaped without finishing"

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


def _model_device(model: Any) -> torch.device:
    dev = getattr(model, "device", None)
    if isinstance(dev, torch.device):
        return dev
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


def _model_dtype(model: Any) -> torch.dtype:
    dt = getattr(model, "dtype", None)
    if isinstance(dt, torch.dtype):
        return dt
    try:
        return next(model.parameters()).dtype
    except (AttributeError, StopIteration):
        return torch.float32
