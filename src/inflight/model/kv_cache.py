"""The KV cache as blocks of real memory (where tokens live is `attention_metadata`).

Layout (vLLM's idea, one tensor pair per layer): `k_cache[l]` and `v_cache[l]` have shape
`[num_blocks, block_size, num_kv_heads, head_dim]`. A request owns a list of blocks (its *block
table*); the token at position `p` lives in *slot* `block_table[p // block_size] * block_size +
p % block_size`. A contiguous cache is the special case `block_size = max length`, one block per
request — the baseline that paging improves on.
"""
from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["KVCache", "kv_bytes_per_token", "num_blocks_for_budget", "default_kv_budget_bytes"]


def _dtype_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype | int = torch.float16) -> int:
    """Bytes of K and V one token occupies across all layers: 2 × layers × kv_heads × head_dim × bytes."""
    nbytes = dtype if isinstance(dtype, int) else _dtype_size(dtype)
    return 2 * num_layers * num_kv_heads * head_dim * nbytes


def num_blocks_for_budget(bytes_per_token: int, block_size: int, budget_bytes: int) -> int:
    """How many whole blocks of `block_size` tokens fit in `budget_bytes`."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
    return int(budget_bytes // (bytes_per_token * block_size))


def default_kv_budget_bytes(device: str | torch.device = "cpu", gpu_memory_utilization: float = 0.9,
                            cpu_fraction: float = 0.1, cpu_cap_bytes: int = 1 << 30) -> int:
    """Memory to give the KV cache when none is specified.

    On CUDA: a fraction of the memory still free *after the weights are loaded*
    (`torch.cuda.mem_get_info`). vLLM's `gpu_memory_utilization` differs: a fraction of the GPU's
    *whole* memory, from which it subtracts the weights, peak activations and other non-KV memory
    it measured; here nothing else shares the GPU, and a profiled peak would cost the reader a
    forward pass at start-up. On CPU: a small share of RAM, capped (default 1 GiB)."""
    device = torch.device(device)
    if device.type == "cuda":
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * gpu_memory_utilization)
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: assume 8 GiB
        total = 8 << 30
    return int(min(total * cpu_fraction, cpu_cap_bytes))


class KVCache:
    """Per-layer K and V tensors of shape `[num_blocks, block_size, num_kv_heads, head_dim]`."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_blocks: int, block_size: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        for name, value in [("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                            ("num_blocks", num_blocks), ("block_size", block_size)]:
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"KVCache: {name} must be a positive int, got {value!r}")
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.num_blocks, self.block_size = num_blocks, block_size
        self.dtype, self.device = dtype, torch.device(device)
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.k_cache = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.v_cache = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]

    @classmethod
    def for_model(cls, config: Any, num_blocks: int, block_size: int, dtype: torch.dtype | None = None,
                  device: str | torch.device | None = None) -> "KVCache":
        """A cache shaped for `config` (a `LlamaConfig`); dtype/device default to float32/CPU."""
        return cls(config.num_hidden_layers, config.num_key_value_heads, config.head_dim, num_blocks, block_size,
                   dtype or torch.float32, device or "cpu")

    @classmethod
    def from_memory_budget(cls, config: Any, block_size: int, budget_bytes: int | None = None,
                           dtype: torch.dtype | None = None, device: str | torch.device | None = None,
                           gpu_memory_utilization: float = 0.9) -> "KVCache":
        """As many blocks as fit in `budget_bytes` (default: `default_kv_budget_bytes(device)`)."""
        dtype, device = dtype or torch.float32, torch.device(device or "cpu")
        if budget_bytes is None:
            budget_bytes = default_kv_budget_bytes(device, gpu_memory_utilization)
        per_token = kv_bytes_per_token(config.num_hidden_layers, config.num_key_value_heads, config.head_dim, dtype)
        n = num_blocks_for_budget(per_token, block_size, budget_bytes)
        if n < 1:
            raise ValueError(f"a KV budget of {budget_bytes} bytes holds no block of {block_size} tokens "
                             f"({per_token * block_size} bytes each)")
        return cls.for_model(config, n, block_size, dtype, device)

    @property
    def bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype)

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def nbytes(self) -> int:
        return self.bytes_per_block * self.num_blocks

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy the keys and values of block `src` into block `dst` for each `(src, dst)`, in every
        layer (copy-on-write of a block several sequences shared). One gather and one scatter per
        tensor: the sources are read before any destination is written."""
        if not pairs:
            return
        src = torch.tensor([p[0] for p in pairs], dtype=torch.long, device=self.device)
        dst = torch.tensor([p[1] for p in pairs], dtype=torch.long, device=self.device)
        for cache in (self.k_cache, self.v_cache):
            for layer in cache:
                layer[dst] = layer[src]

    def __repr__(self) -> str:
        return (f"KVCache(layers={self.num_layers}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
                f"num_blocks={self.num_blocks}, block_size={self.block_size}, dtype={self.dtype}, "
                f"device={self.device}, {self.nbytes / 2**20:.1f} MiB)")
