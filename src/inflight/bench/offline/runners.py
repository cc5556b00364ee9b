"""Our four ways of serving a workload: sequential, static batches, and the engine over a contiguous
or a paged KV cache. Each returns a `RunRecord`; `inflight.bench.offline.suite.run_mode` picks one."""
from __future__ import annotations

from typing import Any

import torch

from inflight.bench.offline.prompts import BenchRequest, Workload
from inflight.bench.offline.record import Arrivals, RunRecord, kv_bytes_per_token, timed_run
from inflight.engine.llm_engine import LLMEngine, SamplingParams
from inflight.model.generate import StepHook, decode_static_batch
from inflight.model.kv_cache import KVCache

__all__ = ["run_static", "run_engine"]


@torch.no_grad()
def run_static(model: Any, workload: Workload, batch_size: int, max_len: int, mode: str = "static") -> RunRecord:
    """Static batching on our model: take up to `batch_size` arrived requests, prefill them in one
    ragged pass, decode every row until the batch's longest request is done (finished rows are
    still computed: their slot is held until the batch ends), then start the next batch. It is the
    reference generator's loop (`decode_static_batch`); `batch_size` 1 is the sequential mode."""
    cache = KVCache.for_model(model.config, num_blocks=batch_size, block_size=max_len, dtype=model.dtype,
                              device=model.device)
    rec = RunRecord(mode, kv_allocated_bytes=cache.nbytes, kv_bytes_per_token=cache.bytes_per_token)
    with timed_run(rec, model, workload.requests) as arrivals:
        for batch in arrivals.batches(batch_size):
            outs = decode_static_batch(model, cache, [r.prompt for r in batch], [r.output_len for r in batch],
                                       keep_finished_rows=True, on_step=_stamp_static(rec, batch, arrivals))
            rec.tokens.update((r.id, o) for r, o in zip(batch, outs))
    return rec


def _stamp_static(rec: RunRecord, batch: list[BenchRequest], arrivals: Arrivals) -> StepHook:
    """The per-step hook of a static batch: first-token and finish times, and the step's facts."""

    def on_step(outs, got, rows) -> None:
        now = arrivals.now()
        for i in got:
            if len(outs[i]) == 1:
                rec.first_token[batch[i].id] = now
            if len(outs[i]) == batch[i].output_len:
                rec.finish[batch[i].id] = now
        # a row that got a token this step holds its prompt and its earlier tokens in the cache
        rec.add_step(now, rows, sum(len(batch[i].prompt) + len(outs[i]) - 1 for i in got))

    return on_step


@torch.no_grad()
def run_engine(model: Any, workload: Workload, *, block_size: int, num_blocks: int, max_batch_size: int,
               mode: str, max_batched_tokens: int | None = None, full_batch: int | None = None,
               max_model_len: int | None = None) -> RunRecord:
    """Continuous batching with `inflight.LLMEngine`: each request is added at its arrival time and
    the engine steps while anything is unfinished. Times come from the engine's RequestOutputs, the
    split of each step (schedule / prepare / forward / sample) from its `stats`. `max_model_len` (the
    workload's longest request) sizes the block tables CUDA graphs replay with."""
    kwargs: dict[str, Any] = dict(block_size=block_size, num_blocks=num_blocks, max_batch_size=max_batch_size,
                                  stats_window=None, max_model_len=max_model_len)  # every step's stats: the figures below cover the whole run
    if max_batched_tokens is not None:
        kwargs["max_batched_tokens"] = max_batched_tokens
    engine = LLMEngine(model, **kwargs)
    bpt = kv_bytes_per_token(model)
    rec = RunRecord(mode, kv_allocated_bytes=num_blocks * block_size * bpt, kv_bytes_per_token=bpt)
    prompt_len = {r.id: len(r.prompt) for r in workload.requests}
    unfinished: set[str] = set()
    generated: dict[str, int] = {}  # tokens so far of each request that has been scheduled, until it finishes
    with timed_run(rec, model, workload.requests) as arrivals:
        while arrivals or unfinished:
            for r in arrivals.arrived():
                engine.add_request(r.prompt, SamplingParams(max_tokens=r.output_len, ignore_eos=True),
                                   request_id=r.id, arrival_time=arrivals.start + r.arrival)
                unfinished.add(r.id)
            if not unfinished:
                arrivals.wait_next()
                continue
            outs = engine.step()
            now = arrivals.now()
            for o in outs:
                generated[o.request_id] = len(o.token_ids)
                if o.finished:
                    rec.tokens[o.request_id] = list(o.token_ids)
                    rec.first_token[o.request_id] = o.first_token_time - arrivals.start
                    rec.finish[o.request_id] = o.finish_time - arrivals.start
                    unfinished.discard(o.request_id)
                    del generated[o.request_id]
            if outs:
                rec.add_step(now, len(outs), sum(prompt_len[rid] + n for rid, n in generated.items()))
    rec.engine_stats = _engine_stats(engine, block_size * bpt, full_batch)
    rec.step_stats = [s for s in engine.stats if s.batch_size]
    rec.step_tokens = [s.num_prefill_tokens + s.num_decode_tokens for s in rec.step_stats]
    rec.step_sequences = [s.batch_size for s in rec.step_stats]
    return rec


def _engine_stats(engine: Any, block_bytes: int, full_batch: int | None) -> dict[str, Any]:
    """The engine's own summary, plus the KV it held on average and its step split at a full batch."""
    out = dict(engine.summary())
    st = [s for s in engine.stats if s.batch_size]
    if not st:
        return out
    out["kv_held_mean_bytes"] = sum(s.blocks_used for s in st) / len(st) * block_bytes
    out["max_running"] = max(s.num_running for s in st)
    full = [s for s in st if full_batch and s.batch_size >= full_batch]
    if full:  # the overhead target is stated at a full batch: measure it on exactly those steps
        total = sum(s.step_time for s in full)
        out["full_batch"] = full_batch
        out["full_batch_steps"] = len(full)
        out["full_batch_sched_prep_share"] = sum(s.schedule_time + s.prepare_time for s in full) / total
        out["full_batch_step_ms"] = total / len(full) * 1e3
    return out
