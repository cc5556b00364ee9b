"""Paged attention over a ragged batch: a plain-torch reference and a dispatcher to a Triton kernel.

The reference gathers every sequence's keys and values through its block table with ONE index
operation for the whole batch (padded to the longest context, with a mask), then runs one batched
`scaled_dot_product_attention`. No Python loop over tokens or sequences: the same code serves a
prefill of 500 tokens, 64 decodes, or both at once.

Two splits keep the padding small, both computed once per step and shared by every layer:
- a batch that mixes decodes (one query each) with prefill chunks runs them apart: padding 63
  decodes to the length of one 100-token chunk would compute 64 x 100 query rows instead of 163, and
  continuous batching mixes the two in almost every step;
- many decodes are grouped by context length (a few groups of similar lengths), because with
  long-tailed lengths one 400-token context would otherwise make every short sequence gather and
  score 400 keys.
On CUDA the dispatcher splits a mixed batch the same way, so that its decodes still take the Triton
kernel (which walks each context itself and needs no length groups) while its prefill chunks take
the reference.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from inflight.model.attention_metadata import AttentionMetadata

__all__ = ["write_kv", "paged_attention", "attention", "last_backend"]

_last_backend: str | None = None


def last_backend() -> str | None:
    """Which implementation the last `attention` call used: "torch" (reference) or "triton"."""
    return _last_backend


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Scatter new keys/values `[T, kv_heads, head_dim]` into their slots of one layer's cache."""
    nb, bs, kvh, d = k_cache.shape
    k_cache.view(nb * bs, kvh, d).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(nb * bs, kvh, d).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float) -> torch.Tensor:
    """Reference attention for a mixed prefill/decode batch: q `[T, H, D]` -> `[T, H, D]`.

    Causal within each sequence, over everything in its cache (earlier chunks included); grouped-query
    attention when H is a multiple of the cache's kv heads."""
    T, H, D = q.shape
    nb, bs, kvh, _ = k_cache.shape
    if H % kvh:
        raise ValueError(f"{H} query heads is not a multiple of {kvh} kv heads")
    out = _by_parts(paged_attention, q, k_cache, v_cache, meta, scale, group_lengths=True)
    if out is not None:  # decodes apart from prefill chunks, in groups of similar context length
        return out
    g = H // kvh
    d = meta.derived()
    S, Q, L = meta.num_seqs, meta.max_query_len, meta.max_context_len
    # one gather for the whole batch: [S, L, kvh, D] -> [S, kvh, L, D]
    # (index_select on flat slots: ~10x faster on CPU than advanced indexing with a 2-D index)
    slots = d["kv_slots"].reshape(-1)
    k = k_cache.view(nb * bs, kvh, D).index_select(0, slots).view(S, L, kvh, D).permute(0, 2, 1, 3)
    v = v_cache.view(nb * bs, kvh, D).index_select(0, slots).view(S, L, kvh, D).permute(0, 2, 1, 3)
    if meta.is_decode:
        qp = q.view(S, kvh, g, D)  # decode: each sequence's single query; its g heads share a kv head
        mask = d["mask"][:, None, :, :]  # [S, 1, 1, L]
    else:
        qp = q.new_zeros(S, Q, H, D)
        qp[d["tok_seq"], d["tok_idx"]] = q
        # fold the g query heads of each kv head into the query axis, so K/V are never repeated
        qp = qp.view(S, Q, kvh, g, D).permute(0, 2, 3, 1, 4).reshape(S, kvh, g * Q, D)
        mask = d["mask"][:, None, None].expand(S, 1, g, Q, L).reshape(S, 1, g * Q, L)
    out = F.scaled_dot_product_attention(qp, k.to(q.dtype), v.to(q.dtype), attn_mask=mask, scale=scale)
    if meta.is_decode:
        return out.reshape(T, H, D)
    out = out.view(S, kvh, g, Q, D).permute(0, 3, 1, 2, 4).reshape(S, Q, H, D)
    return out[d["tok_seq"], d["tok_idx"]]


