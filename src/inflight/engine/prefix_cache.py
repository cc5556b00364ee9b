"""Prefix caching: KV blocks shared by every request whose prompt starts the same way.

A *full* block gets a content key chained over its tokens and its parent's key,

    key[0] = H(ROOT,   tokens[0 : bs])
    key[i] = H(key[i-1], tokens[i*bs : (i+1)*bs])

so two requests share block `i` only when their *whole* prefix up to the end of that block matches
(the keys and values of a token depend on every token before it, not just on the block's own
tokens). `PrefixCachingBlockAllocator` keeps a key → block map beside the ordinary free list.
When the last holder frees a keyed block it is not wiped: it waits in an *evictable* LRU list, still
findable by key, and is only reused for something else when the pool has no never-keyed free block
left. Admission calls `find_cached_prefix(token_ids)` and allocates only the rest.

This is vLLM's automatic prefix caching (block hashing); SGLang's RadixAttention reaches the same
sharing with a radix tree over token ids instead of a hash map.
"""
from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

from inflight.checks import integer, show, token_ids as check_token_ids
from inflight.engine.block_manager import BlockAllocator, NoFreeBlocksError

if TYPE_CHECKING:  # pragma: no cover
    from inflight.engine.sequence import Sequence as Request

__all__ = ["PrefixCachingBlockAllocator", "PrefixCacheStats", "cache_stats", "block_key", "block_keys", "cacheable_prefix_len",
           "ROOT_KEY", "sequence_block_keys", "cached_prefix", "cache_full_blocks"]

#: The parent key of a sequence's first block.
ROOT_KEY = b""


def block_key(parent_key: bytes, tokens: Sequence[int]) -> bytes:
    """Content key of one full block: a stable hash (SHA-256, not Python's salted `hash`) of the
    parent block's key followed by the block's token ids."""
    h = hashlib.sha256()
    h.update(len(parent_key).to_bytes(1, "little"))
    h.update(parent_key)
    try:
        h.update(struct.pack(f"<{len(tokens)}q", *tokens))
    except struct.error:
        raise TypeError(f"block tokens must be ints (token ids), got {list(tokens)[:8]}") from None
    return h.digest()


