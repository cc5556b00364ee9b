"""The paged-KV graders accept correct code (several styles) and reject independently written wrong
implementations with the right explanation. Mutants are written here, not imported from the package."""
import math
from collections import deque

import pytest

from inflight.engine.block_manager import BlockAllocator, NoFreeBlocksError
from inflight.exercises.paged import StarterAllocator, check_allocator, check_blocks_needed, check_slot_mapping


def _stub(*args, **kwargs):
    raise NotImplementedError


# --- blocks needed ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [
    lambda n, bs: -(-n // bs),
    lambda n, bs: (n + bs - 1) // bs,
    lambda n, bs: math.ceil(n / bs),
    lambda n, bs: n // bs + (1 if n % bs else 0),
])
def test_blocks_needed_accepts_correct(fn):
    assert check_blocks_needed(fn, quiet=True)


@pytest.mark.parametrize("fn,mistake", [
    (lambda n, bs: int(n / bs), "floor division"),
    (lambda n, bs: (n // bs) + 1, "one block too many"),
    (lambda n, bs: (n - 1) // bs + 1 if n > 0 else 1, "a block for nothing"),
    (lambda n, bs: int(round(n / bs)), "rounding to nearest"),
    (lambda n, bs: (n + bs - 1) // bs * bs, "slots instead of blocks"),
    (lambda n, bs: math.floor(n / bs), "floor division"),
])
def test_blocks_needed_rejects_mutants(fn, mistake):
    r = check_blocks_needed(fn, quiet=True)
    assert not r and r.mistake == mistake, r.report
    assert r.report.count("💡") == 1 and "🤔" not in r.report


def test_blocks_needed_stub():
    assert check_blocks_needed(_stub, quiet=True).not_implemented


# --- slot mapping -------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [
    lambda t, ps, bs: [t[p // bs] * bs + p % bs for p in ps],
    lambda t, ps, bs: [t[divmod(p, bs)[0]] * bs + divmod(p, bs)[1] for p in ps],
])
def test_slot_mapping_accepts_correct(fn):
    assert check_slot_mapping(fn, quiet=True)


def _slots_logical(t, ps, bs):
    return list(ps)


def _slots_unscaled(t, ps, bs):
    out = []
    for p in ps:
        block, off = divmod(p, bs)
        out.append(t[block] + off)
    return out


def _slots_swapped(t, ps, bs):
    return [t[p % bs] * bs + p // bs for p in ps]


def _slots_one_based(t, ps, bs):
    return [t[(p - 1) // bs] * bs + (p - 1) % bs for p in ps]


def _slots_table_len(t, ps, bs):
    n = len(t)
    return [t[p // bs] * n + p % bs for p in ps]


@pytest.mark.parametrize("fn,mistake", [
    (_slots_logical, "logical block instead of physical"),
    (_slots_unscaled, "block id not scaled"),
    (_slots_swapped, "block index and offset swapped"),
    (_slots_one_based, "positions counted from 1"),
    (_slots_table_len, "scaled by the table length"),
])
def test_slot_mapping_rejects_mutants(fn, mistake):
    r = check_slot_mapping(fn, quiet=True)
    assert not r and r.mistake == mistake, r.report
    assert r.report.count("💡") == 1 and "🤔" not in r.report


def test_slot_mapping_stub():
    assert check_slot_mapping(_stub, quiet=True).not_implemented


# --- allocator ----------------------------------------------------------------------------------------
class StackAllocator(StarterAllocator):
    """Correct, but LIFO and with a set of free ids: any free-list order must be accepted."""

    def allocate(self, n):
        if n > self.num_blocks:
            raise ValueError("too many")
        if n > len(self.free_list):
            raise NoFreeBlocksError("not now")
        taken = [self.free_list.pop() for _ in range(n)]
        for b in taken:
            self.ref_counts[b] += 1
        return taken

    def free(self, blocks):
        wanted = {}
        for b in blocks:
            if b < 0 or b >= self.num_blocks:
                raise ValueError("unknown")
            wanted[b] = wanted.get(b, 0) + 1
            if wanted[b] > self.ref_counts[b]:
                raise ValueError("double")
        for b in blocks:
            self.ref_counts[b] -= 1
            if not self.ref_counts[b]:
                self.free_list.append(b)


@pytest.mark.parametrize("cls", [BlockAllocator, StackAllocator])
def test_allocator_accepts_correct(cls):
    assert check_allocator(cls, quiet=True)


class Leaky(StackAllocator):
    def free(self, blocks):
        for b in blocks:
            if b < 0 or b >= self.num_blocks or not self.ref_counts[b]:
                raise ValueError(b)
            self.ref_counts[b] -= 1


class Peeker(StackAllocator):
    def allocate(self, n):
        if n > self.num_blocks:
            raise ValueError(n)
        if n > len(self.free_list):
            raise NoFreeBlocksError(n)
        taken = [self.free_list[i] for i in range(n)]
        for b in taken:
            self.ref_counts[b] = 1
        return taken


class Trusting(StackAllocator):
    def free(self, blocks):
        for b in blocks:
            if b < 0 or b >= self.num_blocks:
                raise ValueError(b)
            self.ref_counts[b] = 0
            self.free_list.append(b)


class SharesBadly(StackAllocator):
    def free(self, blocks):
        for b in blocks:
            if b < 0 or b >= self.num_blocks or self.ref_counts[b] == 0:
                raise ValueError(b)
        for b in blocks:
            if self.ref_counts[b] > 0:
                self.ref_counts[b] = 0
                self.free_list.append(b)


class Greedy(StackAllocator):
    def allocate(self, n):
        if n > self.num_blocks:
            raise ValueError(n)
        got = []
        while len(got) < n:
            if not self.free_list:
                raise NoFreeBlocksError("ran out halfway")
            b = self.free_list.pop()
            self.ref_counts[b] = 1
            got.append(b)
        return got


class Careless(StackAllocator):
    def allocate(self, n):
        got = [self.free_list.pop() for _ in range(n)]
        for b in got:
            self.ref_counts[b] = 1
        return got


class NegativeIds(StackAllocator):
    def free(self, blocks):
        for b in blocks:
            if self.ref_counts[b] == 0:
                raise ValueError(b)
        for b in blocks:
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_list.append(b)


class CheckAsYouGo(StackAllocator):
    def free(self, blocks):
        for b in blocks:
            if b < 0 or b >= self.num_blocks or not self.ref_counts[b]:
                raise ValueError(b)
            self.ref_counts[b] -= 1
            if not self.ref_counts[b]:
                self.free_list.append(b)


class OneError(StackAllocator):
    def allocate(self, n):
        if n > len(self.free_list):
            raise NoFreeBlocksError("not enough")
        taken = [self.free_list.pop() for _ in range(n)]
        for b in taken:
            self.ref_counts[b] = 1
        return taken


@pytest.mark.parametrize("cls,mistake", [
    (CheckAsYouGo, "free() not all-or-nothing"),
    (OneError, "one error for both limits"),
    (Leaky, "leaking blocks on free"),
    (Peeker, "handing out a block twice"),
    (Trusting, "no double-free check"),
    (SharesBadly, "ignoring reference counts"),
    (Greedy, "partial allocation leaks"),
    (Careless, "no limit checks"),
    (NegativeIds, "unknown block ids not checked"),
])
def test_allocator_rejects_mutants(cls, mistake):
    r = check_allocator(cls, quiet=True)
    assert not r and r.mistake == mistake, r.report
    assert r.report.count("💡") == 1 and "🤔" not in r.report


def test_allocator_stub_and_type_error():
    assert check_allocator(StarterAllocator, quiet=True).not_implemented
    with pytest.raises(TypeError, match="CLASS"):
        check_allocator(BlockAllocator(4, 16))


def test_starter_state_is_what_the_chapter_describes():
    a = StarterAllocator(5, 16)
    assert isinstance(a.free_list, deque) and a.ref_counts == [0] * 5 and a.num_free == 5
