"""`python -m inflight.bench`: the benchmark the book and the README quote.

Same weights, same prompts and the same per-request output lengths for every mode:

1. `sequential`   — our model, one request at a time (also the reference for correctness),
2. `static`       — our model, batches of B, each batch runs until its longest request ends
                    (finished rows keep their slot and are computed, as in classic static batching),
3. `contiguous`   — our engine, continuous batching, B slots of maximum length (block_size = max length),
4. `paged`        — our engine, continuous batching over a paged cache of the same KV memory,
5. `hf_static`    — transformers `generate` on left-padded static batches of B,
6. `hf_continuous`— transformers' own continuous batching (per-request `max_new_tokens`).

Output lengths are fixed by the workload (end-of-sequence ignored), so every mode does the same
useful work; every mode's greedy tokens are compared with the sequential run, and a mode whose
tokens differ gets no speed reported. A peer that can't run is reported unavailable, with its error.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib
import json
import math
import os
import platform
import random
import sys
import tempfile
import time
import traceback
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from inflight.stats import percentile
from inflight.bench.profiling import ForwardTimer, PeakMemory, measure_matmul_flops, measure_memory_bandwidth, \
    model_flops_per_token, sync

__all__ = ["BenchRequest", "Workload", "RunRecord", "MODES", "make_workload", "run_mode", "summarize",
           "check_outputs", "ideal_speedup", "device_limits", "run_benchmark", "format_table", "main"]

MODES = ["sequential", "static", "contiguous", "paged", "hf_static", "hf_continuous"]
MODE_TITLES = {
    "sequential": "1 sequential (ours)",
    "static": "2 static batching (ours)",
    "contiguous": "3 continuous, contiguous KV",
    "paged": "4 continuous, paged KV",
    "hf_static": "5a transformers generate",
    "hf_continuous": "5b transformers CB",
}
OURS = ("sequential", "static", "contiguous", "paged")


# --------------------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------------------
@dataclass
class BenchRequest:
    """One request: its prompt token ids, how many tokens it must generate, when it arrives (s)."""

    id: str
    prompt: list[int]
    output_len: int
    arrival: float = 0.0


@dataclass
class Workload:
    name: str
    requests: list[BenchRequest]
    rate: float | None = None  # requests per second for an online workload, None = all at t=0

    @property
    def useful_tokens(self) -> int:
        return sum(r.output_len for r in self.requests)

    @property
    def max_len(self) -> int:
        return max(len(r.prompt) + r.output_len for r in self.requests)


def _prompt_ids(rng: random.Random, n: int, vocab_size: int) -> list[int]:
    # byte-level vocabularies: printable ASCII keeps the prompts text-like; else any id
    lo, hi = (32, 127) if 127 <= vocab_size <= 300 else (0, vocab_size)
    return [rng.randrange(lo, hi) for _ in range(n)]


def make_workload(kind: str, n: int, seed: int, vocab_size: int, *, max_context: int = 10**9,
                  prompt_range: tuple[int, int] = (16, 128), output_mean: float = 48, output_cap: int = 256,
                  rate: float | None = None) -> Workload:
    """Seeded requests. `kind`: "long_tailed" (capped exponential outputs, mean `output_mean`, cap
    `output_cap`) or "uniform" (outputs uniform in [1, 2·mean]); prompts uniform in `prompt_range`.
    With `rate`, arrivals are a Poisson process of `rate` requests per second (the same requests)."""
    from inflight.sim.workloads import capped_exponential

    if kind not in ("long_tailed", "uniform"):
        raise ValueError(f"unknown workload kind {kind!r} (long_tailed | uniform)")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    lo, hi = prompt_range
    if not 1 <= lo <= hi:
        raise ValueError(f"prompt_range must be 1 <= low <= high, got {prompt_range}")
    rng = random.Random(f"bench-{kind}-{seed}")
    reqs = []
    for i in range(n):
        p = rng.randint(lo, hi)
        if kind == "long_tailed":
            o = capped_exponential(rng, output_mean, output_cap)
        else:
            o = rng.randint(1, max(1, int(2 * output_mean)))
        o = max(1, min(o, max_context - p))
        if o < 1 or p >= max_context:
            raise ValueError(f"prompt of {p} tokens leaves no room in a context of {max_context}")
        reqs.append(BenchRequest(f"r{i:04d}", _prompt_ids(rng, p, vocab_size), o))
    name = kind
    if rate is not None:
        if not rate > 0:
            raise ValueError(f"rate must be positive, got {rate}")
        arr = random.Random(f"bench-arrivals-{seed}-{rate}")
        t = 0.0
        for r in reqs:
            r.arrival = t
            t += arr.expovariate(rate)  # the first request arrives at 0
        name = f"{kind}@{rate:.3g}/s"
    return Workload(name, reqs, rate)


# --------------------------------------------------------------------------------------------------
# Raw records of one run
# --------------------------------------------------------------------------------------------------
@dataclass
class RunRecord:
    """What one mode did on one workload: tokens, per-request times (s since start), per-step facts."""

    mode: str
    tokens: dict[str, list[int]] = field(default_factory=dict)
    first_token: dict[str, float] = field(default_factory=dict)
    finish: dict[str, float] = field(default_factory=dict)
    wall: float = 0.0  # start -> last token
    idle: float = 0.0  # time spent waiting for requests to arrive (online workloads)
    forward_seconds: float | None = None
    forward_calls: int = 0
    forward_tokens: int = 0  # input tokens fed to the model's forward (prefill + decode, padding included)
    step_batch: list[int] = field(default_factory=list)  # sequences in each forward pass
    step_time: list[float] = field(default_factory=list)  # when each step ended (s since start)
    kv_used_tokens: list[int] = field(default_factory=list)  # tokens of unfinished requests in cache, per step
    kv_allocated_bytes: int | None = None
    kv_bytes_per_token: int | None = None
    peak_memory_bytes: int | None = None
    engine_stats: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def take_instruments(self, ft: ForwardTimer, pm: PeakMemory) -> None:
        """Copy what the forward-pass timer and the peak-memory sampler saw during the run."""
        self.forward_seconds, self.forward_calls, self.forward_tokens = ft.seconds, ft.calls, ft.tokens
        self.peak_memory_bytes = pm.peak_bytes


class _Arrivals:
    """Hands out requests whose arrival time has passed, and sleeps until the next one when idle."""

    def __init__(self, requests: Sequence[BenchRequest], start: float):
        self.pending = deque(sorted(requests, key=lambda r: r.arrival))
        self.start = start
        self.idle = 0.0

    def now(self) -> float:
        return time.perf_counter() - self.start

    def arrived(self, limit: int | None = None) -> list[BenchRequest]:
        now, out = self.now(), []
        while self.pending and self.pending[0].arrival <= now and (limit is None or len(out) < limit):
            out.append(self.pending.popleft())
        return out

    def wait_next(self) -> None:
        if self.pending:
            delay = self.pending[0].arrival - self.now()
            if delay > 0:
                time.sleep(delay)
                self.idle += delay

    def __bool__(self) -> bool:
        return bool(self.pending)


def _kv_bytes_per_token(model: Any) -> int:
    from inflight.model.kv_cache import kv_bytes_per_token

    cfg = model.config
    return kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, model.dtype)


# --------------------------------------------------------------------------------------------------
# Modes 1 and 2: our model, static batches over a contiguous cache
# --------------------------------------------------------------------------------------------------
@torch.no_grad()
def run_static(model: Any, workload: Workload, batch_size: int, max_len: int, mode: str = "static") -> RunRecord:
    """Static batching on our model: take up to `batch_size` arrived requests, prefill them in one
    ragged pass, decode every row until the batch's longest request is done (finished rows are
    still computed: their slot is held until the batch ends), then start the next batch."""
    from inflight.model.attention_metadata import AttentionMetadata
    from inflight.model.kv_cache import KVCache

    dev = model.device
    cache = KVCache.for_model(model.config, num_blocks=batch_size, block_size=max_len, dtype=model.dtype, device=dev)
    rec = RunRecord(mode, kv_allocated_bytes=cache.nbytes, kv_bytes_per_token=cache.bytes_per_token)
    with ForwardTimer(model) as ft, PeakMemory(dev) as pm:
        start = time.perf_counter()
        arrivals = _Arrivals(workload.requests, start)
        while arrivals:
            batch = arrivals.arrived(batch_size)
            if not batch:
                arrivals.wait_next()
                continue
            n = len(batch)
            lens = [len(r.prompt) for r in batch]
            tables = [[i] for i in range(n)]
            meta = AttentionMetadata.build(lens, lens, tables, max_len, dev)
            ids = torch.tensor([t for r in batch for t in r.prompt], device=dev)
            logits = model(ids, meta.positions, meta, cache, logits_indices=meta.query_start_loc[1:].long() - 1)
            nxt = logits.argmax(-1)
            outs: list[list[int]] = [[] for _ in batch]
            longest = max(r.output_len for r in batch)
            for step in range(longest):
                toks = nxt.tolist()  # the one device->host copy per step
                now = arrivals.now()
                used = 0
                for i, (r, tok) in enumerate(zip(batch, toks)):
                    if len(outs[i]) < r.output_len:
                        outs[i].append(tok)
                        if len(outs[i]) == 1:
                            rec.first_token[r.id] = now
                        if len(outs[i]) == r.output_len:
                            rec.finish[r.id] = now
                        used += lens[i]
                rec.step_batch.append(n)
                rec.step_time.append(now)
                rec.kv_used_tokens.append(used)
                if step == longest - 1:
                    break
                lens = [x + 1 for x in lens]
                meta = AttentionMetadata.build([1] * n, lens, tables, max_len, dev)
                nxt = model(nxt, meta.positions, meta, cache).argmax(-1)
            for r, o in zip(batch, outs):
                rec.tokens[r.id] = o
        sync(dev)
        rec.wall = time.perf_counter() - start
        rec.idle = arrivals.idle
    rec.take_instruments(ft, pm)
    return rec


# --------------------------------------------------------------------------------------------------
# Modes 3 and 4: our engine
# --------------------------------------------------------------------------------------------------
@torch.no_grad()
def run_engine(model: Any, workload: Workload, *, block_size: int, num_blocks: int, max_batch_size: int,
               mode: str, max_batched_tokens: int | None = None, full_batch: int | None = None) -> RunRecord:
    """Continuous batching with `inflight.LLMEngine`: each request is added at its arrival time and
    the engine steps while anything is unfinished. Times come from the engine's RequestOutputs, the
    split of each step (schedule / prepare / forward / sample) from its `stats`."""
    from inflight.engine.llm_engine import LLMEngine, SamplingParams

    kwargs: dict[str, Any] = dict(block_size=block_size, num_blocks=num_blocks, max_batch_size=max_batch_size,
                                  stats_window=None)  # every step's stats: the figures below cover the whole run
    if max_batched_tokens is not None:
        kwargs["max_batched_tokens"] = max_batched_tokens
    engine = LLMEngine(model, **kwargs)
    dev = model.device
    bpt = _kv_bytes_per_token(model)
    rec = RunRecord(mode, kv_allocated_bytes=num_blocks * block_size * bpt, kv_bytes_per_token=bpt)
    by_id = {r.id: r for r in workload.requests}
    ntok: dict[str, int] = {}
    unfinished: set[str] = set()
    with ForwardTimer(model) as ft, PeakMemory(dev) as pm:
        start = time.perf_counter()
        arrivals = _Arrivals(workload.requests, start)
        while arrivals or unfinished:
            for r in arrivals.arrived():
                engine.add_request(r.prompt, SamplingParams(max_tokens=r.output_len, ignore_eos=True),
                                   request_id=r.id, arrival_time=start + r.arrival)
                unfinished.add(r.id)
            if not unfinished:
                arrivals.wait_next()
                continue
            outs = engine.step()
            now = arrivals.now()
            for o in outs:
                ntok[o.request_id] = len(o.token_ids)
                if o.finished:
                    rec.tokens[o.request_id] = list(o.token_ids)
                    rec.first_token[o.request_id] = o.first_token_time - start
                    rec.finish[o.request_id] = o.finish_time - start
                    unfinished.discard(o.request_id)
                    del ntok[o.request_id]
            if outs:
                rec.step_batch.append(len(outs))
                rec.step_time.append(now)
                rec.kv_used_tokens.append(sum(len(by_id[rid].prompt) + n for rid, n in ntok.items()))
        sync(dev)
        rec.wall = time.perf_counter() - start
        rec.idle = arrivals.idle
    rec.take_instruments(ft, pm)
    rec.engine_stats = dict(engine.summary())
    st = [s for s in engine.stats if s.batch_size]
    if st:
        rec.engine_stats["kv_held_mean_bytes"] = sum(s.blocks_used for s in st) / len(st) * block_size * bpt
        rec.engine_stats["max_running"] = max(s.num_running for s in st)
        full = [s for s in st if full_batch and s.batch_size >= full_batch]
        if full:  # the overhead target is stated at a full batch: measure it on exactly those steps
            tot = sum(s.step_time for s in full)
            rec.engine_stats["full_batch"] = full_batch
            rec.engine_stats["full_batch_steps"] = len(full)
            rec.engine_stats["full_batch_sched_prep_share"] = sum(s.schedule_time + s.prepare_time for s in full) / tot
            rec.engine_stats["full_batch_step_ms"] = tot / len(full) * 1e3
    return rec


# --------------------------------------------------------------------------------------------------
# Mode 5: the peers, transformers
# --------------------------------------------------------------------------------------------------
def to_transformers(model: Any) -> Any:
    """A transformers causal LM with exactly our model's weights (no end-of-sequence token, so that
    output lengths are set by the workload alone)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    d = model.config.to_hf()
    model_type = d.pop("model_type", "llama") or "llama"
    d.pop("architectures", None), d.pop("torch_dtype", None)
    d["eos_token_id"] = None
    d["bos_token_id"] = None
    d["pad_token_id"] = 0
    cfg = AutoConfig.for_model(model_type, **d)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=model.dtype)
    missing, unexpected = hf.load_state_dict(model.hf_state_dict(), strict=False)
    if getattr(cfg, "tie_word_embeddings", False):  # lm_head shares the embedding (SmolLM2, Qwen2.5-0.5B)
        hf.tie_weights()
        missing = [k for k in missing if k != "lm_head.weight"]
    missing = [k for k in missing if "rotary" not in k]
    if missing or unexpected:
        raise RuntimeError(f"weights don't map onto transformers' {type(hf).__name__}: missing {missing[:4]}, "
                           f"unexpected {unexpected[:4]}")
    hf.generation_config.eos_token_id = None
    hf.generation_config.bos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf.to(model.device).eval()