def block_keys(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """Chained keys of every *full* block of `token_ids` (a trailing partial block has no key)."""
    block_size = integer("block_size", block_size, minimum=1)
    keys, parent = [], ROOT_KEY
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_key(parent, token_ids[start:start + block_size])
        keys.append(parent)
    return keys


def cacheable_prefix_len(num_tokens: int, num_hit_blocks: int, block_size: int) -> int:
    """Tokens a request may take from the cache: whole hit blocks, but never its last token (the
    model must compute at least one token to produce logits to sample the next one from)."""
    return min(num_hit_blocks, (num_tokens - 1) // block_size) * block_size if num_tokens > 0 else 0


@dataclass
class PrefixCacheStats:
    """Hit/miss counts. Token counts are over the tokens a lookup could have served (all but the last)."""

    requests: int = 0          # admissions that looked the cache up
    requests_hit: int = 0      # ... that reused at least one block
    query_tokens: int = 0      # tokens that could have come from the cache
    hit_tokens: int = 0        # tokens that did
    evictions: int = 0         # cached blocks reused for other content

    @property
    def hit_rate(self) -> float:
        """Fraction of lookup-able tokens served from the cache (0 when nothing was looked up)."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


def cache_stats(st: PrefixCacheStats | None) -> dict:
    """An engine's prefix-cache counters from an allocator's stats (zeros when caching is off)."""
    if st is None:
        return {"prefix_cache_queries": 0, "prefix_cache_hits": 0, "prefix_cache_hit_tokens": 0,
                "prefix_cache_query_tokens": 0, "prefix_cache_hit_rate": 0.0, "prefix_cache_evictions": 0}
    return {"prefix_cache_queries": st.requests, "prefix_cache_hits": st.requests_hit,
            "prefix_cache_hit_tokens": st.hit_tokens, "prefix_cache_query_tokens": st.query_tokens,
            "prefix_cache_hit_rate": st.hit_rate, "prefix_cache_evictions": st.evictions}


class PrefixCachingBlockAllocator(BlockAllocator):
    """A `BlockAllocator` whose full blocks can be found again by content (see the module docstring).

    Block states: *free* (no key, on the free list), *evictable* (key kept, reference count 0, in
    the LRU list), *in use* (reference count > 0, keyed or not). `num_free` counts free + evictable,
    because both can be handed out by `allocate`. Invariant: free + evictable + in use == num_blocks.
    """

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self._key_of: dict[int, bytes] = {}          # block -> its content key (cached blocks only)
        self._block_of: dict[bytes, int] = {}        # content key -> block
        self._evictable: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.stats = PrefixCacheStats()

    # -- queries ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks `allocate` can hand out: never-keyed free blocks plus evictable cached ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used(self) -> int:
        """Blocks held by at least one request."""
        return self.num_blocks - self.num_free

    @property
    def num_evictable(self) -> int:
        """Cached blocks nobody holds: reusable by key, or evicted when the pool needs them."""
        return len(self._evictable)

    @property
    def num_cached(self) -> int:
        """Blocks findable by key (in use or evictable)."""
        return len(self._block_of)

    def key_of(self, block: int) -> bytes | None:
        """The content key of `block`, or None if it is not cached."""
        return self._key_of.get(self._check_block(block))

    def lookup(self, key: bytes) -> int | None:
        """The block cached under `key`, if any."""
        return self._block_of.get(key)

    def find_cached_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], int]:
        """The longest cached chain of full blocks at the start of `token_ids`, and how many tokens
        it covers — at most `len(token_ids) - 1`, so the last token is always recomputed.

        Pure: nothing changes (admission may still fail); `acquire` then takes the blocks."""
        token_ids = check_token_ids("token_ids", token_ids)
        bs = self.block_size
        usable = (len(token_ids) - 1) // bs if token_ids else 0
        blocks, parent = [], ROOT_KEY
        for i in range(usable):
            parent = block_key(parent, token_ids[i * bs:(i + 1) * bs])
            b = self._block_of.get(parent)
            if b is None:
                break
            blocks.append(b)
        return blocks, len(blocks) * bs

    def blocks_to_revive(self, blocks: Iterable[int]) -> int:
        """How many of `blocks` are evictable (taking them uses up free blocks)."""
        return sum(1 for b in blocks if b in self._evictable)

    # -- changes ---------------------------------------------------------------------------
    def acquire(self, blocks: Sequence[int]) -> None:
        """Add a holder to each cached block of a hit (reviving evictable ones). Call before
        `allocate` for the rest of the request, or the allocation could evict the hit itself."""
        checked = self._check_blocks(blocks)
        for b in checked:
            if b not in self._key_of:
                raise ValueError(f"acquire of block {b}, which is not cached")
        for b in checked:
            if b not in self._ref_counts:
                del self._evictable[b]
            self._ref_counts[b] = self._ref_counts.get(b, 0) + 1

    def record_lookup(self, num_tokens: int, num_cached_tokens: int) -> None:
        """Count one admission's lookup: `num_tokens` in the request, `num_cached_tokens` reused."""
        self.stats.requests += 1
        self.stats.requests_hit += num_cached_tokens > 0
        self.stats.query_tokens += max(num_tokens - 1, 0)
        self.stats.hit_tokens += num_cached_tokens

    def cache_block(self, block: int, key: bytes) -> bool:
        """Make a full, in-use block findable under `key`. Returns False (and changes nothing) when
        the key is already cached in another block — a duplicate computed concurrently — or the
        block already has a key."""
        b = self._check_block(block)
        if not isinstance(key, bytes):
            raise TypeError(f"a cache key must be bytes (from block_key), got {type(key).__name__} ({show(key)})")
        if b not in self._ref_counts:
            raise ValueError(f"cache_block of free block {b}: only a block a request holds can be cached")
        if key in self._block_of or b in self._key_of:
            return False
        self._block_of[key] = b
        self._key_of[b] = key
        return True

    def can_allocate(self, n: int) -> bool:
        """Whether `allocate(n)` would succeed right now (evicting cached blocks if it must)."""
        return integer("n", n, minimum=0) <= self.num_free

    def allocate(self, n: int) -> list[int]:
        """Take `n` blocks, never-keyed free ones first, then evicting the least recently used
        cached ones. All or nothing, reference count 1 each."""
        n = integer("n", n, minimum=0)
        if n > self.num_blocks:
            raise ValueError(f"asked for {n} blocks but the pool only has {self.num_blocks}")
        if n > self.num_free:  # checked before taking anything: no partial allocation
            raise NoFreeBlocksError(f"asked for {n} blocks but only {self.num_free} of {self.num_blocks} are free "
                                    f"({self.num_evictable} of them cached)")
        blocks = [self._take_free_block() for _ in range(n)]
        for b in blocks:
            self._ref_counts[b] = 1
        return blocks

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one reference from each block. Released in reverse order, so that a request's deepest
        blocks (useless without their parents) are the first to be evicted."""
        super().free(self._check_blocks(blocks)[::-1])

    def reset_cache(self) -> None:
        """Forget every evictable block's key (they become plain free blocks); in-use keys stay."""
        for b in list(self._evictable):
            self._forget(b)
            self._free.append(b)
        self._evictable.clear()

    # -- hooks of BlockAllocator -----------------------------------------------------------
    def _take_free_block(self) -> int:
        if self._free:
            return self._free.popleft()
        if not self._evictable:  # allocate() checked num_free first; this is a guard, not a path
            raise NoFreeBlocksError("no free or evictable block left")
        b, _ = self._evictable.popitem(last=False)  # least recently used
        self._forget(b)
        self.stats.evictions += 1
        return b

    def _release_block(self, block: int) -> None:
        if block in self._key_of:
            self._evictable[block] = None  # most recently used end
        else:
            self._free.append(block)

    def _forget(self, block: int) -> None:
        key = self._key_of.pop(block)
        del self._block_of[key]

    # -- checks ----------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError if the states of the blocks don't add up (tests and debug mode)."""
        free, evictable = set(self._free), set(self._evictable)
        assert len(free) == len(self._free), "a block is on the free list twice"
        assert not free & evictable, f"blocks both free and evictable: {sorted(free & evictable)[:5]}"
        for b in free:
            assert b not in self._ref_counts, f"free block {b} has reference count {self._ref_counts[b]}"
            assert b not in self._key_of, f"free block {b} still has a key"
        for b in evictable:
            assert b not in self._ref_counts, f"evictable block {b} has reference count {self._ref_counts[b]}"
            assert b in self._key_of, f"evictable block {b} has no key"
        assert all(c > 0 for c in self._ref_counts.values()), "a block in use with a reference count of 0"
        in_use = len(self._ref_counts)
        assert len(free) + len(evictable) + in_use == self.num_blocks, "free + evictable + in use != total"
        assert len(self._key_of) == len(self._block_of), "key maps disagree"
        for b, k in self._key_of.items():
            assert self._block_of.get(k) == b, f"block {b}'s key maps elsewhere"

    def __repr__(self) -> str:
        return (f"PrefixCachingBlockAllocator(num_blocks={self.num_blocks}, block_size={self.block_size}, "
                f"free={len(self._free)}, evictable={self.num_evictable}, used={self.num_used}, "
                f"cached={self.num_cached})")


# -- a request's view of the cache (the scheduler calls these) -----------------------------------
def sequence_block_keys(seq: "Request", num_blocks: int, block_size: int) -> list[bytes]:
    """`seq.block_hashes` extended to its first `num_blocks` full blocks (each key computed once:
    a block's tokens never change once they exist, so its key survives preemption)."""
    keys = seq.block_hashes
    while len(keys) < num_blocks:
        i = len(keys)
        keys.append(block_key(keys[-1] if keys else ROOT_KEY, seq.token_ids[i * block_size:(i + 1) * block_size]))
    return keys


def cached_prefix(allocator: PrefixCachingBlockAllocator, seq: "Request") -> tuple[list[int], int]:
    """The cached blocks `seq` can start from and the tokens they cover (never its last token).
    Pure: nothing is taken until the scheduler admits the request."""
    bs = allocator.block_size
    blocks = []
    for key in sequence_block_keys(seq, (seq.num_tokens - 1) // bs, bs):
        b = allocator.lookup(key)
        if b is None:
            break
        blocks.append(b)
    return blocks, len(blocks) * bs


def cache_full_blocks(allocator: PrefixCachingBlockAllocator, seq: "Request") -> None:
    """After a forward pass: make every block of `seq` that is now full findable by its content key."""
    bs = allocator.block_size
    full = min(seq.num_computed_tokens // bs, len(seq.block_table))
    if seq.num_cached_blocks >= full:
        return
    keys = sequence_block_keys(seq, full, bs)
    for i in range(seq.num_cached_blocks, full):
        allocator.cache_block(seq.block_table[i], keys[i])  # False for a duplicate: it stays private
    seq.num_cached_blocks = full

