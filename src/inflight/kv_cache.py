"""The KV cache as blocks of real memory, and the metadata that tells attention where tokens live.

Layout (vLLM's idea, one tensor pair per layer): `k_cache[l]` and `v_cache[l]` have shape
`[num_blocks, block_size, num_kv_heads, head_dim]`. A request owns a list of blocks (its *block
table*); the token at position `p` lives in *slot* `block_table[p // block_size] * block_size +
p % block_size`. A contiguous cache is the special case `block_size = max length`, one block per
request — the baseline that paging improves on.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

__all__ = ["KVCache", "AttentionMetadata", "kv_bytes_per_token", "num_blocks_for_budget", "default_kv_budget_bytes"]


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

    On CUDA, as serving engines do: a fraction of the memory still free *after the weights are
    loaded* (`torch.cuda.mem_get_info`). On CPU: a small share of RAM, capped (default 1 GiB)."""
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

    def __repr__(self) -> str:
        return (f"KVCache(layers={self.num_layers}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
                f"num_blocks={self.num_blocks}, block_size={self.block_size}, dtype={self.dtype}, "
                f"device={self.device}, {self.nbytes / 2**20:.1f} MiB)")


def _as_list(x: Any, name: str) -> list[int]:
    if isinstance(x, torch.Tensor):
        return [int(v) for v in x.tolist()]
    try:
        return [int(v) for v in x]
    except TypeError:
        raise TypeError(f"{name} must be a sequence of ints, got {type(x).__name__}") from None


@dataclass
class AttentionMetadata:
    """Where each token of a flattened ragged batch of S sequences (T tokens) reads and writes KV.

    `context_lens[i]` counts sequence i's tokens in the cache *after* this step's tokens are
    written, so its new tokens sit at positions `context_lens[i] - query_lens[i] ... context_lens[i] - 1`.
    """

    query_start_loc: torch.Tensor  # [S+1] int32, token offsets of each sequence in the flat batch
    context_lens: torch.Tensor     # [S] int32
    block_tables: torch.Tensor     # [S, max_blocks] int32 (rows padded with 0)
    slot_mapping: torch.Tensor     # [T] int64, where each new token's K/V is written
    positions: torch.Tensor        # [T] int64, each token's position in its sequence
    max_query_len: int
    max_context_len: int
    is_decode: bool                # every sequence contributes exactly one token
    block_size: int
    query_lens: list[int] = field(repr=False, default_factory=list)
    context_lens_list: list[int] = field(repr=False, default_factory=list)
    _derived: dict = field(repr=False, default_factory=dict)  # gather indices, shared by all layers

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(sum(self.query_lens))

    @classmethod
    def build(cls, query_lens: Sequence[int], context_lens: Sequence[int], block_tables: Sequence[Sequence[int]],
              block_size: int, device: str | torch.device = "cpu") -> "AttentionMetadata":
        """Validate a ragged batch's shape and compute offsets, slots and positions (one time per step)."""
        q = _as_list(query_lens, "query_lens")
        c = _as_list(context_lens, "context_lens")
        if isinstance(block_tables, torch.Tensor):
            tables = [[int(b) for b in row] for row in block_tables.tolist()]
        else:
            tables = [_as_list(row, "block_tables row") for row in block_tables]
        if not (len(q) == len(c) == len(tables)):
            raise ValueError(f"query_lens ({len(q)}), context_lens ({len(c)}) and block_tables ({len(tables)}) "
                             "must have one entry per sequence")
        if not q:
            raise ValueError("AttentionMetadata.build: empty batch (no sequences)")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        for i, (ql, cl, table) in enumerate(zip(q, c, tables)):
            if ql < 1:
                raise ValueError(f"sequence {i}: query_len must be >= 1, got {ql}")
            if cl < ql:
                raise ValueError(f"sequence {i}: context_len {cl} < query_len {ql} (context_lens count the "
                                 "tokens in the cache after this step, new tokens included)")
            need = -(-cl // block_size)
            if len(table) < need:
                raise ValueError(f"sequence {i}: {cl} tokens need {need} blocks of {block_size}, "
                                 f"its block table has {len(table)}")
        device = torch.device(device)
        max_blocks = max(len(t) for t in tables)
        table_t = torch.tensor([t + [0] * (max_blocks - len(t)) for t in tables], dtype=torch.int32)
        q_t = torch.tensor(q, dtype=torch.int64)
        c_t = torch.tensor(c, dtype=torch.int64)
        starts = torch.zeros(len(q) + 1, dtype=torch.int64)
        starts[1:] = torch.cumsum(q_t, 0)
        # positions: for each token, context_len - query_len + (index within its sequence)
        seq_of_token = torch.repeat_interleave(torch.arange(len(q)), q_t)
        within = torch.arange(int(starts[-1])) - starts[seq_of_token]
        positions = (c_t - q_t)[seq_of_token] + within
        blocks = table_t.long()[seq_of_token, positions // block_size]
        slots = blocks * block_size + positions % block_size
        return cls(
            query_start_loc=starts.to(torch.int32).to(device),
            context_lens=c_t.to(torch.int32).to(device),
            block_tables=table_t.to(device),
            slot_mapping=slots.to(device),
            positions=positions.to(device),
            max_query_len=max(q),
            max_context_len=max(c),
            is_decode=all(x == 1 for x in q),
            block_size=block_size,
            query_lens=q,
            context_lens_list=c,
        )

    def derived(self) -> dict:
        """Index tensors the reference attention needs, computed once per step and reused by every layer.

        `kv_slots [S, Lmax]`: slot of each sequence's key at position p (clamped where p >= context);
        `mask [S, Qmax, Lmax]`: query j of sequence s may see key p (causal and inside the context);
        `tok_seq`, `tok_idx [T]`: where token t sits in the padded `[S, Qmax]` query grid."""
        if "kv_slots" in self._derived:  # (the dict also caches other per-step results)
            return self._derived
        dev = self.block_tables.device
        S, L, Q, bs = self.num_seqs, self.max_context_len, self.max_query_len, self.block_size
        p = torch.arange(L, device=dev)
        blk = self.block_tables.long()[:, (p // bs).clamp(max=self.block_tables.shape[1] - 1)]  # [S, L]
        slots = blk * bs + (p % bs)[None, :]
        ctx = self.context_lens.long()[:, None]  # [S, 1]
        valid = p[None, :] < ctx
        slots = torch.where(valid, slots, torch.zeros_like(slots))
        q_lens = torch.tensor(self.query_lens, device=dev)
        qpos = (ctx - q_lens[:, None]) + torch.arange(Q, device=dev)[None, :]  # [S, Q] position of each query
        mask = (p[None, None, :] <= qpos[:, :, None]) & valid[:, None, :]
        starts = self.query_start_loc.long()
        tok_seq = torch.repeat_interleave(torch.arange(S, device=dev), q_lens)
        tok_idx = torch.arange(int(starts[-1]), device=dev) - starts[tok_seq]
        self._derived.update(kv_slots=slots, mask=mask, tok_seq=tok_seq, tok_idx=tok_idx)
        return self._derived
