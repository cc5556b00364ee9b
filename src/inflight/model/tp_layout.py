"""Which attention heads a tensor-parallel rank holds — plain arithmetic, no torch (chapter 10's
capacity tables and its exercise use it without a model; `inflight.model.parallel` and
`inflight.model.sharding` cut the weights by it).

Query heads split evenly: rank r holds the r-th contiguous `heads / N`. KV heads follow the query
heads that read them: with `kv >= N` each rank holds its contiguous `kv / N`; with `kv < N` (grouped-
query attention on many devices) one KV head is shared by `N / kv` consecutive ranks, each holding a
copy — vLLM's replication (`QKVParallelLinear`: `num_kv_head_replicas`).
"""
from __future__ import annotations

from typing import Any

__all__ = ["check_tp_size", "head_range", "kv_heads_per_rank", "kv_head_range"]


def check_tp_size(num_attention_heads: int, num_key_value_heads: int, intermediate_size: int, tp_size: Any) -> int:
    """`tp_size`, if the model can be split that many ways; else a ValueError naming why: the query
    heads and the MLP's columns must divide evenly, and KV heads must divide evenly either way round
    (N a multiple of them: each replicated; or they a multiple of N: each rank its own)."""
    if isinstance(tp_size, bool) or not isinstance(tp_size, int):
        raise TypeError(f"tensor_parallel_size must be an int, got {type(tp_size).__name__}")
    if tp_size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {tp_size}")
    if num_attention_heads % tp_size:
        raise ValueError(f"tensor_parallel_size {tp_size} does not divide the model's {num_attention_heads} "
                         f"attention heads: each rank must hold whole heads")
    if num_key_value_heads % tp_size and tp_size % num_key_value_heads:
        raise ValueError(f"tensor_parallel_size {tp_size} and the model's {num_key_value_heads} KV heads: one must "
                         f"divide the other (split the KV heads, or replicate each on N/{num_key_value_heads} ranks)")
    if intermediate_size % tp_size:
        raise ValueError(f"tensor_parallel_size {tp_size} does not divide intermediate_size {intermediate_size}")
    return tp_size


def head_range(num_heads: int, rank: int, tp_size: int) -> range:
    """The query heads rank `rank` holds: a contiguous `num_heads / tp_size` of them."""
    per = num_heads // tp_size
    return range(rank * per, (rank + 1) * per)


def kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> int:
    """How many KV heads each rank holds: `num_kv_heads / N`, or 1 when there are fewer KV heads than
    ranks (each KV head then replicated on `N / num_kv_heads` ranks)."""
    return max(1, num_kv_heads // tp_size)


def kv_head_range(num_kv_heads: int, rank: int, tp_size: int) -> range:
    """The KV heads rank `rank` holds: those its query heads read. With `num_kv_heads >= N` a
    contiguous `num_kv_heads / N`; with fewer, the one head of its group of `N / num_kv_heads` ranks."""
    if num_kv_heads >= tp_size:
        per = num_kv_heads // tp_size
        return range(rank * per, (rank + 1) * per)
    head = rank // (tp_size // num_kv_heads)
    return range(head, head + 1)


