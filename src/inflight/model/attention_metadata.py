"""`AttentionMetadata`: where each token of a flattened ragged batch reads and writes its keys and values.

A step's batch is one flat run of tokens: prefill chunks and single decode tokens of different
requests, back to back. The metadata says which tokens belong to which sequence
(`query_start_loc`), how long each sequence's context is, and through its block table which cache
slot each position lives in. It is built once per step and shared by every layer.

What the attention implementations derive from it is derived here too, once per step, and then
read by every layer: `decode_pattern` and `prefill_batch` (the indices and masks of the plain-torch
reference) and `decode_batch` (a step's decodes, as a decode kernel takes them).
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate
from typing import Any, Sequence

import torch

from inflight.blocks import blocks_needed

__all__ = ["AttentionMetadata", "DecodeBatch", "DecodePattern", "PrefillBatch"]

def _as_list(x: Any, name: str) -> list[int]:
    if isinstance(x, torch.Tensor):
        return [int(v) for v in x.tolist()]
    try:
        return list(map(int, x))
    except TypeError:
        raise TypeError(f"{name} must be a sequence of ints, got {type(x).__name__}") from None


@dataclass(frozen=True)
class DecodePattern:
    """A step's decodes as a sparse attention pattern over one layer's cache rows.

    The cache `[blocks, block_size, kv_heads, D]` viewed as rows `[slots * kv_heads, D]`: row
    `slot * kv_heads + j` holds kv head j's key (or value) at that slot. Query row `i * H + h`
    (decode i, query head h) may see exactly the rows of its own context under its kv head
    `h // (H / kv_heads)`, listed in position order — no padding, no other sequence's keys. In
    CSR form: `cols[crow[r]:crow[r + 1]]` are the cache rows query row r sees."""

    rows: torch.Tensor     # [n] the decodes' rows in the flat batch
    in_batch_order: bool   # rows is 0..T-1 (a decode-only step): no reordering in or out
    crow: torch.Tensor     # [n * H + 1] int64, where each query row's columns start
    cols: torch.Tensor     # [nnz] int64 cache rows, nnz = H * (sum of the decodes' context lengths)
    lengths: torch.Tensor  # [n * H] int64 keys per query row (its context length)


@dataclass(frozen=True)
class PrefillBatch:
    """A step's prefill chunks (sequences with more than one new token), laid out for one padded
    `scaled_dot_product_attention`: S chunks, each padded to the longest chunk (Q queries) and to the
    longest context among them (L keys). Causal within each sequence, over its earlier chunks too."""

    rows: torch.Tensor   # [n] the chunks' tokens' rows in the flat batch
    grid: torch.Tensor   # [n] where each of those tokens sits in the padded [S * Q] query grid
    slots: torch.Tensor  # [S * L] cache slot of each chunk's sequence's key at position p (slot 0 past its context)
    bias: torch.Tensor   # [S, 1, Q, L] float32: 0 where query j (position L_s - Q_s + j) may see key p, else -inf


@dataclass(frozen=True)
class DecodeBatch:
    """The decodes of a step, as a decode kernel takes them (block tables and context lengths)."""

    rows: torch.Tensor          # [n] their rows in the flat batch
    block_tables: torch.Tensor  # [n, max_blocks] int32
    context_lens: torch.Tensor  # [n] int32


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
    _patterns: dict = field(repr=False, compare=False, default_factory=dict)  # decode_pattern's, per head layout

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
        _check_batch(q, c, tables, block_size)
        device = torch.device(device)
        # Plain Python over the lists, then one tensor each: a step's few hundred tokens cost tens of
        # microseconds this way, while a chain of small torch operators costs a few each (their fixed
        # cost, not their work) -- ~0.5 ms a step at any batch size, a tenth of a small decode step.
        max_blocks = max(len(t) for t in tables)
        flat_tables = array("i")  # int32, as the kernels take it; an array converts a list in one C loop
        for t in tables:
            flat_tables.extend(t)
            flat_tables.extend([0] * (max_blocks - len(t)))
        starts = list(accumulate(q, initial=0))
        # each new token sits at positions context_len - query_len ... context_len - 1 of its sequence,
        # and its K/V goes to that position's slot: its block (from the table) and offset in the block
        positions = array("q", [p for n, ctx in zip(q, c) for p in range(ctx - n, ctx)])
        slots = array("q", [t[p // block_size] * block_size + p % block_size
                            for t, n, ctx in zip(tables, q, c) for p in range(ctx - n, ctx)])
        table_t = torch.frombuffer(flat_tables, dtype=torch.int32).view(len(tables), max_blocks)
        return cls(
            query_start_loc=torch.tensor(starts, dtype=torch.int32).to(device),
            context_lens=torch.tensor(c, dtype=torch.int32).to(device),
            block_tables=table_t.to(device),
            slot_mapping=torch.frombuffer(slots, dtype=torch.int64).to(device),
            positions=torch.frombuffer(positions, dtype=torch.int64).to(device),
            max_query_len=max(q),
            max_context_len=max(c),
            is_decode=all(x == 1 for x in q),
            block_size=block_size,
            query_lens=q,
            context_lens_list=c,
        )

    # -- derived once per step, read by every layer ------------------------------------------------
    @cached_property
    def kv_slots(self) -> torch.Tensor:
        """`[S, max_context_len]` int64: the cache slot of sequence s's key at position p (slot 0 at
        positions past its context, which the masks hide)."""
        dev = self.block_tables.device
        p = torch.arange(self.max_context_len, device=dev)
        cols = (p // self.block_size).clamp(max=self.block_tables.shape[1] - 1)
        slots = self.block_tables.long().index_select(1, cols) * self.block_size + p % self.block_size
        return slots.masked_fill_(p >= self.context_lens.long()[:, None], 0)

    def decode_pattern(self, num_heads: int, num_kv_heads: int) -> DecodePattern | None:
        """This step's decodes as a sparse attention pattern (None if it has none); see `DecodePattern`.
        Built on the first call and shared by every layer."""
        key = (num_heads, num_kv_heads)
        if key not in self._patterns:
            self._patterns[key] = _decode_pattern(self, num_heads, num_kv_heads)
        return self._patterns[key]

    @cached_property
    def prefill_batch(self) -> PrefillBatch | None:
        """This step's prefill chunks for the reference (None if it has none); see `PrefillBatch`."""
        return _prefill_batch(self)

    @cached_property
    def decode_batch(self) -> DecodeBatch | None:
        """This step's decodes (None if it has none), in batch order, for a decode kernel."""
        seqs = [i for i, n in enumerate(self.query_lens) if n == 1]
        if not seqs:
            return None
        dev = self.context_lens.device
        if len(seqs) == self.num_seqs:
            return DecodeBatch(torch.arange(len(seqs), device=dev), self.block_tables, self.context_lens)
        idx = torch.tensor(seqs, device=dev)
        width = blocks_needed(max(self.context_lens_list[i] for i in seqs), self.block_size)
        return DecodeBatch(self.query_start_loc.long().index_select(0, idx),
                           self.block_tables.index_select(0, idx)[:, :width].contiguous(),
                           self.context_lens.index_select(0, idx))

    @cached_property
    def token_batch(self) -> DecodeBatch:
        """Every token of the step as a one-token query over its own prefix (a prefill token at
        position p sees positions 0..p of its sequence): the whole step in one decode kernel call."""
        dev = self.block_tables.device
        seq_of_token = torch.repeat_interleave(torch.arange(self.num_seqs, device=dev),
                                               torch.tensor(self.query_lens, device=dev))
        return DecodeBatch(torch.arange(self.num_tokens, device=dev), self.block_tables.index_select(0, seq_of_token),
                           (self.positions + 1).to(torch.int32))


