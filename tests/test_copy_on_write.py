"""Copy-on-write over the allocator's reference counts (`block_manager.copy_on_write`), fuzzed the
way the allocator is: sequences are forked (every block shared), written token by token, and freed
in random order over a pool that holds the *contents* of each slot. No write ever lands in a block
someone else holds (every sequence reads back exactly its own tokens), no block is freed while it
is shared, and nothing leaks."""
from collections import Counter

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from inflight.engine.block_manager import BlockAllocator, NoFreeBlocksError, copy_on_write, ensure_capacity
from inflight.engine.prefix_cache import PrefixCachingBlockAllocator


def test_a_shared_block_is_copied_and_the_references_move():
    a = BlockAllocator(8, 4)
    table = a.allocate(2)            # 6 tokens: block 1 is partly filled
    sibling = list(table)
    a.incref(sibling)
    pair = copy_on_write(a, table, 6)
    assert pair == (sibling[1], table[1]) and table[1] not in sibling
    assert table[0] == sibling[0]    # the full block stays shared
    assert (a.ref_count(sibling[0]), a.ref_count(sibling[1]), a.ref_count(table[1])) == (2, 1, 1)
    assert a.num_used == 3
    assert copy_on_write(a, sibling, 6) is None  # the last holder writes in place
    assert copy_on_write(a, table, 7) is None    # ... and so does a table that owns its block


def test_nothing_to_copy_past_the_end_or_in_a_private_block():
    a = BlockAllocator(8, 4)
    table = a.allocate(2)
    a.incref(table)
    assert copy_on_write(a, table, 8) is None    # position 8 starts a third block: growth allocates it
    assert [a.ref_count(b) for b in table] == [2, 2]
    private = a.allocate(1)
    assert copy_on_write(a, private, 1) is None and a.ref_count(private[0]) == 1


def test_a_dry_pool_changes_nothing():
    a = BlockAllocator(2, 4)
    table = a.allocate(2)
    sibling = list(table)
    a.incref(table)
    with pytest.raises(NoFreeBlocksError):
        copy_on_write(a, table, 5)
    assert table == sibling and [a.ref_count(b) for b in table] == [2, 2] and a.num_free == 0


def test_bad_positions_are_refused():
    a = BlockAllocator(4, 4)
    with pytest.raises(ValueError, match="position"):
        copy_on_write(a, a.allocate(1), -1)
    with pytest.raises(TypeError, match="position"):
        copy_on_write(a, [0], 1.5)


def test_a_cached_shared_block_is_copied_too():
    a = PrefixCachingBlockAllocator(8, 2)
    table = a.allocate(2)
    a.incref(table)
    pair = copy_on_write(a, table, 3)
    assert pair is not None and a.ref_count(pair[0]) == 1 and a.ref_count(pair[1]) == 1
    a.check_invariants()


class ForkMachine(RuleBasedStateMachine):
    """Sequences start, are forked (a sample shares all its parent's blocks), write tokens (copy on
    write first, then grow) and finish, in random order. The pool holds what each slot was last
    written with, so a write into a shared block would show up as a sibling reading a wrong token."""

    def __init__(self):
        super().__init__()
        self.a = BlockAllocator(20, 3)
        self.slots: dict[int, int] = {}  # slot -> token written there
        self.seqs: dict[int, tuple[list[int], list[int]]] = {}  # id -> (block table, its tokens)
        self.next_id = 0
        self.copies = 0

    def _write(self, table: list[int], tokens: list[int], token: int) -> bool:
        """Write `token` at the next position, as the engine does: copy-on-write, grow, write."""
        p = len(tokens)
        try:
            pair = copy_on_write(self.a, table, p)
        except NoFreeBlocksError:
            return False
        if pair is not None:  # the caller's part: the shared block's contents into the private copy
            src, dst = pair
            bs = self.a.block_size
            for off in range(bs):
                if src * bs + off in self.slots:
                    self.slots[dst * bs + off] = self.slots[src * bs + off]
            self.copies += 1
        try:
            ensure_capacity(self.a, table, p + 1)
        except NoFreeBlocksError:
            return False
        block = table[p // self.a.block_size]
        assert self.a.ref_count(block) == 1, f"writing into block {block}, which {self.a.ref_count(block)} hold"
        self.slots[block * self.a.block_size + p % self.a.block_size] = token
        tokens.append(token)
        return True

    @rule(n=st.integers(1, 7))
    def start(self, n):
        table, tokens = [], []
        for t in range(n):
            if not self._write(table, tokens, 100 * self.next_id + t):
                self.a.free(table)
                return
        self.seqs[self.next_id] = (table, tokens)
        self.next_id += 1

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def fork(self, data):
        table, tokens = self.seqs[data.draw(st.sampled_from(sorted(self.seqs)))]
        self.a.incref(table)
        self.seqs[self.next_id] = (list(table), list(tokens))
        self.next_id += 1

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), k=st.integers(1, 5))
    def write(self, data, k):
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        table, tokens = self.seqs[sid]
        for j in range(k):
            if not self._write(table, tokens, 100 * sid + 50 + len(tokens)):
                return

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def finish(self, data):
        table, _ = self.seqs.pop(data.draw(st.sampled_from(sorted(self.seqs))))
        self.a.free(table)

    @invariant()
    def every_sequence_reads_its_own_tokens(self):
        bs = self.a.block_size
        for table, tokens in self.seqs.values():
            assert len(table) == self.a.blocks_needed(len(tokens))
            got = [self.slots.get(table[p // bs] * bs + p % bs) for p in range(len(tokens))]
            assert got == tokens, "a sequence reads a token it did not write: a shared block was written"

    @invariant()
    def no_block_freed_while_shared_and_no_leak(self):
        held = Counter(b for table, _ in self.seqs.values() for b in table)
        free = set(self.a._free)
        assert not free & set(held), "a block on the free list is still held"
        for b in range(self.a.num_blocks):
            assert self.a.ref_count(b) == held.get(b, 0), f"block {b}: reference count disagrees with its holders"
        assert self.a.num_used == len(held) and self.a.num_free + self.a.num_used == self.a.num_blocks


TestForkMachine = ForkMachine.TestCase
TestForkMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
