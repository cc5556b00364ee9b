"""Parallel sampling: `n` samples of one prompt that share its KV blocks (the PagedAttention paper, §4.4).

A request with `SamplingParams(n > 1)` enters the scheduler as ONE sequence, sample 0 (the
*carrier*), which prefills the prompt once. When its prompt is complete, the sampler draws `n`
tokens from the logits of the prompt's last position, one from each sample's own random stream
(`draws`), and `fork` turns the carrier into `n` samples: samples 1..n-1 are new sequences whose
block tables are copies of the carrier's, every block `incref`'d, so the prompt's keys and values
are held once, with a reference count of n. From then on each sample is an ordinary sequence: it
grows, is preempted (by recompute or by swap), finishes and frees on its own; freeing drops its
references, so a shared block goes back to the pool only with its last holder.

Full blocks stay shared to the end. The one block the samples cannot keep sharing is the prompt's
last, partly filled one: each sample writes its own next token there. The first write into a
shared block copies it (`block_manager.copy_on_write`, called by `grow`): the writer gets a private
copy and the shared block loses one reference — and the last holder writes in place, no copy.

Before the fork the carrier stands for all `n` samples in the batch: admission reserves `n` batch
slots for it (`draws`), so that the fork never pushes the batch past `max_batch_size`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence as Seq

from inflight.engine.block_manager import BlockAllocator, blocks_needed, copy_on_write
from inflight.engine.sequence import Sequence, SequenceStatus

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["SampleGroup", "draws", "expand_draws", "fork", "grow", "write_cost", "shares_write_block",
           "request_samples", "request_finished"]


class SampleGroup:
    """The `n` samples of one request: sample 0 (the carrier) until the fork, all `n` after it.
    `generators[i]` is sample i's random stream (None where unseeded: the engine's shared one)."""

    __slots__ = ("n", "samples", "generators")

    def __init__(self, n: int, generators: Seq["torch.Generator | None"] | None = None):
        self.n = n
        self.samples: list[Sequence] = []
        self.generators = list(generators) if generators is not None else [None] * n

    @property
    def forked(self) -> bool:
        return len(self.samples) > 1


def draws(seq: Sequence) -> int:
    """Tokens the next sampling of `seq` draws: `n` for the carrier of a request not forked yet
    (one per sample), else 1. Also the batch slots `seq` stands for."""
    g = seq.group
    return 1 if g is None or g.forked else g.n


def expand_draws(seqs: Seq[Sequence]) -> tuple[list[int], list[Any], list[Any]]:
    """One entry per token a step draws from the rows of `seqs` (in order): the row it is drawn
    from, the sampling parameters and the random stream. A carrier about to fork draws `n` times
    from its one row, sample i from `generators[i]`."""
    if all(s.group is None for s in seqs):  # the common case: one draw per row
        return list(range(len(seqs))), [s.params for s in seqs], [s.generator for s in seqs]
    rows: list[int] = []
    params: list[Any] = []
    generators: list[Any] = []
    for i, s in enumerate(seqs):
        k = draws(s)
        rows += [i] * k
        params += [s.params] * k
        generators += [s.generator] if k == 1 else s.group.generators
    return rows, params, generators


def fork(seq: Sequence, allocator: BlockAllocator, running: list[Sequence]) -> list[Sequence]:
    """Samples 1..n-1 of the carrier `seq`, whose prompt has just been computed: each a copy of it
    as it is now, holding the same blocks (every block gets one more reference per sample). They
    join `running` right after `seq`."""
    g = seq.group
    assert g is not None and not g.forked and seq.index == 0, "only an unforked carrier forks"
    siblings = []
    for i in range(1, g.n):
        s = Sequence(seq.request_id, seq.prompt_token_ids, seq.params, seq.arrival_time, seq_no=seq.seq_no,
                     generator=g.generators[i])
        s.token_ids = list(seq.token_ids)
        s.index, s.group = i, g
        s.priority, s.sort_key = seq.priority, seq.sort_key
        s.status = SequenceStatus.RUNNING
        s.num_computed_tokens = seq.num_computed_tokens
        s.block_table = list(seq.block_table)
        allocator.incref(s.block_table)
        s.block_hashes = list(seq.block_hashes)
        s.num_cached_blocks, s.num_cached_tokens = seq.num_cached_blocks, seq.num_cached_tokens
        s.first_scheduled_time = seq.first_scheduled_time
        s.prompt_logprobs = None  # the request's are the carrier's
        if seq.detokenizer is not None:
            d = seq.detokenizer
            s.detokenizer = type(d)(d.tokenizer, d.stop, seq.params.skip_special_tokens)
        siblings.append(s)
    g.samples.extend(siblings)
    at = running.index(seq) + 1
    running[at:at] = siblings
    return siblings


def write_cost(allocator: BlockAllocator, s: Sequence) -> int:
    """Blocks `s` must be given before its scheduled tokens are written: the new blocks they spill
    into, plus one if the block of its first new token is shared (copy-on-write)."""
    grow_by = blocks_needed(s.num_computed_tokens + s.num_scheduled_tokens, allocator.block_size) - len(s.block_table)
    return max(grow_by, 0) + (s.group is not None and shares_write_block(allocator, s))


def shares_write_block(allocator: BlockAllocator, s: Sequence) -> bool:
    """Whether the block `s` writes its next token into is held by another sample too."""
    i = s.num_computed_tokens // allocator.block_size
    return s.group is not None and i < len(s.block_table) and allocator.ref_count(s.block_table[i]) > 1


def grow(allocator: BlockAllocator, s: Sequence, copy_blocks: Callable[[list[tuple[int, int]]], Any]) -> None:
    """Give `s` the blocks its scheduled tokens are written into: a private copy of a shared block
    it writes into first (its keys and values copied by `copy_blocks` now, before any forward pass
    writes), then the new blocks past its table's end."""
    if s.group is not None:  # (only samples share blocks they write into)
        pair = copy_on_write(allocator, s.block_table, s.num_computed_tokens)
        if pair is not None:
            copy_blocks([pair])
    missing = blocks_needed(s.num_computed_tokens + s.num_scheduled_tokens, allocator.block_size) - len(s.block_table)
    if missing > 0:
        s.block_table.extend(allocator.allocate(missing))


def request_samples(seq: Sequence) -> list[Sequence]:
    """Every sample of `seq`'s request that exists (just `seq` for n=1, or before the fork)."""
    return [seq] if seq.group is None else seq.group.samples


def request_finished(seq: Sequence) -> bool:
    """Whether every sample of `seq`'s request has ended (before the fork: its carrier has)."""
    return all(s.finish_reason is not None for s in request_samples(seq))
