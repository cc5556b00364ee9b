"""`AttentionMetadata`: where each token of a flattened ragged batch reads and writes its keys and values.

A step's batch is one flat run of tokens: prefill chunks and single decode tokens of different
requests, back to back. The metadata says which tokens belong to which sequence
(`query_start_loc`), how long each sequence's context is, and through its block table which cache
slot each position lives in. It is built once per step and shared by every layer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

__all__ = ["AttentionMetadata"]


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
