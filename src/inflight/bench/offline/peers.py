"""Mode 5: the peers — transformers' `generate` on static batches, and transformers' own continuous
batching — run on exactly our model's weights, on the same requests, on the same clock."""
from __future__ import annotations

import time
from typing import Any

import torch

from inflight.bench.offline.prompts import BenchRequest, Workload
from inflight.bench.offline.record import Arrivals, RunRecord, timed_run

__all__ = ["to_transformers", "run_hf_static", "run_hf_continuous"]


def to_transformers(model: Any) -> Any:
    """A transformers causal LM with exactly our model's weights (no end-of-sequence token, so that
    output lengths are set by the workload alone)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    d = model.config.to_hf()
    model_type = d.pop("model_type", "llama") or "llama"
    d.pop("architectures", None), d.pop("torch_dtype", None)
    d.update(eos_token_id=None, bos_token_id=None, pad_token_id=0)
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
    from transformers import StoppingCriteria, StoppingCriteriaList

    rec = RunRecord("hf_static", kv_bytes_per_token=kv_bytes_per_token, kv_allocated_bytes=0)
    stamps: list[float] = []

    class _Stamp(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kw: Any) -> torch.Tensor:
            stamps.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    with timed_run(rec, hf, workload.requests) as arrivals:
        for batch in arrivals.batches(batch_size):
            stamps.clear()
            gen = _generate_padded(hf, batch, StoppingCriteriaList([_Stamp()]))
            _record_static_batch(rec, batch, gen, [s - arrivals.start for s in stamps], kv_bytes_per_token)
    return rec


def _generate_padded(hf: Any, batch: list[BenchRequest], stopping: Any) -> list[list[int]]:
    """Greedy `generate` on the batch, left-padded to its longest prompt, for its longest output."""
    from transformers import GenerationConfig

    width = max(len(r.prompt) for r in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for i, r in enumerate(batch):
        ids[i, width - len(r.prompt):] = torch.tensor(r.prompt)
        mask[i, width - len(r.prompt):] = 1
    gc = GenerationConfig(max_new_tokens=max(r.output_len for r in batch), min_new_tokens=0, do_sample=False,
                          num_beams=1, eos_token_id=None, pad_token_id=0)
    out = hf.generate(input_ids=ids.to(hf.device), attention_mask=mask.to(hf.device), generation_config=gc,
                      stopping_criteria=stopping)
    return out[:, width:].tolist()


def _record_static_batch(rec: RunRecord, batch: list[BenchRequest], gen: list[list[int]], times: list[float],
                         kv_bytes_per_token: int) -> None:
    """Tokens, first-token / finish times and per-step facts of one `generate` batch."""
    longest = max(r.output_len for r in batch)
    if len(times) < longest:
        raise RuntimeError(f"generate produced {len(times)} steps, expected {longest}")
    width = max(len(r.prompt) for r in batch)
    rec.kv_allocated_bytes = max(rec.kv_allocated_bytes or 0, len(batch) * (width + longest) * kv_bytes_per_token)
    for r, tokens in zip(batch, gen):
        rec.tokens[r.id] = tokens[: r.output_len]
        rec.first_token[r.id] = times[0]
        rec.finish[r.id] = times[r.output_len - 1]
    for k in range(longest):
        rec.add_step(times[k], len(batch), sum(len(r.prompt) + k + 1 for r in batch if k < r.output_len))


@torch.no_grad()
def run_hf_continuous(hf: Any, workload: Workload, kv_bytes_per_token: int, kv_tokens: int | None = None,
                      page_size: int = 16) -> RunRecord:
    """transformers' continuous batching manager (its defaults, told the workload's shape; a KV pool
    of `kv_tokens` when given, so it has the same memory as our modes),
    greedy, each request with its own `max_new_tokens`, submitted at its arrival time."""
    rec = RunRecord("hf_continuous", kv_bytes_per_token=kv_bytes_per_token)
    reqs = workload.requests
    manager = _cb_manager(hf, reqs, kv_tokens, page_size)
    if kv_tokens and _cb_config(kv_tokens, page_size) is None:
        rec.notes.append("KV pool: transformers' default (this version's ContinuousBatchingConfig takes no page size)")
    elif kv_tokens:
        rec.notes.append(f"KV pool set to the same memory as ours: {kv_tokens // page_size} pages of {page_size}")
        rec.kv_allocated_bytes = (kv_tokens // page_size) * page_size * kv_bytes_per_token
    manager.warmup()  # builds its cache and batch processor, as generate_batch does, before the clock starts
    manager.start()
    try:
        with timed_run(rec, hf, reqs) as arrivals:
            results = _serve_cb(manager, reqs, arrivals)
    finally:
        manager.stop(block=True, timeout=30)
    start = arrivals.start
    # its background thread stamps every token: the run ends at the last one, not when we noticed
    rec.wall = max(max(res.timestamps or [0.0]) for res in results.values()) - start
    rec.idle = 0.0  # the background thread waits on its own; we cannot separate its idle time
    for r in reqs:
        res = results[r.id]
        rec.tokens[r.id] = list(res.generated_tokens)[: r.output_len]
        ts = res.timestamps or []
        if ts:
            rec.first_token[r.id] = ts[0] - start
            rec.finish[r.id] = ts[min(len(ts), r.output_len) - 1] - start
    rec.notes.append("batch size and token budget chosen by transformers' own defaults (WorkloadHints)")
    return rec


def _cb_manager(hf: Any, reqs: list[BenchRequest], kv_tokens: int | None, page_size: int) -> Any:
    """transformers' continuous batching manager, told the workload's shape (and our KV memory)."""
    from transformers import GenerationConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    longest = max(r.output_len for r in reqs)
    gc = GenerationConfig(max_new_tokens=longest, do_sample=False, num_beams=1, eos_token_id=-1, pad_token_id=0)
    hints = WorkloadHints(max_prompt_length=max(len(r.prompt) for r in reqs), max_generated_length=longest,
                          num_requests=len(reqs))
    cb_cfg = _cb_config(kv_tokens, page_size) if kv_tokens else None
    return hf.init_continuous_batching(generation_config=gc, continuous_batching_config=cb_cfg, workload_hints=hints)


def _cb_config(kv_tokens: int, page_size: int) -> Any:
    """The same KV memory as our cached modes, in pages of our paged block size. transformers
    versions spell the page size differently (`page_size`, earlier `block_size`); with neither,
    its own default pool (None), which the run's notes then say.

    The token budget per step is transformers' own default (8192, what recent versions choose here
    by themselves), said outright: given a pool but no budget, transformers 5.15 (Colab's) solves for
    the largest budget memory allows and allocates a budget x (pool + budget) attention mask up
    front, 22 GB for this pool, and the kernel kills the process."""
    from transformers import ContinuousBatchingConfig

    for size_name in ("page_size", "block_size"):
        try:
            return ContinuousBatchingConfig(**{size_name: page_size}, num_blocks=max(1, kv_tokens // page_size),
                                            max_batch_tokens=_cb_default_budget(), allow_block_sharing=False)
        except TypeError:
            continue
    return None


def _cb_default_budget() -> int:
    """transformers' default token budget per step of continuous batching (8192 where it does not say)."""
    try:
        from transformers.generation.continuous_batching.cache import PagedAttentionMemoryHandler
        return int(getattr(PagedAttentionMemoryHandler, "_default_max_batch_tokens", 8192))
    except ImportError:
        return 8192


def _serve_cb(manager: Any, reqs: list[BenchRequest], arrivals: Arrivals) -> dict[str, Any]:
    """Submit each request at its arrival time and collect every finished result."""
    results: dict[str, Any] = {}
    deadline = None
    while len(results) < len(reqs):
        for r in arrivals.arrived():
            manager.add_request(list(r.prompt), request_id=r.id, max_new_tokens=r.output_len, record_timestamps=True)
        wait = 0.05 if not arrivals else max(0.0, min(0.05, arrivals.until_next()))
        res = manager.get_result(timeout=wait if wait > 0 else 0.001)
        if res is not None and res.is_finished():
            if res.error:
                raise RuntimeError(f"transformers CB failed request {res.request_id}: {res.error}")
            results[res.request_id] = res
        if not manager.is_running():
            deadline = deadline or time.perf_counter() + 2
            if time.perf_counter() > deadline:
                raise RuntimeError("transformers' continuous batching thread stopped before finishing "
                                   f"({len(results)}/{len(reqs)} requests done)")
    return results
