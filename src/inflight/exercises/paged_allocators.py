"""Chapter 5's allocator exercise as code: the starter the learner completes, a reference, and the
classic wrong allocators the grader recognises (leaks on free, hands a block out twice, ...)."""
from __future__ import annotations

from collections import Counter, deque
from typing import Sequence

from inflight.engine.block_manager import NoFreeBlocksError
from inflight.exercises.grading import Mistake

__all__ = ["StarterAllocator", "ReferenceAllocator", "ALLOCATOR_MISTAKES"]


class StarterAllocator:
    """The state the chapter's exercise starts from: a free list and a reference count per block."""

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_list: deque[int] = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self.free_list)

    def incref(self, blocks: Sequence[int]) -> None:
        for b in blocks:
            if not 0 <= b < self.num_blocks or self.ref_counts[b] == 0:
                raise ValueError(f"block {b} is not in use: only blocks in use can be shared")
        for b in blocks:
            self.ref_counts[b] += 1

    def allocate(self, n: int) -> list[int]:
        raise NotImplementedError

    def free(self, blocks: Sequence[int]) -> None:
        raise NotImplementedError


class ReferenceAllocator(StarterAllocator):
    def allocate(self, n):
        if n > self.num_blocks:
            raise ValueError(f"{n} blocks > pool of {self.num_blocks}")
        if n > len(self.free_list):
            raise NoFreeBlocksError(f"{n} blocks > {len(self.free_list)} free")
        out = [self.free_list.popleft() for _ in range(n)]
        for b in out:
            self.ref_counts[b] = 1
        return out

    def free(self, blocks):
        # count each id first: free([b, b]) on a block held once is a double free too (as in
        # BlockAllocator.free); checking `ref_counts[b] == 0` id by id would let it through
        counts = Counter(blocks)
        for b, k in counts.items():
            if not 0 <= b < self.num_blocks:
                raise ValueError(f"unknown block {b}")
            if self.ref_counts[b] < k:
                raise ValueError(f"double free of block {b}: freed {k} time(s), held {self.ref_counts[b]}")
        for b, k in counts.items():
            self.ref_counts[b] -= k
            if self.ref_counts[b] == 0:
                self.free_list.append(b)


class _LeakOnFree(ReferenceAllocator):
    def free(self, blocks):
        for b in blocks:
            if not 0 <= b < self.num_blocks or self.ref_counts[b] == 0:
                raise ValueError(b)
        for b in blocks:
            self.ref_counts[b] -= 1  # ...and never goes back on the free list


class _HandsOutTwice(ReferenceAllocator):
    def allocate(self, n):
        if n > self.num_blocks:
            raise ValueError(n)
        if n > len(self.free_list):
            raise NoFreeBlocksError(n)
        out = list(self.free_list)[:n]  # looked at, not taken
        for b in out:
            self.ref_counts[b] = 1
        return out


class _NoDoubleFreeCheck(ReferenceAllocator):
    def free(self, blocks):
        for b in blocks:  # one pass, as a free() without the count check usually is
            if not 0 <= b < self.num_blocks:
                raise ValueError(b)
            self.ref_counts[b] = max(0, self.ref_counts[b] - 1)
            if self.ref_counts[b] == 0:
                self.free_list.append(b)


class _IgnoresRefCounts(ReferenceAllocator):
    def free(self, blocks):
        for b in blocks:
            if not 0 <= b < self.num_blocks or self.ref_counts[b] == 0:
                raise ValueError(b)
        for b in blocks:
            self.ref_counts[b] = 0
            self.free_list.append(b)


class _IgnoresRefCountsOnce(ReferenceAllocator):
    def free(self, blocks):
        for b in blocks:
            if not 0 <= b < self.num_blocks or self.ref_counts[b] == 0:
                raise ValueError(b)
        for b in blocks:
            if self.ref_counts[b] > 0:  # the whole block goes, however many hold it
                self.ref_counts[b] = 0
                self.free_list.append(b)


class _PartialAllocation(ReferenceAllocator):
    def allocate(self, n):
        if n > self.num_blocks:
            raise ValueError(n)
        out = []
        for _ in range(n):
            if not self.free_list:
                raise NoFreeBlocksError(n)  # the blocks already popped are lost
            out.append(self.free_list.popleft())
            self.ref_counts[out[-1]] = 1
        return out


class _NoLimitChecks(ReferenceAllocator):
    def allocate(self, n):
        out = [self.free_list.popleft() for _ in range(n)]  # IndexError from an empty deque
        for b in out:
            self.ref_counts[b] = 1
        return out


class _FreeNotAtomic(ReferenceAllocator):
    def free(self, blocks):
        for b in blocks:  # checked one by one while freeing: a bad id late in the list raises too late
            if not 0 <= b < self.num_blocks or self.ref_counts[b] == 0:
                raise ValueError(b)
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_list.append(b)


class _OneErrorForBoth(ReferenceAllocator):
    def allocate(self, n):
        if n > len(self.free_list):
            raise NoFreeBlocksError(n)  # also when n > num_blocks, which can never fit
        return super().allocate(n)


class _UnknownIdNotChecked(ReferenceAllocator):
    def free(self, blocks):
        for b in blocks:
            if self.ref_counts[b] == 0:  # ref_counts[-1] is the LAST block; ref_counts[n] is an IndexError
                raise ValueError(b)
        for b in blocks:
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_list.append(b)


class _DuplicatesNotCounted(ReferenceAllocator):
    def free(self, blocks):
        for b in blocks:  # each id checked against its count once, not against how often it is listed
            if not 0 <= b < self.num_blocks:
                raise ValueError(b)
            if self.ref_counts[b] == 0:
                raise ValueError(b)
        for b in blocks:
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_list.append(b)