@torch.no_grad()
def run_hf_static(hf: Any, workload: Workload, batch_size: int, kv_bytes_per_token: int) -> RunRecord:
    """transformers `generate`, greedy, on left-padded batches of up to `batch_size` arrived requests;
    each batch runs to its longest request's length. A stopping criterion stamps every step's time."""
    from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

    dev = hf.device
    rec = RunRecord("hf_static", kv_bytes_per_token=kv_bytes_per_token, kv_allocated_bytes=0)
    stamps: list[float] = []

    class _Stamp(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kw: Any) -> torch.Tensor:
            stamps.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    with ForwardTimer(hf) as ft, PeakMemory(dev) as pm:
        start = time.perf_counter()
        arrivals = _Arrivals(workload.requests, start)
        while arrivals:
            batch = arrivals.arrived(batch_size)
            if not batch:
                arrivals.wait_next()
                continue
            width = max(len(r.prompt) for r in batch)
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            mask = torch.zeros(len(batch), width, dtype=torch.long)
            for i, r in enumerate(batch):
                ids[i, width - len(r.prompt):] = torch.tensor(r.prompt)
                mask[i, width - len(r.prompt):] = 1
            longest = max(r.output_len for r in batch)
            gc = GenerationConfig(max_new_tokens=longest, min_new_tokens=0, do_sample=False, num_beams=1,
                                  eos_token_id=None, pad_token_id=0)
            stamps.clear()
            out = hf.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), generation_config=gc,
                              stopping_criteria=StoppingCriteriaList([_Stamp()]))
            gen = out[:, width:].tolist()
            times = [s - start for s in stamps]
            if len(times) < longest:
                raise RuntimeError(f"generate produced {len(times)} steps, expected {longest}")
            rec.kv_allocated_bytes = max(rec.kv_allocated_bytes or 0,
                                         len(batch) * (width + longest) * kv_bytes_per_token)
            for i, r in enumerate(batch):
                rec.tokens[r.id] = gen[i][: r.output_len]
                rec.first_token[r.id] = times[0]
                rec.finish[r.id] = times[r.output_len - 1]
            for k in range(longest):
                rec.step_batch.append(len(batch))
                rec.step_time.append(times[k])
                rec.kv_used_tokens.append(sum(len(r.prompt) + k + 1 for r in batch if k < r.output_len))
        sync(dev)
        rec.wall = time.perf_counter() - start
        rec.idle = arrivals.idle
    rec.take_instruments(ft, pm)
    return rec


