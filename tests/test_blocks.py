"""BlockAllocator: the free list, reference counts, errors, and (hypothesis) random interleavings
of allocate / append / share / free that must never leak or double-assign a block."""
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import inflight
from inflight.engine.block_manager import BlockAllocator, NoFreeBlocksError, blocks_needed, ensure_capacity, slot_mapping


def test_exported_from_package():
    assert inflight.BlockAllocator is BlockAllocator


def test_allocate_and_free_roundtrip():
    a = BlockAllocator(8, 16)
    assert (a.num_free, a.num_used, a.num_blocks, a.block_size) == (8, 0, 8, 16)
    x = a.allocate(3)
    assert len(x) == len(set(x)) == 3 and all(0 <= b < 8 for b in x)
    assert all(a.ref_count(b) == 1 for b in x)
    y = a.allocate(5)
    assert not set(x) & set(y)
    assert a.num_free == 0 and a.num_used == 8
    assert not a.can_allocate(1) and a.can_allocate(0)
    a.free(x)
    assert a.num_free == 3 and all(a.ref_count(b) == 0 for b in x)
    z = a.allocate(3)
    assert set(z) == set(x)  # exactly the freed blocks come back
    assert a.allocate(0) == []


def test_errors():
    a = BlockAllocator(4, 8)
    with pytest.raises(ValueError, match="only has 4"):
        a.allocate(5)
    x = a.allocate(3)
    with pytest.raises(NoFreeBlocksError, match="only 1 of 4"):
        a.allocate(2)
    assert a.num_free == 1, "a failed allocation must not take blocks"
    assert issubclass(NoFreeBlocksError, RuntimeError)
    with pytest.raises(ValueError, match="unknown block"):
        a.free([4])
    with pytest.raises(ValueError, match="unknown block"):
        a.free([-1])
    a.free(x[:1])
    with pytest.raises(ValueError, match="double free"):
        a.free(x[:1])
    with pytest.raises(ValueError, match="double free"):
        a.free([x[1], x[1]])  # same block twice in one call
    assert a.ref_count(x[1]) == 1, "a rejected free must change nothing"
    with pytest.raises(ValueError, match="incref of free block"):
        a.incref(x[:1])
    with pytest.raises(TypeError):
        a.allocate(1.5)
    with pytest.raises(ValueError):
        a.allocate(-1)
    with pytest.raises(ValueError):
        BlockAllocator(0, 16)
    with pytest.raises(ValueError):
        BlockAllocator(4, 0)


def test_reference_counts_share_blocks():
    a = BlockAllocator(4, 8)
    x = a.allocate(2)
    a.incref(x)
    assert [a.ref_count(b) for b in x] == [2, 2]
    a.free(x)
    assert a.num_free == 2, "still held once: not back on the free list"
    a.free(x)
    assert a.num_free == 4


def test_free_is_not_o_pool():
    """Free/allocate touch only their blocks: the free list is a deque, not a scan of the pool."""
    a = BlockAllocator(1_000_000, 16)
    for _ in range(1000):
        a.free(a.allocate(4))
    assert a.num_free == 1_000_000


@pytest.mark.parametrize("n,bs,want", [(0, 16, 0), (1, 16, 1), (16, 16, 1), (17, 16, 2), (32, 16, 2), (33, 16, 3), (5, 1, 5)])
def test_blocks_needed(n, bs, want):
    assert blocks_needed(n, bs) == want
    assert BlockAllocator(4, bs).blocks_needed(n) == want


def test_slot_mapping():
    assert slot_mapping([7, 2, 5], [0, 3, 4, 9, 11], 4) == [28, 31, 8, 21, 23]
    with pytest.raises(ValueError, match="only 3 blocks"):
        slot_mapping([7, 2, 5], [12], 4)


def test_ensure_capacity():
    a = BlockAllocator(10, 4)
    table: list[int] = []
    assert len(ensure_capacity(a, table, 1)) == 1
    assert ensure_capacity(a, table, 4) == []
    assert len(ensure_capacity(a, table, 9)) == 2 and len(table) == 3


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_blocks_needed_is_tight(n, bs):
    k = blocks_needed(n, bs)
    assert k * bs >= n and (k - 1) * bs < n or k == 0 == n


class AllocatorMachine(RuleBasedStateMachine):
    """Sequences grow token by token, fork (share all blocks), and finish, in random order."""

    def __init__(self):
        super().__init__()
        self.alloc = BlockAllocator(24, 4)
        self.seqs: dict[int, tuple[list[int], int]] = {}  # id -> (block table, tokens)
        self.next_id = 0

    @rule(tokens=st.integers(1, 40))
    def add_sequence(self, tokens):
        need = self.alloc.blocks_needed(tokens)
        if not self.alloc.can_allocate(need):
            before = self.alloc.num_free
            if need <= self.alloc.num_blocks:
                with pytest.raises(NoFreeBlocksError):
                    self.alloc.allocate(need)
            assert self.alloc.num_free == before
            return
        self.seqs[self.next_id] = (self.alloc.allocate(need), tokens)
        self.next_id += 1

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), k=st.integers(1, 9))
    def append_tokens(self, data, k):
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        table, tokens = self.seqs[sid]
        if any(self.alloc.ref_count(b) > 1 for b in table):
            return  # shared blocks are read-only here (copy-on-write is a later chapter)
        try:
            ensure_capacity(self.alloc, table, tokens + k)
        except NoFreeBlocksError:
            return
        self.seqs[sid] = (table, tokens + k)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def fork(self, data):
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        table, tokens = self.seqs[sid]
        self.alloc.incref(table)
        self.seqs[self.next_id] = (list(table), tokens)
        self.next_id += 1

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def finish(self, data):
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        table, _ = self.seqs.pop(sid)
        self.alloc.free(table)

    @precondition(lambda self: self.alloc.num_free)
    @rule(data=st.data())
    def double_free_is_refused(self, data):
        b = data.draw(st.sampled_from(list(self.alloc._free)))
        with pytest.raises(ValueError):
            self.alloc.free([b])

    @invariant()
    def no_leak_no_double_assignment(self):
        held = Counter(b for table, _ in self.seqs.values() for b in table)
        assert self.alloc.num_free + self.alloc.num_used == self.alloc.num_blocks
        assert self.alloc.num_used == len(held), "leaked or lost a block"
        for b in range(self.alloc.num_blocks):
            assert self.alloc.ref_count(b) == held.get(b, 0), f"block {b}: ref count disagrees with holders"
        free = list(self.alloc._free)
        assert len(free) == len(set(free)) and not set(free) & set(held), "a block is both free and held"
        for table, tokens in self.seqs.values():
            assert len(table) == self.alloc.blocks_needed(tokens)


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