class _ExactFitRefused(ReferenceAllocator):
    def allocate(self, n):
        if n > self.num_blocks:
            raise ValueError(n)
        if n >= len(self.free_list) and n > 0:  # >= where > belongs
            raise NoFreeBlocksError(n)
        return super().allocate(n)


class _WholePoolRefused(ReferenceAllocator):
    def allocate(self, n):
        if n >= self.num_blocks:  # >= where > belongs
            raise ValueError(n)
        return super().allocate(n)


class _ErrorsSwapped(ReferenceAllocator):
    def allocate(self, n):
        if n > self.num_blocks:
            raise NoFreeBlocksError(n)
        if n > len(self.free_list):
            raise ValueError(n)
        return super().allocate(n)


class _NegativeIdsNotChecked(ReferenceAllocator):
    def free(self, blocks):
        counts = Counter(blocks)
        for b, k in counts.items():
            if b >= self.num_blocks or self.ref_counts[b] < k:  # ref_counts[-1] is the last block
                raise ValueError(b)
        for b, k in counts.items():
            self.ref_counts[b] -= k
            if self.ref_counts[b] == 0:
                self.free_list.append(b)


class _CountsNotSet(ReferenceAllocator):
    def allocate(self, n):
        if n > self.num_blocks:
            raise ValueError(n)
        if n > len(self.free_list):
            raise NoFreeBlocksError(n)
        return [self.free_list.popleft() for _ in range(n)]  # reference counts left at 0


class _AppendsEveryFree(ReferenceAllocator):
    def free(self, blocks):
        counts = Counter(blocks)
        for b, k in counts.items():
            if not 0 <= b < self.num_blocks or self.ref_counts[b] < k:
                raise ValueError(b)
        for b in blocks:
            self.ref_counts[b] -= 1
            self.free_list.append(b)  # back on the free list although others may still hold it


ALLOCATOR_MISTAKES = [
    Mistake("leaking blocks on free", "free() lowers the reference count but never puts the block back on the free "
            "list, so num_free never recovers: when a block's count reaches 0, append it to the free list.",
            _LeakOnFree),
    Mistake("handing out a block twice", "allocate() must REMOVE blocks from the free list (popleft), not just read "
            "them — otherwise the next request gets the same blocks and overwrites another sequence's KV.",
            _HandsOutTwice),
    Mistake("no double-free check", "freeing a block whose reference count is already 0 must raise ValueError; "
            "otherwise it lands on the free list twice and is later handed to two sequences.",
            _NoDoubleFreeCheck),
    Mistake("ignoring reference counts", "a shared block (incref'd) goes back to the free list only when its LAST "
            "holder frees it: decrement, and append only at zero.", _IgnoresRefCounts),
    Mistake("ignoring reference counts", "a shared block (incref'd) goes back to the free list only when its LAST "
            "holder frees it: decrement, and append only at zero.", _IgnoresRefCountsOnce),
    Mistake("partial allocation leaks", "check `n <= num_free` BEFORE taking any block; raising halfway through "
            "loses the blocks already taken.", _PartialAllocation),
    Mistake("no limit checks", "allocate(n) must raise ValueError when n > num_blocks (it can never fit) and "
            "NoFreeBlocksError when n > num_free (it may fit later) — not crash inside the free list.",
            _NoLimitChecks),
    Mistake("free() not all-or-nothing", "you check each block while freeing, so a bad id late in the list "
            "raises after the blocks before it were already freed; check every id first, then change anything.",
            _FreeNotAtomic),
    Mistake("one error for both limits", "n > num_blocks can never fit, however long the caller waits: raise "
            "ValueError for it, and NoFreeBlocksError only when n <= num_blocks but more than is free now.",
            _OneErrorForBoth),
    Mistake("unknown block ids not checked", "free() must reject ids outside 0..num_blocks-1 with ValueError "
            "(note that ref_counts[-1] silently means the last block in Python).", _UnknownIdNotChecked),
    Mistake("a block freed twice in one call", "free([b, b]) on a block held once is a double free too, but checking "
            "`ref_counts[b] == 0` id by id lets it through (the count is still 1 when each copy is checked) and then "
            "drives it below zero. Count how often each id appears (`collections.Counter(blocks)`) and compare that "
            "with its reference count before changing anything.", _DuplicatesNotCounted),
    Mistake("exact fit refused", "asking for exactly the blocks that are free must succeed: raise NoFreeBlocksError "
            "only when n > num_free (you use >=).", _ExactFitRefused),
    Mistake("the whole pool refused", "allocate(num_blocks) on an empty pool must succeed: raise ValueError only when "
            "n > num_blocks (you use >=).", _WholePoolRefused),
    Mistake("the two errors swapped", "n > num_blocks can never fit: ValueError; n <= num_blocks but more than is free "
            "now may fit later: NoFreeBlocksError. Yours are the other way round.", _ErrorsSwapped),
    Mistake("negative ids not checked", "free() must reject every id outside 0..num_blocks-1; you check only the upper "
            "end, and ref_counts[-1] silently means the last block in Python: test `0 <= b < num_blocks`.",
            _NegativeIdsNotChecked),
    Mistake("reference counts not set on allocate", "allocate() must set each block's reference count to 1: the "
            "blocks you hand out still count 0, so freeing them looks like a double free.", _CountsNotSet),
    Mistake("freed block returned while still shared", "a block goes back on the free list only when its count "
            "reaches 0; you append it at every free, so a block another sequence still holds is handed out again.",
            _AppendsEveryFree),
]