def _check_batch(q: list[int], c: list[int], tables: list[list[int]], block_size: int) -> None:
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
        need = blocks_needed(cl, block_size)
        if len(table) < need:
            raise ValueError(f"sequence {i}: {cl} tokens need {need} blocks of {block_size}, "
                             f"its block table has {len(table)}")


def _decode_pattern(meta: AttentionMetadata, num_heads: int, num_kv_heads: int) -> DecodePattern | None:
    seqs = [i for i, n in enumerate(meta.query_lens) if n == 1]
    if not seqs:
        return None
    dev, starts, n = meta.block_tables.device, meta.query_start_loc.tolist(), len(seqs)
    all_decode = n == meta.num_seqs
    idx = None if all_decode else torch.tensor(seqs, device=dev)
    ctx = meta.context_lens.long() if all_decode else meta.context_lens.long().index_select(0, idx)
    slots = meta.kv_slots if all_decode else meta.kv_slots.index_select(0, idx)
    # every decode's slots, in position order, back to back (sum of contexts); the cache row of slot s
    # under kv head j is s * kv_heads + j
    rows_of_slots = slots[torch.arange(slots.shape[1], device=dev) < ctx[:, None]] * num_kv_heads
    lengths = ctx.repeat_interleave(num_heads)  # query row i * H + h sees decode i's context
    crow = torch.zeros(n * num_heads + 1, dtype=torch.long, device=dev)
    torch.cumsum(lengths, 0, out=crow[1:])
    # nonzero e of query row r = (i, h) takes decode i's slot number e - crow[r] under kv head h // g:
    # its place in rows_of_slots is e + (start of decode i there - crow[r])
    seq_start = torch.zeros(n, dtype=torch.long, device=dev)
    torch.cumsum(ctx[:-1], 0, out=seq_start[1:])
    shift = seq_start.repeat_interleave(num_heads) - crow[:-1]
    kv_head = (torch.arange(num_heads, device=dev) // (num_heads // num_kv_heads)).repeat(n)
    e = torch.arange(int(crow[-1]), device=dev)
    cols = rows_of_slots.index_select(0, e + shift.repeat_interleave(lengths)) + kv_head.repeat_interleave(lengths)
    rows = [starts[i] for i in seqs]
    return DecodePattern(torch.tensor(rows, dtype=torch.long, device=dev), all_decode, crow, cols, lengths)


def _prefill_batch(meta: AttentionMetadata) -> PrefillBatch | None:
    seqs = [i for i, n in enumerate(meta.query_lens) if n > 1]
    if not seqs:
        return None
    dev, starts = meta.block_tables.device, meta.query_start_loc.tolist()
    q_lens = [meta.query_lens[i] for i in seqs]
    Q, L = max(q_lens), max(meta.context_lens_list[i] for i in seqs)
    rows = [t for i in seqs for t in range(starts[i], starts[i + 1])]
    grid = [k * Q + j for k, n in enumerate(q_lens) for j in range(n)]
    idx = torch.tensor(seqs, device=dev)
    ctx = meta.context_lens.long().index_select(0, idx)[:, None, None]  # [S, 1, 1]
    query_pos = ctx - torch.tensor(q_lens, device=dev)[:, None, None] + torch.arange(Q, device=dev)[None, :, None]
    keys = torch.arange(L, device=dev)[None, None, :]
    hidden = (keys > query_pos) | (keys >= ctx)  # [S, Q, L]: after the query, or past the context
    bias = torch.zeros(len(seqs), 1, Q, L, device=dev).masked_fill_(hidden[:, None], float("-inf"))
    return PrefillBatch(torch.tensor(rows, device=dev), torch.tensor(grid, device=dev),
                        meta.kv_slots.index_select(0, idx)[:, :L].reshape(-1), bias)
