"""A minimal reference generator: prefill every prompt in one ragged batch, then decode them together.

It uses a *contiguous* KV cache (one block of maximum length per request) and no scheduler — the
baseline the engine of later chapters improves on, and a yardstick for tests.
"""
from __future__ import annotations

from typing import Sequence

import torch

from inflight.model.attention_metadata import AttentionMetadata
from inflight.model.kv_cache import KVCache
from inflight.model.sampler import Sampler

__all__ = ["generate"]


@torch.no_grad()
def generate(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float = 0.0,
             top_p: float = 1.0, seed: int | None = None, eos_token_id: int | Sequence[int] | None = None,
             stop_at_eos: bool = True) -> list[list[int]]:
    """Generated token ids (prompt excluded) for each prompt; a sequence stops at end-of-sequence."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate needs at least one prompt, and no empty prompt")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    cfg, dev = model.config, model.device
    eos = set(cfg.eos_token_ids if eos_token_id is None else
              [eos_token_id] if isinstance(eos_token_id, int) else eos_token_id) if stop_at_eos else set()
    max_len = max(len(p) for p in prompts) + max_new_tokens
    if max_len > cfg.max_position_embeddings:
        raise ValueError(f"prompt + max_new_tokens = {max_len} exceeds the model's context "
                         f"({cfg.max_position_embeddings})")
    cache = KVCache.for_model(cfg, num_blocks=len(prompts), block_size=max_len, dtype=model.dtype, device=dev)
    sampler = Sampler(seed if seed is not None else 0)  # one shared random stream for all rows
    outs: list[list[int]] = [[] for _ in prompts]
    lens = [len(p) for p in prompts]
    running = list(range(len(prompts)))
    # step 0 prefills every prompt; later steps feed each running sequence its last token
    tokens = [list(p) for p in prompts]
    query_lens = list(lens)
    while running:
        meta = AttentionMetadata.build(query_lens, [lens[i] for i in running], [[i] for i in running], max_len, dev)
        ids = torch.tensor([t for i in running for t in tokens[i]], device=dev)
        last = meta.query_start_loc[1:].long() - 1
        logits = model(ids, meta.positions, meta, cache, logits_indices=last)
        n = len(running)
        nxt = sampler(logits, [temperature] * n, [top_p] * n, [None] * n)
        still = []
        for i, t in zip(running, nxt):
            outs[i].append(t)
            lens[i] += 1
            tokens[i] = [t]
            if t not in eos and len(outs[i]) < max_new_tokens:
                still.append(i)
        running, query_lens = still, [1] * len(still)
    return outs