@torch.no_grad()
def run_hf_continuous(hf: Any, workload: Workload, kv_bytes_per_token: int, kv_tokens: int | None = None,
                      page_size: int = 16) -> RunRecord:
    """transformers' continuous batching manager (its defaults, told the workload's shape; a KV pool
    of `kv_tokens` when given, so it has the same memory as our modes),
    greedy, each request with its own `max_new_tokens`, submitted at its arrival time."""
    from transformers import GenerationConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    dev = hf.device
    rec = RunRecord("hf_continuous", kv_bytes_per_token=kv_bytes_per_token)
    reqs = workload.requests
    gc = GenerationConfig(max_new_tokens=max(r.output_len for r in reqs), do_sample=False, num_beams=1,
                          eos_token_id=-1, pad_token_id=0)
    hints = WorkloadHints(max_prompt_length=max(len(r.prompt) for r in reqs),
                          max_generated_length=max(r.output_len for r in reqs), num_requests=len(reqs))
    cb_cfg = None
    if kv_tokens:
        from transformers import ContinuousBatchingConfig

        # the same KV memory as our cached modes, in pages of our paged block size
        cb_cfg = ContinuousBatchingConfig(page_size=page_size, num_blocks=max(1, kv_tokens // page_size),
                                          allow_block_sharing=False)
        rec.notes.append(f"KV pool set to the same memory as ours: {kv_tokens // page_size} pages of {page_size}")
    manager = hf.init_continuous_batching(generation_config=gc, continuous_batching_config=cb_cfg,
                                          workload_hints=hints)
    manager.warmup()  # builds its cache and batch processor, as generate_batch does, before the clock starts
    results: dict[str, Any] = {}
    with ForwardTimer(hf) as ft, PeakMemory(dev) as pm:
        manager.start()
        try:
            start = time.perf_counter()
            arrivals = _Arrivals(reqs, start)
            deadline = None
            while len(results) < len(reqs):
                for r in arrivals.arrived():
                    manager.add_request(list(r.prompt), request_id=r.id, max_new_tokens=r.output_len,
                                        record_timestamps=True)
                wait = 0.05
                if arrivals:
                    wait = max(0.0, min(wait, arrivals.pending[0].arrival - arrivals.now()))
                res = manager.get_result(timeout=wait) if wait > 0 else manager.get_result(timeout=0.001)
                if res is not None and res.is_finished():
                    if res.error:
                        raise RuntimeError(f"transformers CB failed request {res.request_id}: {res.error}")
                    results[res.request_id] = res
                if not manager.is_running():
                    deadline = deadline or time.perf_counter() + 2
                    if time.perf_counter() > deadline:
                        raise RuntimeError("transformers' continuous batching thread stopped before finishing "
                                           f"({len(results)}/{len(reqs)} requests done)")
            rec.wall = max(max(res.timestamps or [0.0]) for res in results.values()) - start
            rec.idle = 0.0  # the background thread waits on its own; we cannot separate its idle time
        finally:
            manager.stop(block=True, timeout=30)
    for r in reqs:
        res = results[r.id]
        rec.tokens[r.id] = list(res.generated_tokens)[: r.output_len]
        ts = res.timestamps or []
        if ts:
            rec.first_token[r.id] = ts[0] - start
            rec.finish[r.id] = ts[min(len(ts), r.output_len) - 1] - start
    rec.take_instruments(ft, pm)
    rec.notes.append("batch size and token budget chosen by transformers' own defaults (WorkloadHints)")
    if kv_tokens:
        rec.kv_allocated_bytes = (kv_tokens // page_size) * page_size * kv_bytes_per_token
    return rec


# --------------------------------------------------------------------------------------------------
# Dispatch, correctness, metrics
# --------------------------------------------------------------------------------------------------
@dataclass
class BenchSetup:
    """Everything a mode needs besides the workload."""

    model: Any
    batch_size: int
    max_len: int  # longest prompt + output any request of any workload may reach
    paged_block_size: int = 16
    hf: Any = None
    hf_error: str | None = None
    max_batched_tokens: int | None = None

    @property
    def kv_tokens(self) -> int:
        """The KV memory every cached mode gets, in tokens: B slots of maximum length."""
        return self.batch_size * self.max_len

    @property
    def paged_num_blocks(self) -> int:
        return self.kv_tokens // self.paged_block_size

    @property
    def paged_max_batch(self) -> int:
        # "as many requests as the same memory holds": never fewer seqs than blocks allow one block each
        return self.paged_num_blocks


def run_mode(mode: str, setup: BenchSetup, workload: Workload) -> RunRecord:
    """Run one mode on one workload and return its raw record (exceptions propagate)."""
    m = setup.model
    if mode == "sequential":
        return run_static(m, workload, 1, setup.max_len, mode="sequential")
    if mode == "static":
        return run_static(m, workload, setup.batch_size, setup.max_len, mode="static")
    if mode == "contiguous":
        return run_engine(m, workload, block_size=setup.max_len, num_blocks=setup.batch_size,
                          max_batch_size=setup.batch_size, mode="contiguous",
                          max_batched_tokens=setup.max_batched_tokens, full_batch=setup.batch_size)
    if mode == "paged":
        return run_engine(m, workload, block_size=setup.paged_block_size, num_blocks=setup.paged_num_blocks,
                          max_batch_size=setup.paged_max_batch, mode="paged",
                          max_batched_tokens=setup.max_batched_tokens, full_batch=setup.batch_size)
    if mode in ("hf_static", "hf_continuous"):
        if setup.hf is None:
            raise RuntimeError(f"transformers model unavailable: {setup.hf_error}")
        bpt = _kv_bytes_per_token(m)
        if mode == "hf_static":
            return run_hf_static(setup.hf, workload, setup.batch_size, bpt)
        return run_hf_continuous(setup.hf, workload, bpt, setup.kv_tokens, setup.paged_block_size)
    raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")


def check_outputs(workload: Workload, reference: dict[str, list[int]], got: dict[str, list[int]]) -> str | None:
    """None when every request's tokens equal the reference's; else a sentence saying where they differ."""
    bad = []
    for r in workload.requests:
        want = reference.get(r.id, [])[: r.output_len]
        have = got.get(r.id)
        if have is None:
            bad.append((r.id, "no output", None))
            continue
        have = list(have)[: r.output_len]
        if have != want:
            k = next((i for i, (a, b) in enumerate(zip(have, want)) if a != b), min(len(have), len(want)))
            detail = (f"token {k}: got {have[k] if k < len(have) else 'nothing'}, "
                      f"expected {want[k] if k < len(want) else 'nothing'}")
            bad.append((r.id, detail, k))
    if not bad:
        return None
    rid, detail, _ = bad[0]
    return (f"{len(bad)} of {len(workload.requests)} requests differ from the sequential reference; "
            f"first: {rid} at {detail}")


def _pct(values: Sequence[float], q: float) -> float | None:
    """`percentile` (numpy's linear interpolation), None for no values so the JSON stays valid."""
    return percentile(values, q) if len(values) else None


def summarize(rec: RunRecord, workload: Workload, mismatch: str | None = None) -> dict[str, Any]:
    """The figures of one mode: speeds (unless its outputs differ), latencies, memory, overhead."""
    reqs = workload.requests
    ttft = [rec.first_token[r.id] - r.arrival for r in reqs if r.id in rec.first_token]
    tpot = [(rec.finish[r.id] - rec.first_token[r.id]) / (r.output_len - 1)
            for r in reqs if r.output_len > 1 and r.id in rec.finish and r.id in rec.first_token]
    e2e = [rec.finish[r.id] - r.arrival for r in reqs if r.id in rec.finish]
    busy = max(rec.wall - rec.idle, 1e-12)
    bpt = rec.kv_bytes_per_token or 0
    used = rec.kv_used_tokens
    out: dict[str, Any] = {
        "mode": rec.mode,
        "title": MODE_TITLES.get(rec.mode, rec.mode),
        "status": "ok" if mismatch is None else "outputs differ",
        "reason": mismatch,
        "requests": len(reqs),
        "useful_tokens": workload.useful_tokens,
        "wall_s": rec.wall,
        "idle_s": rec.idle,
        "tokens_per_s": workload.useful_tokens / rec.wall if rec.wall > 0 else None,
        "requests_per_s": len(reqs) / rec.wall if rec.wall > 0 else None,
        "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99),
        "tpot_p50_s": _pct(tpot, 50), "tpot_p99_s": _pct(tpot, 99),
        "e2e_p50_s": _pct(e2e, 50), "e2e_p99_s": _pct(e2e, 99),
        "steps": len(rec.step_batch),
        "forward_calls": rec.forward_calls,
        "forward_tokens": rec.forward_tokens,
        "mean_batch": sum(rec.step_batch) / len(rec.step_batch) if rec.step_batch else None,
        "max_batch": max(rec.step_batch) if rec.step_batch else None,
        "forward_s": rec.forward_seconds,
        "outside_forward_share": (None if rec.forward_seconds is None else max(0.0, 1 - rec.forward_seconds / busy)),
        "kv_allocated_bytes": rec.kv_allocated_bytes,
        "kv_used_mean_bytes": (sum(used) / len(used) * bpt) if used and bpt else None,
        "kv_used_peak_bytes": (max(used) * bpt) if used and bpt else None,
        "peak_memory_bytes": rec.peak_memory_bytes,
        "engine_stats": rec.engine_stats,
        "notes": rec.notes,
        "ttft_s": ttft, "tpot_s": tpot,
        "batch_over_time": _thin({"t": rec.step_time, "batch": rec.step_batch}),
    }
    es = rec.engine_stats
    if es.get("forward_time") is not None:  # the engine's own split of its steps
        step_total = sum(es.get(k, 0.0) for k in ("schedule_time", "prepare_time", "forward_time", "sample_time"))
        if step_total > 0:
            out["schedule_share"] = es["schedule_time"] / step_total
            out["prepare_share"] = es["prepare_time"] / step_total
            out["sample_share"] = es["sample_time"] / step_total
            out["sched_prep_share"] = (es["schedule_time"] + es["prepare_time"]) / step_total
    if out["kv_allocated_bytes"] and out["kv_used_mean_bytes"] is not None:
        out["kv_used_share"] = out["kv_used_mean_bytes"] / out["kv_allocated_bytes"]
    else:
        out["kv_used_share"] = None
    if mismatch is not None:  # refuse to report a speed for outputs that differ
        for key in ("tokens_per_s", "requests_per_s", "wall_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
                    "tpot_p99_s", "e2e_p50_s", "e2e_p99_s"):
            out[key] = None
        out["ttft_s"], out["tpot_s"] = [], []
    return out


def _thin(series: dict[str, list], limit: int = 1500) -> dict[str, list]:
    """Every k-th point of parallel lists so that at most `limit` remain (keeps the JSON small)."""
    n = len(next(iter(series.values()), []))
    k = max(1, -(-n // limit))
    return {key: vals[::k] for key, vals in series.items()}


def ideal_speedup(workload: Workload, batch_size: int) -> dict[str, Any]:
    """The simulator's step counts for static vs continuous batching with `batch_size` slots on these
    output lengths (one token per request per step): the best continuous batching can do here."""
    from inflight.sim.schedulers import ContinuousBatchScheduler, StaticBatchScheduler
    from inflight.sim.simulate import simulate
    from inflight.sim.workloads import from_lengths

    lens = [r.output_len for r in workload.requests]
    w = from_lengths(lens)
    st = simulate(StaticBatchScheduler(batch_size), w)
    co = simulate(ContinuousBatchScheduler(batch_size), w)
    # rows a padded static batch computes vs rows that produce a useful token: the speedup when a
    # step's cost grows with its rows (compute-bound), as opposed to steps that cost the same
    static_rows = sum(len(lens[i:i + batch_size]) * max(lens[i:i + batch_size]) for i in range(0, len(lens), batch_size))
    return {"batch_size": batch_size, "static_steps": st.steps, "continuous_steps": co.steps,
            "static_utilization": st.utilization, "continuous_utilization": co.utilization,
            "ideal_speedup": st.steps / co.steps,
            "static_row_steps": static_rows, "useful_row_steps": sum(lens),
            "work_bound_speedup": static_rows / sum(lens)}


def device_limits(model: Any, mean_context: float, batch_sizes: dict[str, float], measure_seconds: float = 0.5
                  ) -> dict[str, Any]:
    """What the hardware allows this model: a compute roof (measured matmul FLOP/s over FLOPs per
    token) and, per batch size, a bandwidth roof (weights + the batch's KV read once per step)."""
    dev = model.device
    flops = measure_matmul_flops(dev, model.dtype if model.dtype != torch.float16 or dev.type == "cuda"
                                 else torch.float32, min_seconds=measure_seconds)
    bw = measure_memory_bandwidth(dev, min_seconds=measure_seconds)
    fpt = model_flops_per_token(model.config, mean_context)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bpt = _kv_bytes_per_token(model)
    roofs = {}
    for name, b in batch_sizes.items():
        if not b:
            continue
        step_bytes = weight_bytes + b * mean_context * bpt
        roofs[name] = {"batch": b, "bytes_per_step": step_bytes,
                       "bandwidth_roof_tokens_per_s": b * bw / step_bytes,
                       "roof_tokens_per_s": min(flops / fpt, b * bw / step_bytes)}
    return {"matmul_flops_per_s": flops, "memory_bytes_per_s": bw, "model_flops_per_token": fpt,
            "mean_context": mean_context, "weight_bytes": weight_bytes, "kv_bytes_per_token": bpt,
            "compute_roof_tokens_per_s": flops / fpt, "per_mode": roofs}


# --------------------------------------------------------------------------------------------------
# The whole benchmark
# --------------------------------------------------------------------------------------------------
@dataclass
class BenchConfig:
    n: int = 256
    batch_size: int = 64
    seed: int = 0
    modes: list[str] = field(default_factory=lambda: list(MODES))
    workloads: list[str] = field(default_factory=lambda: ["long_tailed", "uniform", "online"])
    output_mean: float = 48
    output_cap: int = 256
    prompt_range: tuple[int, int] = (16, 128)
    rate_fractions: list[float] = field(default_factory=lambda: [0.25, 0.5, 1.0, 2.0])
    online_n: int = 96
    online_modes: list[str] = field(default_factory=lambda: ["static", "paged"])
    paged_block_size: int = 16
    max_batched_tokens: int | None = None
    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    attention_bench: bool = True
    prefix_bench: bool = True
    quick: bool = False
    threads: int | None = None


def quick_config(**overrides: Any) -> BenchConfig:
    """The CI smoke test: a few dozen short requests, every mode, one online rate — under a minute."""
    cfg = BenchConfig(n=24, batch_size=8, output_mean=12, output_cap=48, prompt_range=(8, 32),
                      rate_fractions=[1.0], online_n=16, workloads=["long_tailed", "online"], quick=True)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def random_model(seed: int = 0, vocab_size: int = 257, device: str | None = None) -> Any:
    """A random Llama of the tiny model's shape (4 layers, 256 wide, 2 KV heads): the stand-in when no trained model is at hand."""
    from inflight.model.llama import LlamaConfig, LlamaModel

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return LlamaModel(cfg).eval().to(device or "cpu")


def load_model(cfg: BenchConfig) -> tuple[Any, str]:
    """(model, description): `--model` via `load_pretrained`, else the shipped tiny model, else random."""
    from inflight.device import pick_device

    device = pick_device(cfg.device)
    # float32 unless asked otherwise: every mode must produce the same greedy tokens, and in bf16/fp16
    # a different batch composition changes the rounding and with it some tokens (seen on an H200:
    # 3-20 of 64 continuations differed and every batched mode was refused).
    dtype = getattr(torch, cfg.dtype) if cfg.dtype else torch.float32
    if cfg.model:
        from inflight.model.loading import load_pretrained

        return load_pretrained(cfg.model, device=device, dtype=dtype).eval(), cfg.model
    try:
        from inflight.model.loading import TINY_PATH, load_tiny

        model, _tok = load_tiny()
        model.weights_sha256 = _sha256(TINY_PATH / "model.safetensors")
        return model.to(device, dtype).eval(), "inflight tiny model (load_tiny)"
    except Exception as exc:  # the shipped model may not exist yet on a development checkout
        return random_model(cfg.seed, device=device), f"random 4-layer 256-wide Llama (load_tiny failed: {exc})"


def _sha256(path: Path) -> str | None:
    import hashlib

    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info: dict[str, Any] = {"platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(),
                            "torch_threads": torch.get_num_threads(), "hostname_hash": hash(platform.node()) % 10**6}
    with contextlib.suppress(OSError, AttributeError):
        info["loadavg_start"] = list(os.getloadavg())
    return info


def _versions() -> dict[str, str]:
    import inflight

    v = {"python": platform.python_version(), "torch": torch.__version__, "inflight": inflight.__version__}
    for name in ("transformers", "triton", "numpy"):
        try:
            v[name] = __import__(name).__version__
        except Exception:
            v[name] = "not installed"
    return v


def _section(module: str, **kwargs: Any) -> dict[str, Any]:
    """Another benchmark module's figures (`collect(**kwargs)` + `report`), when that module is here."""
    try:
        mod = importlib.import_module(f"inflight.bench.{module}")
    except Exception as exc:
        return {"status": "unavailable", "error": f"{type(exc).__name__}: {exc}"}
    try:
        res = mod.collect(**kwargs)
        text = mod.report(res)
    except Exception as exc:
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    return {"status": "ok", "results": json.loads(json.dumps(res, default=str)), "report": text}


def _attention_section(quick: bool) -> dict[str, Any]:
    """The paged-KV chapter's figures (`inflight.bench.attention`)."""
    return _section("attention", quick=quick)


def _prefix_section(quick: bool, model: Any) -> dict[str, Any]:
    """The sharing chapter's figures (`inflight.bench.prefix`): prefix caching on vs off."""
    return _section("prefix", model=model, quick=quick)


def _targets(results: dict[str, Any], batch_size: int) -> dict[str, Any]:
    lt = results["workloads"].get("long_tailed", {}).get("modes", {})

    def tps(mode: str) -> float | None:
        m = lt.get(mode) or {}
        return m.get("tokens_per_s")

    t: dict[str, Any] = {}
    ideal = results["workloads"].get("long_tailed", {}).get("ideal")
    if ideal and tps("contiguous") and tps("static"):
        realized = tps("contiguous") / tps("static")
        frac = realized / ideal["ideal_speedup"]
        t["continuous_realizes_90pct_of_ideal"] = {
            "ideal_speedup": ideal["ideal_speedup"], "realized_speedup": realized, "fraction": frac,
            "work_bound_speedup": ideal["work_bound_speedup"],
            "fraction_of_work_bound": realized / ideal["work_bound_speedup"], "met": frac >= 0.9}
    if ideal and tps("paged") and tps("static"):
        t["paged_vs_static_speedup"] = {"value": tps("paged") / tps("static")}
    if tps("paged") and tps("hf_static"):
        r = tps("paged") / tps("hf_static")
        t["paged_3x_hf_static"] = {"ratio": r, "met": r >= 3}
    if tps("paged") and tps("hf_continuous"):
        r = tps("paged") / tps("hf_continuous")
        t["paged_5x_hf_continuous"] = {"ratio": r, "met": r >= 5}
    share = {}
    for m in ("contiguous", "paged"):
        es = (lt.get(m) or {}).get("engine_stats") or {}
        if es.get("full_batch_sched_prep_share") is not None:
            share[m] = {"sched_prep_share_at_full_batch": es["full_batch_sched_prep_share"],
                        "steps_at_full_batch": es.get("full_batch_steps"),
                        "step_ms_at_full_batch": es.get("full_batch_step_ms"),
                        "outside_forward_share_whole_run": (lt.get(m) or {}).get("outside_forward_share")}
    if share:
        worst = max(v["sched_prep_share_at_full_batch"] for v in share.values())
        t["sched_prep_under_10pct_at_batch"] = {"batch_size": batch_size, "modes": share, "met": worst < 0.10}
    return t


def run_benchmark(cfg: BenchConfig, model: Any = None, progress: bool = True,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every requested workload × mode; return the results dict that `--out` saves as JSON.
    `model` (an inflight LlamaModel) overrides `cfg.model`, e.g. one a notebook already loaded."""
    from tqdm.auto import tqdm

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    bad = [m for m in cfg.modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown mode(s) {bad}; choose from {MODES}")
    torch.manual_seed(cfg.seed)
    if model is None:
        model, model_desc = load_model(cfg)
    else:
        model_desc = getattr(model, "name_or_path", None) or f"{type(model).__name__} passed in"
    mcfg = model.config
    max_ctx = mcfg.max_position_embeddings
    ctx_needed = cfg.prompt_range[1] + cfg.output_cap
    max_len = min(ctx_needed, max_ctx)
    setup = BenchSetup(model, cfg.batch_size, max_len, cfg.paged_block_size, max_batched_tokens=cfg.max_batched_tokens)
    if any(m.startswith("hf_") for m in cfg.modes + cfg.online_modes):
        try:
            setup.hf = to_transformers(model)
        except Exception as exc:
            setup.hf_error = f"{type(exc).__name__}: {exc}"
    results: dict[str, Any] = {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m inflight.bench"] + sys.argv[1:]) if sys.argv and "bench" in sys.argv[0] else None,
        "machine": _machine(), "versions": _versions(), "seed": cfg.seed,
        "config": {k: v for k, v in asdict(cfg).items()},
        "model": {"source": model_desc, "device": str(model.device), "dtype": str(model.dtype),
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "weights_sha256": getattr(model, "weights_sha256", None),
                  "config": {k: getattr(mcfg, k) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                          "num_hidden_layers", "num_attention_heads",
                                                          "num_key_value_heads", "head_dim",
                                                          "max_position_embeddings")}},
        "kv_memory": {"tokens": setup.kv_tokens, "bytes": setup.kv_tokens * _kv_bytes_per_token(model),
                      "contiguous": {"slots": cfg.batch_size, "block_size": max_len},
                      "paged": {"block_size": cfg.paged_block_size, "num_blocks": setup.paged_num_blocks,
                                "max_batch_size": setup.paged_max_batch}},
        "workloads": {},
    }
    from inflight.device import describe_device

    results["device"] = describe_device()

    # what to run: (workload, modes)
    plan: list[tuple[Workload, list[str]]] = []
    lt = make_workload("long_tailed", cfg.n, cfg.seed, mcfg.vocab_size, max_context=max_len,
                       prompt_range=cfg.prompt_range, output_mean=cfg.output_mean, output_cap=cfg.output_cap)
    if "long_tailed" in cfg.workloads or "online" in cfg.workloads:
        plan.append((lt, list(MODES) if "long_tailed" in cfg.workloads else ["sequential"]))
    if "uniform" in cfg.workloads:
        un = make_workload("uniform", cfg.n, cfg.seed, mcfg.vocab_size, max_context=max_len,
                           prompt_range=cfg.prompt_range, output_mean=cfg.output_mean, output_cap=cfg.output_cap)
        plan.append((un, list(MODES)))
    for w, modes in plan:  # the reference always runs; the others only when asked
        modes[:] = ["sequential"] + [m for m in modes if m in cfg.modes and m != "sequential"]

    total = sum(len(m) for _, m in plan) + (len(cfg.rate_fractions) * len(cfg.online_modes)
                                             if "online" in cfg.workloads else 0)
    bar = tqdm(total=total, desc="bench", disable=not progress, leave=True)
    refs: dict[str, dict[str, list[int]]] = {}
    for w, modes in plan:
        wres: dict[str, Any] = {"requests": len(w.requests), "useful_tokens": w.useful_tokens,
                                "output_lens": [r.output_len for r in w.requests],
                                "prompt_lens": [len(r.prompt) for r in w.requests],
                                "ideal": ideal_speedup(w, cfg.batch_size), "modes": {}}
        results["workloads"][w.name] = wres
        for mode in modes:
            bar.set_postfix_str(f"{w.name}: {mode}")
            wres["modes"][mode] = _run_one(mode, setup, w, refs, log)
            bar.update(1)
        if "sequential" not in cfg.modes and "sequential" in wres["modes"]:
            wres["modes"]["sequential"]["reported"] = False  # ran as the reference only
        ideal = wres["ideal"]
        st, co = (wres["modes"].get(m, {}).get("tokens_per_s") for m in ("static", "contiguous"))
        if st and co:
            ideal["realized_speedup"] = co / st
            ideal["realized_fraction"] = co / st / ideal["ideal_speedup"]

    if "online" in cfg.workloads:
        # rates relative to what the paged engine sustains offline on this machine, so "several
        # rates" mean the same load on any hardware; fall back to static's capacity
        lt_modes = results["workloads"][lt.name]["modes"]
        cap = next((lt_modes[m]["requests_per_s"] for m in ("paged", "static", "sequential")
                    if m in lt_modes and lt_modes[m].get("requests_per_s")), None)
        online: dict[str, Any] = {"capacity_requests_per_s": cap, "rates": {}}
        results["workloads"]["online"] = online
        if cap:
            base = lt.requests[: cfg.online_n]
            for frac in cfg.rate_fractions:
                rate = frac * cap
                w = make_workload("long_tailed", cfg.n, cfg.seed, mcfg.vocab_size, max_context=max_len,
                                  prompt_range=cfg.prompt_range, output_mean=cfg.output_mean,
                                  output_cap=cfg.output_cap, rate=rate)
                w.requests = w.requests[: len(base)]
                entry = {"rate_requests_per_s": rate, "fraction_of_capacity": frac, "modes": {}}
                online["rates"][f"{frac:g}"] = entry
                for mode in cfg.online_modes:
                    bar.set_postfix_str(f"online {frac:g}x: {mode}")
                    entry["modes"][mode] = _run_one(mode, setup, w, refs, log, ref_key=lt.name)
                    bar.update(1)
    bar.close()

    # the hardware's limits for this model
    lt_modes = results["workloads"].get(lt.name, {}).get("modes", {})
    mean_ctx = sum(len(r.prompt) + r.output_len / 2 for r in lt.requests) / len(lt.requests)
    batches = {m: v.get("mean_batch") for m, v in lt_modes.items() if v.get("mean_batch")}
    try:
        lim = device_limits(model, mean_ctx, batches, 0.2 if cfg.quick else 0.5)
        for m, v in lt_modes.items():
            roof = lim["per_mode"].get(m, {}).get("roof_tokens_per_s")
            if roof and v.get("tokens_per_s"):
                v["fraction_of_roof"] = v["tokens_per_s"] / roof
        results["device_limits"] = lim
    except Exception as exc:
        results["device_limits"] = {"error": f"{type(exc).__name__}: {exc}"}
    results["attention_bench"] = (_attention_section(cfg.quick) if cfg.attention_bench
                                  else {"status": "skipped"})
    results["prefix_caching"] = (_prefix_section(cfg.quick, model) if cfg.prefix_bench
                                 else {"status": "skipped"})
    results["targets"] = _targets(results, cfg.batch_size)
    with contextlib.suppress(OSError, AttributeError):
        results["machine"]["loadavg_end"] = list(os.getloadavg())
    return results


def _run_one(mode: str, setup: BenchSetup, w: Workload, refs: dict[str, dict[str, list[int]]],
             log: Callable[[str], None], ref_key: str | None = None) -> dict[str, Any]:
    """Run a mode, check its tokens against the reference, summarise; failures become an entry."""
    key = ref_key or w.name
    load_before = _loadavg()
    try:
        rec = run_mode(mode, setup, w)
    except Exception as exc:
        err = f"{type(exc).__name__}: {exc}"
        log(f"  {MODE_TITLES.get(mode, mode)} on {w.name}: unavailable — {err}")
        return {"mode": mode, "title": MODE_TITLES.get(mode, mode), "status": "unavailable", "error": err,
                "traceback": traceback.format_exc(limit=6)}
    if mode == "sequential" and key not in refs:
        refs[key] = rec.tokens
    mismatch = check_outputs(w, refs[key], rec.tokens) if key in refs else "no reference run to compare with"
    if mismatch:
        log(f"  {MODE_TITLES.get(mode, mode)} on {w.name}: NOT reporting a speed — {mismatch}")
    out = summarize(rec, w, mismatch)
    # other processes on the machine skew timings: keep the 1-minute load average around each run
    out["loadavg_1min"] = [load_before, _loadavg()]
    return out


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


# --------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------
def _f(x: Any, fmt: str, scale: float = 1.0) -> str:
    return "—" if x is None else format(x * scale, fmt)


def format_table(modes: dict[str, dict[str, Any]]) -> str:
    """A fixed-width table of one workload's modes."""
    head = (f"{'mode':30} {'tok/s':>8} {'req/s':>7} {'TTFT p50/p99 ms':>17} {'TPOT p50/p99 ms':>16} "
            f"{'batch':>6} {'KV MiB':>7} {'KV used':>7} {'peak MiB':>8} {'not fwd':>7}")
    lines = [head, "-" * len(head)]
    for m in MODES:
        v = modes.get(m)
        if v is None:
            continue
        title = v.get("title", m)
        if v.get("status") == "unavailable":
            lines.append(f"{title:30} unavailable: {v.get('error', '')[:90]}")
            continue
        if v.get("status") == "outputs differ":
            lines.append(f"{title:30} REFUSED (outputs differ): {v.get('reason', '')[:90]}")
            continue
        ttft = f"{_f(v['ttft_p50_s'], '.0f', 1e3)}/{_f(v['ttft_p99_s'], '.0f', 1e3)}"
        tpot = f"{_f(v['tpot_p50_s'], '.1f', 1e3)}/{_f(v['tpot_p99_s'], '.1f', 1e3)}"
        lines.append(f"{title:30} {_f(v['tokens_per_s'], '8.0f')} {_f(v['requests_per_s'], '7.2f')} {ttft:>17} "
                     f"{tpot:>16} {_f(v['mean_batch'], '6.1f')} {_f(v['kv_allocated_bytes'], '7.1f', 2**-20)} "
                     f"{_f(v['kv_used_share'], '7.0%')} {_f(v['peak_memory_bytes'], '8.0f', 2**-20)} "
                     f"{_f(v['outside_forward_share'], '7.0%')}")
    return "\n".join(lines)


def format_report(results: dict[str, Any]) -> str:
    """Everything a reader wants on stdout: tables per workload, online sweep, limits, targets."""
    out = [f"device: {results['device']}", f"model: {results['model']['source']} "
           f"({results['model']['parameters'] / 1e6:.2f}M parameters, {results['model']['dtype']})",
           f"KV memory for every cached mode: {results['kv_memory']['tokens']} tokens "
           f"({results['kv_memory']['bytes'] / 2**20:.1f} MiB)"]
    for name, w in results["workloads"].items():
        if name == "online":
            continue
        out += ["", f"== {name}: {w['requests']} requests, {w['useful_tokens']} tokens to generate =="]
        out.append(format_table(w["modes"]))
        ideal = w["ideal"]
        line = (f"simulator, {ideal['batch_size']} slots: static {ideal['static_steps']} steps, continuous "
                f"{ideal['continuous_steps']} steps → ideal speedup {ideal['ideal_speedup']:.2f}x if every step "
                f"costs the same, {ideal['work_bound_speedup']:.2f}x if a step costs in proportion to its rows")
        if "realized_speedup" in ideal:
            line += (f"; realized (contiguous/static tok/s) {ideal['realized_speedup']:.2f}x = "
                     f"{ideal['realized_fraction']:.0%} of ideal")
        out.append(line)
    online = results["workloads"].get("online")
    if online and online.get("rates"):
        out += ["", f"== online (Poisson arrivals; capacity ≈ {online['capacity_requests_per_s']:.2f} req/s) =="]
        for frac, e in online["rates"].items():
            for m, v in e["modes"].items():
                if v.get("status") != "ok":
                    out.append(f"  {frac}x {m:12} {v.get('status')}: {v.get('reason') or v.get('error')}")
                    continue
                out.append(f"  rate {e['rate_requests_per_s']:6.2f}/s ({frac}x) {MODE_TITLES[m]:28} "
                           f"{v['tokens_per_s']:7.0f} tok/s  TTFT p50 {_f(v['ttft_p50_s'], '.0f', 1e3)} ms "
                           f"p99 {_f(v['ttft_p99_s'], '.0f', 1e3)} ms  TPOT p50 {_f(v['tpot_p50_s'], '.1f', 1e3)} ms")
    lim = results.get("device_limits", {})
    if "matmul_flops_per_s" in lim:
        out += ["", f"device limits: matmul {lim['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s, copy "
                    f"{lim['memory_bytes_per_s'] / 1e9:.1f} GB/s; model {lim['model_flops_per_token'] / 1e6:.2f} "
                    f"MFLOP/token → compute roof {lim['compute_roof_tokens_per_s']:.0f} tok/s"]
        lt = results["workloads"].get("long_tailed", {}).get("modes", {})
        for m, r in lim["per_mode"].items():
            frac = lt.get(m, {}).get("fraction_of_roof")
            out.append(f"  {MODE_TITLES.get(m, m):30} batch {r['batch']:5.1f}: roof {r['roof_tokens_per_s']:8.0f} "
                       f"tok/s, achieved {_f(frac, '.1%')}")
    att = results.get("attention_bench", {})
    out += ["", f"attention bench (inflight.bench.attention): {att.get('status')}"
                + (f" ({att.get('error')})" if att.get("error") else "")]
    if att.get("report"):
        out.append(att["report"])
    pre = results.get("prefix_caching", {})
    out += ["", f"prefix caching (inflight.bench.prefix): {pre.get('status')}"
                + (f" ({pre.get('error')})" if pre.get("error") else "")]
    if pre.get("report"):
        out.append(pre["report"])
    out += ["", "targets:"]
    for k, v in results.get("targets", {}).items():
        out.append(f"  {k}: {json.dumps(v, default=lambda x: round(x, 3) if isinstance(x, float) else str(x))}")
    return "\n".join(out)


def _jsonable(x: Any) -> Any:
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else round(x, 6)
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def save_results(results: dict[str, Any], path: str | Path) -> None:
    """Write the results as indented JSON (floats rounded, NaN as null)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_jsonable(results), indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


def _parse_modes(text: str) -> list[str]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if part.isdigit() and 1 <= int(part) <= 4:
            out.append(MODES[int(part) - 1])
        elif part == "5":
            out += ["hf_static", "hf_continuous"]
        elif part in MODES:
            out.append(part)
        else:
            raise argparse.ArgumentTypeError(f"unknown mode {part!r}: use 1-5 or {', '.join(MODES)}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inflight.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="CI smoke: tiny workload, under a minute")
    p.add_argument("--workload", default=None,
                   help="comma list of long_tailed, uniform, online (default: all; --quick: long_tailed,online)")
    p.add_argument("--modes", type=_parse_modes, default=None, help=f"comma list of 1-5 or {', '.join(MODES)}")
    p.add_argument("--model", default=None, help="checkpoint folder or hub id (default: the shipped tiny model)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None,
                   help="e.g. bfloat16 (default float32: half precision makes greedy tokens depend on the batch, and the check refuses such modes)")
    p.add_argument("-n", "--num-requests", type=int, default=None)
    p.add_argument("-B", "--batch-size", type=int, default=None, help="slots of the static/contiguous modes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--no-attention-bench", action="store_true")
    p.add_argument("--no-prefix-bench", action="store_true", help="skip the prefix-caching section")
    p.add_argument("--out", default=None, help="write the results JSON here (e.g. results/bench_cpu.json)")
    args = p.parse_args(argv)
    cfg = quick_config() if args.quick else BenchConfig()
    if args.workload:
        cfg.workloads = [w.strip() for w in args.workload.split(",") if w.strip()]
        unknown = set(cfg.workloads) - {"long_tailed", "uniform", "online"}
        if unknown:
            p.error(f"unknown workload(s) {sorted(unknown)}")
    if args.modes:
        cfg.modes = args.modes
        cfg.online_modes = [m for m in cfg.online_modes if m in cfg.modes] or cfg.online_modes
    for name, value in (("n", args.num_requests), ("batch_size", args.batch_size)):
        if value is not None:
            if value < 1:
                p.error(f"--{name.replace('_', '-')} must be >= 1")
            setattr(cfg, name, value)
    cfg.seed, cfg.model, cfg.device, cfg.dtype, cfg.threads = args.seed, args.model, args.device, args.dtype, args.threads
    cfg.attention_bench = not args.no_attention_bench
    cfg.prefix_bench = not args.no_prefix_bench
    results = run_benchmark(cfg)
    print()
    print(format_report(results))
    if args.out:
        save_results(results, args.out)
        print(f"\nresults written to {args.out}")
    return 0