def _subset(meta: AttentionMetadata, seqs: list[int], tokens: torch.Tensor) -> AttentionMetadata:
    """The metadata of some of a batch's sequences (their tokens: `tokens`, positions in the flat batch)."""
    dev = meta.context_lens.device
    idx = torch.tensor(seqs, dtype=torch.long, device=dev)
    q = [meta.query_lens[i] for i in seqs]
    c = [meta.context_lens_list[i] for i in seqs]
    starts = torch.zeros(len(q) + 1, dtype=torch.int32)
    starts[1:] = torch.cumsum(torch.tensor(q, dtype=torch.int32), 0)
    width = -(-max(c) // meta.block_size)  # only the block-table columns these sequences use
    part = AttentionMetadata(
        query_start_loc=starts.to(dev), context_lens=meta.context_lens.index_select(0, idx),
        block_tables=meta.block_tables.index_select(0, idx)[:, :width].contiguous(),
        slot_mapping=meta.slot_mapping.index_select(0, tokens), positions=meta.positions.index_select(0, tokens),
        max_query_len=max(q), max_context_len=max(c), is_decode=all(x == 1 for x in q),
        block_size=meta.block_size, query_lens=q, context_lens_list=c)
    part._derived.update(parts=None, parts_ungrouped=None)  # a part is never split again
    return part


MIN_GROUP = 16  # decodes per length group: fewer would cost more in calls than they save in padding
MAX_GROUPS = 8


def _length_groups(seqs: list[int], lens: list[int]) -> list[list[int]]:
    """Sequences sorted by context length and cut into at most MAX_GROUPS groups of equal size."""
    n_groups = max(1, min(MAX_GROUPS, len(seqs) // MIN_GROUP))
    order = sorted(seqs, key=lambda i: lens[i])
    size = -(-len(order) // n_groups)
    return [order[k:k + size] for k in range(0, len(order), size)]


def _partition(meta: AttentionMetadata, group_lengths: bool):
    """[(part, its token indices in the flat batch), ...] when the batch is worth splitting, else None:
    decodes apart from prefill chunks, and with `group_lengths` the decodes in groups of similar
    context length (padding matters to the reference, not to the kernel, which walks each context).
    Computed once per step and shared by every layer (it lives in the metadata's per-step cache)."""
    cache = meta._derived
    key = "parts" if group_lengths else "parts_ungrouped"
    if key not in cache:
        decode = [i for i, n in enumerate(meta.query_lens) if n == 1]
        prefill = [i for i, n in enumerate(meta.query_lens) if n > 1]
        groups = []
        if decode:
            groups += _length_groups(decode, meta.context_lens_list) if group_lengths else [decode]
        if prefill:
            groups.append(prefill)
        if len(groups) < 2:
            cache[key] = None
        else:
            starts = meta.query_start_loc.tolist()
            dev = meta.slot_mapping.device
            parts = []
            for seqs in groups:
                tokens = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in seqs]).to(dev)
                parts.append((_subset(meta, seqs, tokens), tokens))
            cache[key] = parts
    return cache[key]


def _by_parts(fn, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
              scale: float, group_lengths: bool) -> torch.Tensor | None:
    """`fn` run on each part of a split batch and scattered back in token order; None if not split."""
    split = _partition(meta, group_lengths)
    if split is None:
        return None
    out = q.new_empty(q.shape)
    for part, tokens in split:
        out[tokens] = fn(q.index_select(0, tokens), k_cache, v_cache, part, scale)
    return out


def _kernel_device(q: torch.Tensor) -> bool:
    """Whether the Triton kernel runs where q lives (CUDA); a seam for tests on a CPU."""
    return q.is_cuda


_triton_failed: str | None = None  # set when the kernel raised on this machine: "auto" stops trying it


def _triton_decode():
    if _triton_failed is not None:
        return None
    try:
        from inflight.model.triton_attention import paged_decode_attention  # written by the paged-KV chapter
    except Exception:  # module missing, triton missing or broken: fall back to the reference
        return None
    return paged_decode_attention


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
              scale: float, backend: str = "auto") -> torch.Tensor:
    """Dispatch: the Triton decode kernel for decode-only batches on CUDA (when available), else the reference.

    `backend` = "auto" | "torch" | "triton" ("triton" raises if the kernel can't run here)."""
    global _last_backend, _triton_failed
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    if backend == "auto" and not meta.is_decode and _kernel_device(q) and _triton_decode() is not None:
        # a mixed step (continuous batching's usual one): its decodes still take the kernel,
        # its prefill chunks the reference
        out = _by_parts(attention, q, k_cache, v_cache, meta, scale, group_lengths=False)
        if out is not None:
            return out
    if backend != "torch" and meta.is_decode and (_kernel_device(q) or backend == "triton"):
        kernel = _triton_decode()
        if kernel is not None:
            if backend == "triton":
                _last_backend = "triton"
                return kernel(q, k_cache, v_cache, meta.block_tables, meta.context_lens, scale)
            try:
                out = kernel(q, k_cache, v_cache, meta.block_tables, meta.context_lens, scale)
                _last_backend = "triton"
                return out
            except Exception as exc:  # e.g. a Triton/driver combination that can't compile it (old GPUs)
                import warnings

                _triton_failed = f"{type(exc).__name__}: {exc}"
                warnings.warn(f"the Triton decode kernel failed here ({_triton_failed[:300]}); "
                              "using the plain-torch reference attention from now on", RuntimeWarning, stacklevel=2)
        if backend == "triton":
            raise RuntimeError("backend='triton' asked for, but inflight.model.triton_attention could not be imported")
    elif backend == "triton":
        raise RuntimeError("the Triton kernel handles decode-only batches (every query_len 1)")
    _last_backend = "torch"
    return paged_attention(q, k_cache, v_cache, meta, scale)
