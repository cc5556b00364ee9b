"""Draft-model proposals: a small model of the same tokenizer runs `k` greedy steps ahead.

The draft keeps its own paged KV cache and its own block pool (of the target's block size), so
nothing it does can touch the target's blocks: no copy-on-write, prefix-cache or swap rule of the
target needs to know it exists. Per request it remembers its block table, how many positions of
its cache are valid, and the tokens it proposed last time. Each step:

1. catch up: one ragged pass over every proposing request's tokens the draft has not computed —
   after an accepted step, only the tokens past its last accepted proposal; after admission or a
   preemption (any change of the target's state it cannot follow), the whole request;
2. then `k - 1` decode passes over the batch, each feeding back the previous proposal.

A request the draft pool cannot hold this step is simply not proposed for (speculation is
optional; correctness never depends on a proposal). The draft proposes greedily (its argmax), so
its `q` is one-hot and the rejection rule accepts `x` with probability `p(x)`.
vLLM's counterpart: `vllm/v1/spec_decode/draft_model.py` (and `eagle.py`, whose draft reads the
target's hidden states).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from inflight.engine.block_manager import BlockAllocator, blocks_needed
from inflight.model.attention_metadata import AttentionMetadata
from inflight.model.kv_cache import KVCache

__all__ = ["DraftModelProposer"]


@dataclass
class _DraftState:
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0        # positions of the draft's cache that hold the request's tokens
    num_tokens: int = 0          # the request's length when the draft last proposed
    proposed: list[int] = field(default_factory=list)  # what it proposed then (fed back but the last)
    preemptions: int = 0         # the request's preemption count then (a preemption invalidates the state)


class DraftModelProposer:
    """`propose(seqs, ks)`: up to `ks[i]` greedy proposals of the draft model for each request."""

    def __init__(self, draft: Any, k: int, *, num_blocks: int, block_size: int, max_batch_size: int, device: Any):
        self.model = draft
        self.block_size = block_size
        # enough for every block the target holds, plus each request's lookahead
        n = num_blocks + max_batch_size * (blocks_needed(k, block_size) + 1)
        dtype = next(draft.parameters()).dtype
        self.kv_cache = KVCache.for_model(draft.config, n, block_size, dtype=dtype, device=device)
        self.allocator = BlockAllocator(n, block_size)
        self.device = self.kv_cache.device
        self.state: dict[Any, _DraftState] = {}

    def release(self, seq: Any) -> None:
        st = self.state.pop(seq, None)
        if st is not None and st.block_table:
            self.allocator.free(st.block_table)

    def _forget_gone(self) -> None:
        from inflight.engine.sequence import SequenceStatus

        for s in [s for s in self.state if s.status is not SequenceStatus.RUNNING or s.finish_reason is not None]:
            self.release(s)

    def _valid_prefix(self, s: Any, st: _DraftState) -> int:
        """Positions of the draft's cache that still hold `s`'s tokens."""
        if st.preemptions != s.num_preemptions:
            return 0
        valid = min(st.num_computed, st.num_tokens)
        fed = st.proposed[:-1]  # the proposals it fed back (the last one never went in)
        ids = s.token_ids
        for j, t in enumerate(fed):
            if st.num_tokens + j >= len(ids) or ids[st.num_tokens + j] != t:
                break
            valid = st.num_tokens + j + 1
        return min(valid, st.num_computed, len(ids) - 1)

    @torch.inference_mode()
    def propose(self, seqs: list, ks: list[int]) -> list[list[int]]:
        self._forget_gone()
        out: list[list[int]] = [[] for _ in seqs]
        rows = []  # (index, seq, state, first position to compute, k)
        for i, (s, k) in enumerate(zip(seqs, ks)):
            if k <= 0:
                continue
            st = self.state.get(s)
            if st is None:
                st = self.state[s] = _DraftState(preemptions=s.num_preemptions)
            c = self._valid_prefix(s, st)
            need = blocks_needed(s.num_tokens + k - 1, self.block_size) - len(st.block_table)
            if need > 0:
                if not self.allocator.can_allocate(need):
                    continue  # no room in the draft's pool this step: no proposal for it
                st.block_table.extend(self.allocator.allocate(need))
            st.num_computed, st.preemptions = c, s.num_preemptions
            rows.append((i, s, st, c, k))
        if not rows:
            return out
        # 1. catch up: each request's tokens from the draft's valid prefix to its end
        ids = [t for _, s, _, c, _ in rows for t in s.token_ids[c:]]
        logits = self._forward(ids, [s.num_tokens - c for _, s, _, c, _ in rows],
                               [s.num_tokens for _, s, _, _, _ in rows], [st.block_table for _, _, st, _, _ in rows])
        last = logits.argmax(dim=-1).tolist()
        for (i, s, st, _, _), t in zip(rows, last):
            out[i].append(int(t))
            st.num_computed, st.num_tokens = s.num_tokens, s.num_tokens
        # 2. k - 1 more greedy steps, each over the requests still wanting proposals
        step = 1
        while True:
            live = [r for r in rows if r[4] > step]
            if not live:
                break
            logits = self._forward([out[i][-1] for i, *_ in live], [1] * len(live),
                                   [s.num_tokens + step for _, s, *_ in live], [st.block_table for _, _, st, _, _ in live])
            for (i, s, st, _, _), t in zip(live, logits.argmax(dim=-1).tolist()):
                out[i].append(int(t))
                st.num_computed = s.num_tokens + step
            step += 1
        for i, s, st, _, _ in rows:
            st.proposed = list(out[i])
        return out

    def _forward(self, ids: list[int], query_lens: list[int], context_lens: list[int], tables: list[list[int]]):
        meta = AttentionMetadata.build(query_lens, context_lens, tables, self.block_size, self.device)
        last = torch.tensor([sum(query_lens[:j + 1]) - 1 for j in range(len(query_lens))], dtype=torch.long,
                            device=self.device)
        x = torch.tensor(ids, dtype=torch.long, device=self.device)
        return self.model(x, meta.positions, meta, self.kv_cache, logits_indices=last)
