"""Static batching, the reference way: prefill every prompt in one ragged batch, then decode them together.

It uses a *contiguous* KV cache (one block of maximum length per request) and no scheduler — the
baseline the engine of later chapters improves on, and a yardstick for tests. `generate` is the
reference generator (chapter 1, the tests, `train_tiny`'s samples); `decode_static_batch` is its
loop, which the benchmark's static-batching mode (`inflight.bench.offline.runners.run_static`) runs too,
keeping finished rows in the batch and timing every step through `on_step`.
"""
from __future__ import annotations

from typing import Callable, Collection, Sequence

import torch

from inflight.model.attention_metadata import AttentionMetadata
from inflight.model.kv_cache import KVCache
from inflight.model.sampler import Sampler

__all__ = ["generate", "decode_static_batch", "StepHook"]

# on_step(outputs so far, rows that received a token this step, rows the forward pass computed)
StepHook = Callable[[Sequence[Sequence[int]], Sequence[int], int], None]


@torch.no_grad()
def generate(model, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], temperature: float = 0.0,
             top_p: float = 1.0, seed: int | None = None, eos_token_id: int | Sequence[int] | None = None,
             stop_at_eos: bool = True) -> list[list[int]]:
    """Generated token ids (prompt excluded) for each prompt; a sequence stops at end-of-sequence
    (unless `stop_at_eos` is False) or after its `max_new_tokens` (one number for all, or one each)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate needs at least one prompt, and no empty prompt")
    limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(limits) != len(prompts):
        raise ValueError(f"max_new_tokens has {len(limits)} entries for {len(prompts)} prompts")
    if min(limits) < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    cfg = model.config
    eos = set(cfg.eos_token_ids if eos_token_id is None else
              [eos_token_id] if isinstance(eos_token_id, int) else eos_token_id) if stop_at_eos else set()
    max_len = max(len(p) + m for p, m in zip(prompts, limits))
    if max_len > cfg.max_position_embeddings:
        raise ValueError(f"prompt + max_new_tokens = {max_len} exceeds the model's context "
                         f"({cfg.max_position_embeddings})")
    cache = KVCache.for_model(cfg, num_blocks=len(prompts), block_size=max_len, dtype=model.dtype, device=model.device)
    return decode_static_batch(model, cache, prompts, limits, temperature=temperature, top_p=top_p,
                               sampler=Sampler(seed if seed is not None else 0), eos=eos)


@torch.no_grad()
def decode_static_batch(model, cache: KVCache, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int], *,
                        temperature: float = 0.0, top_p: float = 1.0, sampler: Sampler | None = None,
                        eos: Collection[int] = (), keep_finished_rows: bool = False,
                        on_step: StepHook | None = None) -> list[list[int]]:
    """One static batch on a contiguous cache: row i of the batch owns block i of `cache` (a block
    of `cache.block_size` tokens, its maximum length). Step 0 prefills every prompt; each later step
    feeds every row its last token. Row i is done after `max_new_tokens[i]` tokens or a token in `eos`.

    `keep_finished_rows`: classic static batching — a finished row keeps its slot and is still
    computed until the whole batch is done (its extra tokens are discarded); otherwise finished rows
    leave the forward pass. `on_step`, when given, is called after each step's tokens reach the host.
    All rows sample from one shared random stream (`sampler`, default `Sampler(0)`)."""
    n = len(prompts)
    if n > cache.num_blocks:
        raise ValueError(f"a batch of {n} rows needs {n} blocks; the cache has {cache.num_blocks}")
    longest = max(max_new_tokens)  # a kept row grows until the longest row is done
    if any(len(p) + (longest if keep_finished_rows else m) > cache.block_size for p, m in zip(prompts, max_new_tokens)):
        raise ValueError(f"a row's prompt + the tokens it is computed for exceed the cache's block of "
                         f"{cache.block_size} tokens")
    sampler = sampler or Sampler(0)
    outs: list[list[int]] = [[] for _ in prompts]
    done = [False] * n
    cached = [len(p) for p in prompts]  # tokens in each row's block once this step's forward has run
    feed = [list(p) for p in prompts]  # each row's input tokens this step: its prompt, then its last token
    rows = list(range(n))  # the rows this step computes
    while rows:
        meta = AttentionMetadata.build([len(feed[i]) for i in rows], [cached[i] for i in rows],
                                       [[i] for i in rows], cache.block_size, model.device)
        ids = torch.tensor([t for i in rows for t in feed[i]], device=model.device)
        logits = model(ids, meta.positions, meta, cache, logits_indices=meta.query_start_loc[1:].long() - 1)
        tokens = sampler(logits, [temperature] * len(rows), [top_p] * len(rows), [None] * len(rows))
        got = [i for i in rows if not done[i]]
        for i, t in zip(rows, tokens):
            cached[i] += 1
            feed[i] = [t]
            if not done[i]:
                outs[i].append(t)
                done[i] = t in eos or len(outs[i]) >= max_new_tokens[i]
        if on_step is not None:
            on_step(outs, got, len(rows))
        if all(done):
            break
        if not keep_finished_rows:
            rows = [i for i in rows if not done[i]]
    return outs
