"""`BlockAllocator`: a fixed pool of KV-cache blocks, a free list and reference counts.

A block holds the keys and values of `block_size` consecutive tokens of one sequence. A sequence
owns a *block table* (the list of its block ids, in token order); token `p` lives in slot
`block_table[p // block_size] * block_size + p % block_size`. Allocation and free touch only the
blocks involved — never the whole pool — so they cost the same with 100 or 100,000 blocks.

Creating a pool costs nothing per block either: never-used blocks are a counter (`FreeList`) and
reference counts are kept only for blocks in use, so a pool of a billion blocks is as cheap to make
as one of ten (the KV tensors, not the bookkeeping, are what a big pool costs).

Reference counts let several sequences share a block (prefix caching, beam search): `free`
decrements, and a block returns to the free list only when nobody holds it any more. Content
keys for prefix caching live in the subclass `inflight.engine.prefix_cache.PrefixCachingBlockAllocator`,
which hooks `_take_free_block` / `_release_block` to keep released blocks findable by key until
they are reused.
"""
from __future__ import annotations

from collections import Counter, deque
from typing import Iterable, Iterator, Sequence

from inflight.blocks import blocks_needed  # re-exported: the allocator's readers look for it here
from inflight.checks import INT64_MAX, integer, show

__all__ = ["BlockAllocator", "FreeList", "NoFreeBlocksError", "blocks_needed", "slot_mapping", "ensure_capacity",
           "copy_on_write"]


class NoFreeBlocksError(RuntimeError):
    """Raised when a request asks for more blocks than are free right now (it may fit later)."""


def slot_mapping(block_table: Sequence[int], positions: Iterable[int], block_size: int) -> list[int]:
    """Cache slot of each token position: `block_table[p // block_size] * block_size + p % block_size`."""
    block_size = integer("block_size", block_size, minimum=1)
    slots = []
    for p in positions:
        p = integer("position", p, minimum=0)
        i = p // block_size
        if i >= len(block_table):
            raise ValueError(f"position {p} needs logical block {i}, but the block table has only {len(block_table)} blocks")
        slots.append(int(block_table[i]) * block_size + p % block_size)
    return slots


class FreeList:
    """The free block ids, first in first out: never-used blocks in id order, then freed blocks in
    the order they were freed (so a just-freed block is reused last). Never-used blocks are a
    counter, not a list: O(1) to create, memory only for blocks that have been used and freed."""

    __slots__ = ("_next", "_end", "_freed")

    def __init__(self, num_blocks: int):
        self._next, self._end = 0, num_blocks  # blocks _next .. _end-1 have never been handed out
        self._freed: deque[int] = deque()

    def __len__(self) -> int:
        return self._end - self._next + len(self._freed)

    def __iter__(self) -> Iterator[int]:
        yield from range(self._next, self._end)
        yield from self._freed

    def popleft(self) -> int:
        """The next free block (raises IndexError when there is none)."""
        if self._next < self._end:
            self._next += 1
            return self._next - 1
        return self._freed.popleft()

    def append(self, block: int) -> None:
        """A block that has just become free (it is reused after every other free block)."""
        self._freed.append(block)


