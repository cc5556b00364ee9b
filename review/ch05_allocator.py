"""Chapter 5: BlockAllocator.allocate / free."""
from collections import Counter

from _harness import run

from inflight.engine.block_manager import NoFreeBlocksError
from inflight.exercises import paged as graders
from inflight.exercises.paged import StarterAllocator


class Correct(StarterAllocator):
    def allocate(self, n):
        if n > self.num_blocks:
            raise ValueError(f"{n} blocks can never fit in a pool of {self.num_blocks}")
        if n > len(self.free_list):
            raise NoFreeBlocksError(f"{n} blocks wanted, {len(self.free_list)} free")
        out = [self.free_list.popleft() for _ in range(n)]
        for b in out:
            self.ref_counts[b] = 1
        return out

    def free(self, blocks):
        wanted = Counter(blocks)
        for b, k in wanted.items():
            if not (isinstance(b, int) and 0 <= b < self.num_blocks):
                raise ValueError(f"block {b!r} is not in the pool")
            if k > self.ref_counts[b]:
                raise ValueError(f"block {b} freed {k} times but held {self.ref_counts[b]}")
        for b in blocks:
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_list.append(b)


class W1ChecksSwapped(Correct):
    # checks "enough free now" before "can ever fit": n > pool raises NoFreeBlocksError
    def allocate(self, n):
        if n > len(self.free_list):
            raise NoFreeBlocksError(f"{n} blocks wanted, {len(self.free_list)} free")
        if n > self.num_blocks:
            raise ValueError("never fits")
        out = [self.free_list.popleft() for _ in range(n)]
        for b in out:
            self.ref_counts[b] = 1
        return out


class W2ValidateAsYouGo(Correct):
    # validates and frees in one loop: a bad id late in the list leaves the earlier ones freed
    def free(self, blocks):
        for b in blocks:
            if not (0 <= b < self.num_blocks) or self.ref_counts[b] == 0:
                raise ValueError(f"bad free of block {b}")
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_list.append(b)


class W3PopsCallersList(Correct):
    # drains the caller's block table while freeing it
    def free(self, blocks):
        wanted = Counter(blocks)
        for b, k in wanted.items():
            if not (0 <= b < self.num_blocks) or k > self.ref_counts[b]:
                raise ValueError(f"bad free of block {b}")
        while blocks:
            b = blocks.pop()
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_list.append(b)


class CorrectLifo(Correct):
    # hands out the most recently freed blocks first (the contract does not fix an order)
    def allocate(self, n):
        if n > self.num_blocks:
            raise ValueError("never fits")
        if n > self.num_free:
            raise NoFreeBlocksError("not now")
        taken = []
        for _ in range(n):
            b = self.free_list.pop()
            self.ref_counts[b] = 1
            taken.append(b)
        return taken


ANSWERS = [
    ("correct2", None, CorrectLifo),
    ("correct", None, Correct),
    ("w1", "allocate checks free-now before pool size: n > pool raises NoFreeBlocksError, not ValueError", W1ChecksSwapped),
    ("w2", "free validates as it frees: a failing call has already freed earlier ids", W2ValidateAsYouGo),
    ("w3", "free pops the ids off the caller's list (mutates the block table)", W3PopsCallersList),
]

if __name__ == "__main__":
    run("ch05al", ANSWERS, graders.check_allocator)
