"""What the scheduler is told and what it hands back: its knobs (`SchedulerConfig`), one step's
log (`StepEvents`), the batch for the model (`SchedulerOutput`) and
the interface of the KV copies that swap preemption needs (`Swapper`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from inflight.checks import flag, integer, token_ids
from inflight.engine.budget import Budget

if TYPE_CHECKING:  # pragma: no cover
    from inflight.engine.sequence import Sequence

__all__ = ["SchedulerConfig", "StepEvents", "SchedulerOutput", "Swapper", "NoCopy"]


@dataclass
class SchedulerConfig:
    """The knobs, with vLLM's meaning: `max_batch_size` ~ max_num_seqs, `max_batched_tokens` ~
    max_num_batched_tokens, `watermark_blocks` kept free at admission so growth doesn't preempt at once."""

    max_batch_size: int = 64
    max_batched_tokens: int = 512
    enable_chunked_prefill: bool = True
    preemption: str = "recompute"  # or "swap"
    watermark_blocks: int = 0
    max_model_len: int = 2048
    eos_token_ids: frozenset[int] = frozenset()
    enable_prefix_caching: bool = False  # needs a PrefixCachingBlockAllocator

    def __post_init__(self) -> None:
        if self.preemption not in ("recompute", "swap"):
            raise ValueError(f"preemption must be 'recompute' or 'swap', got {self.preemption!r}")
        for name in ("max_batch_size", "max_batched_tokens", "max_model_len"):
            setattr(self, name, integer(name, getattr(self, name), minimum=1))
        if self.max_batched_tokens < self.max_batch_size:
            raise ValueError(f"max_batched_tokens ({self.max_batched_tokens}) must be >= max_batch_size "
                             f"({self.max_batch_size}): every running request needs one token per step")
        self.watermark_blocks = integer("watermark_blocks", self.watermark_blocks, minimum=0)
        self.enable_chunked_prefill = flag("enable_chunked_prefill", self.enable_chunked_prefill)
        self.enable_prefix_caching = flag("enable_prefix_caching", self.enable_prefix_caching)
        eos = self.eos_token_ids
        self.eos_token_ids = frozenset(token_ids("eos_token_ids", sorted(eos) if isinstance(eos, (set, frozenset))
                                                 else eos))


@dataclass
class StepEvents:
    """The log of one iteration: every step method appends what it did (the engine's stats and the
    exercise's measurements read it; nothing in the scheduler reads it back)."""

    reaped: list[Sequence] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)
    swapped_in: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    forked: list[Sequence] = field(default_factory=list)  # samples that joined when their prompt was in
    blocks_swapped_out: int = 0
    blocks_swapped_in: int = 0
    overcommitted_blocks: int = 0   # admission trusted a budget the pool could not honour
    tokens_without_kv: int = 0      # scheduled tokens with no KV slot at decode time (dropped)
    wasted_tokens: int = 0          # tokens computed for requests that had already finished
    free_blocks_at_decode: int = 0
    # speculative decoding: (proposals checked, proposals accepted) of each request that verified some
    drafts: list[tuple[int, int]] = field(default_factory=list)
    budget: Budget | None = None


@dataclass
class SchedulerOutput:
    """The batch handed to decode: `seqs[i]` computes `seqs[i].num_scheduled_tokens` tokens."""

    seqs: list[Sequence]
    num_prefill_tokens: int
    num_decode_tokens: int

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens


class Swapper(Protocol):
    """Moves KV blocks between the device pool and the CPU pool (pairs of (device_block, cpu_block))."""

    def swap_out(self, pairs: list[tuple[int, int]]) -> None: ...
    def swap_in(self, pairs: list[tuple[int, int]]) -> None: ...


class NoCopy:
    """The simulated pool's swapper: no tensors to move."""

    def swap_out(self, pairs):
        pass

    def swap_in(self, pairs):
        pass