class BlockAllocator:
    """A fixed pool of `num_blocks` KV blocks of `block_size` tokens, with reference counts.

    `allocate(n)` hands out `n` free blocks (reference count 1); `free(blocks)` drops one reference
    from each and returns a block to the free list when its count reaches zero; `incref(blocks)`
    adds a holder to blocks already in use. Invariant after every call: num_free + num_used == num_blocks.
    """

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = integer("num_blocks", num_blocks, minimum=1, maximum=INT64_MAX)
        self.block_size = integer("block_size", block_size, minimum=1, maximum=INT64_MAX)
        # Free list: FIFO, so a just-freed block is reused last (friendlier to a later prefix cache,
        # which wants freed blocks to stay intact as long as possible).
        self._free = FreeList(self.num_blocks)
        self._ref_counts: dict[int, int] = {}  # block -> holders, for blocks in use only

    # -- queries ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks on the free list."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        """Blocks held by at least one sequence."""
        return self.num_blocks - len(self._free)

    def ref_count(self, block: int) -> int:
        """How many holders `block` has (0 = free)."""
        return self._ref_counts.get(self._check_block(block), 0)

    def can_allocate(self, n: int) -> bool:
        """Whether `allocate(n)` would succeed right now."""
        return integer("n", n, minimum=0) <= len(self._free)

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks needed for `num_tokens` tokens at this allocator's block size (ceil division)."""
        return blocks_needed(num_tokens, self.block_size)

    # -- changes ---------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """Take `n` blocks off the free list, each with reference count 1. All or nothing."""
        n = integer("n", n, minimum=0)
        if n > self.num_blocks:
            raise ValueError(f"asked for {n} blocks but the pool only has {self.num_blocks}")
        if n > len(self._free):
            # checked before taking anything: a failed allocation must not leak partial blocks
            raise NoFreeBlocksError(f"asked for {n} blocks but only {len(self._free)} of {self.num_blocks} are free")
        blocks = [self._take_free_block() for _ in range(n)]
        for b in blocks:
            self._ref_counts[b] = 1
        return blocks

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one reference from each block; a block whose count reaches 0 returns to the free list.

        Validated before anything changes: freeing an unknown block, or more references than a
        block has (a double free), raises ValueError and leaves the allocator untouched.
        """
        counts = Counter(self._check_blocks(blocks))
        refs = self._ref_counts
        for b, k in counts.items():
            if refs.get(b, 0) < k:
                state = "already free" if b not in refs else f"held {refs[b]} time(s)"
                raise ValueError(f"double free of block {b}: freed {k} time(s) but it is {state}")
        for b, k in counts.items():
            if refs[b] == k:
                del refs[b]
                self._release_block(b)
            else:
                refs[b] -= k

    def incref(self, blocks: Iterable[int]) -> None:
        """Add one holder to each block (each must be in use): sharing without copying."""
        blocks = self._check_blocks(blocks)
        for b in blocks:
            if b not in self._ref_counts:
                raise ValueError(f"incref of free block {b}: only blocks in use can be shared")
        for b in blocks:
            self._ref_counts[b] += 1

    # -- extension points (prefix caching hooks in here) ----------------------------------
    def _take_free_block(self) -> int:
        """Pop one block id off the free list."""
        return self._free.popleft()

    def _release_block(self, block: int) -> None:
        """Put a block whose reference count reached zero back on the free list."""
        self._free.append(block)

    def _check_blocks(self, blocks: Iterable[object]) -> list[int]:
        if isinstance(blocks, (str, bytes)) or not hasattr(blocks, "__iter__"):
            raise TypeError(f"blocks must be a list of block ids, got {type(blocks).__name__} ({show(blocks)})")
        return [self._check_block(b) for b in blocks]

    def _check_block(self, block: object) -> int:
        b = integer("block", block)
        if not 0 <= b < self.num_blocks:
            raise ValueError(f"unknown block {b}: ids run 0..{self.num_blocks - 1}")
        return b

    def __repr__(self) -> str:
        return (f"BlockAllocator(num_blocks={self.num_blocks}, block_size={self.block_size}, "
                f"free={self.num_free}, used={self.num_used})")


def ensure_capacity(allocator: BlockAllocator, block_table: list[int], num_tokens: int) -> list[int]:
    """Grow `block_table` (in place) so it can hold `num_tokens` tokens; return the blocks added.

    This is what appending tokens to a sequence costs: a new block only when the last one is full.
    """
    missing = allocator.blocks_needed(num_tokens) - len(block_table)
    if missing <= 0:
        return []
    new = allocator.allocate(missing)
    block_table.extend(new)
    return new


def copy_on_write(allocator: BlockAllocator, block_table: list[int], position: int) -> tuple[int, int] | None:
    """Before a sequence writes the keys and values of token `position`: make the block they go into
    its own. Returns `(shared, private)` when it had to copy, else None.

    A block several block tables hold (the samples of one prompt share its blocks) must not be
    written, because the others still read it. So when the block holding `position` is shared
    (reference count > 1), a new block takes its place in `block_table` (changed in place) and the
    shared block loses this table's reference; the caller then copies the shared block's keys and
    values into the new one, before the write. A block the table holds alone is written in place
    (the last of the sharers to write needs no copy), and a position past the table's last block
    needs nothing either: that token starts a new block, which growing the table allocates.
    All or nothing: when no block is free, `NoFreeBlocksError` is raised and nothing changes.
    The engine's scheduler calls this for each sample about to write (`inflight.engine.parallel_sampling`);
    chapter 5's exercise asks for it."""
    position = integer("position", position, minimum=0)
    i = position // allocator.block_size
    if i >= len(block_table):
        return None
    shared = block_table[i]
    if allocator.ref_count(shared) <= 1:
        return None
    private = allocator.allocate(1)[0]  # first: if the pool is dry, nothing has changed yet
    allocator.free([shared])             # one holder fewer; the others keep it
    block_table[i] = private
    return shared, private
