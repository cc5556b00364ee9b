"""Chapter 5's copy-on-write grader accepts correct code in several styles and names the mistake
of independently written wrong ones (written here the way a learner would, not imported from the
package's `Mistake`s); a diagnosis is given only when the code behaves like it."""
import numpy as np
import pytest

from inflight.engine.block_manager import NoFreeBlocksError
from inflight.exercises.copy_on_write import check_copy_on_write


# --- right, in several styles ----------------------------------------------------------------------
def cow_plain(allocator, block_table, position):
    i = position // allocator.block_size
    if i < len(block_table) and allocator.ref_count(block_table[i]) > 1:
        shared = block_table[i]
        [private] = allocator.allocate(1)
        allocator.free([shared])
        block_table[i] = private
        return shared, private
    return None


def cow_divmod_list(allocator, block_table, position):
    i, _ = divmod(position, allocator.block_size)
    if i >= len(block_table):
        return None  # a new block: growing the table allocates it
    old = block_table[i]
    if allocator.ref_count(old) >= 2:
        new = allocator.allocate(1)
        block_table[i:i + 1] = new
        allocator.free([old])
        return [old, new[0]]
    return None


def cow_numpy_ids(allocator, block_table, position):
    i = position // allocator.block_size
    if i < len(block_table) and allocator.ref_count(block_table[i]) != 1:
        new = np.int64(allocator.allocate(1)[0])
        old = np.int64(block_table[i])
        allocator.free([int(old)])
        block_table[i] = int(new)
        return old, new
    return None


@pytest.mark.parametrize("fn", [cow_plain, cow_divmod_list, cow_numpy_ids])
def test_accepts_correct(fn):
    r = check_copy_on_write(fn, quiet=True)
    assert r, r.report


# --- wrong, as learners write it ---------------------------------------------------------------------
def cow_write_in_place(allocator, block_table, position):
    return None  # "the KV is the same anyway"


def cow_copy_whenever_in_range(allocator, block_table, position):
    i = position // allocator.block_size
    if i < len(block_table):
        new = allocator.allocate(1)[0]
        allocator.free([block_table[i]])
        old, block_table[i] = block_table[i], new
        return old, new


def cow_looks_at_last(allocator, block_table, position):
    last = block_table[-1]
    if allocator.ref_count(last) > 1:
        new = allocator.allocate(1)[0]
        allocator.free([last])
        block_table[-1] = new
        return last, new


def cow_forgets_free(allocator, block_table, position):
    i = position // allocator.block_size
    if i < len(block_table) and allocator.ref_count(block_table[i]) > 1:
        new = allocator.allocate(1)[0]
        old = block_table[i]
        block_table[i] = new
        return old, new


def cow_new_first_in_pair(allocator, block_table, position):
    i = position // allocator.block_size
    if i < len(block_table) and allocator.ref_count(block_table[i]) > 1:
        new = allocator.allocate(1)[0]
        allocator.free([block_table[i]])
        old, block_table[i] = block_table[i], new
        return new, old


def cow_on_a_copy_of_the_table(allocator, block_table, position):
    table = list(block_table)  # "never change the caller's list"
    i = position // allocator.block_size
    if i < len(table) and allocator.ref_count(table[i]) > 1:
        new = allocator.allocate(1)[0]
        allocator.free([table[i]])
        old, table[i] = table[i], new
        return old, new


def cow_more_than_two(allocator, block_table, position):
    i = position // allocator.block_size
    if i < len(block_table) and allocator.ref_count(block_table[i]) > 2:
        new = allocator.allocate(1)[0]
        allocator.free([block_table[i]])
        old, block_table[i] = block_table[i], new
        return old, new


def cow_free_then_allocate(allocator, block_table, position):
    i = position // allocator.block_size
    if i < len(block_table) and allocator.ref_count(block_table[i]) > 1:
        old = block_table[i]
        allocator.free([old])
        block_table[i] = allocator.allocate(1)[0]
        return old, block_table[i]


def cow_frees_every_reference(allocator, block_table, position):
    i = position // allocator.block_size
    if i < len(block_table) and allocator.ref_count(block_table[i]) > 1:
        old = block_table[i]
        new = allocator.allocate(1)[0]
        while allocator.ref_count(old):
            allocator.free([old])
        block_table[i] = new
        return old, new


def cow_leaves_one_reference(allocator, block_table, position):
    i = position // allocator.block_size
    if i < len(block_table) and allocator.ref_count(block_table[i]) > 1:
        old = block_table[i]
        new = allocator.allocate(1)[0]
        while allocator.ref_count(old) > 1:  # "down to the one the others share"
            allocator.free([old])
        block_table[i] = new
        return old, new


def cow_returns_flag(allocator, block_table, position):
    i = position // allocator.block_size
    if i < len(block_table) and allocator.ref_count(block_table[i]) > 1:
        new = allocator.allocate(1)[0]
        allocator.free([block_table[i]])
        block_table[i] = new
        return True
    return False


def cow_no_bounds_check(allocator, block_table, position):
    old = block_table[position // allocator.block_size]
    if allocator.ref_count(old) > 1:
        new = allocator.allocate(1)[0]
        allocator.free([old])
        block_table[position // allocator.block_size] = new
        return old, new


def cow_swallows_dry_pool(allocator, block_table, position):
    try:
        return cow_plain(allocator, block_table, position)
    except NoFreeBlocksError:
        return None  # "write in place then"


@pytest.mark.parametrize("fn, diagnosis", [
    (cow_write_in_place, "writes into the shared block"),
    (cow_copy_whenever_in_range, "copies a block it holds alone"),
    (cow_looks_at_last, "the table's last block, not the position's"),
    (cow_forgets_free, "the shared block keeps its reference"),
    (cow_new_first_in_pair, "the pair the wrong way round"),
    (cow_on_a_copy_of_the_table, "the table still points at the shared block"),
    (cow_more_than_two, "shared means more than two holders"),
    (cow_free_then_allocate, "dropped the reference before allocating"),
    (cow_frees_every_reference, "all references dropped"),
    (cow_leaves_one_reference, "reference counts that miss the tables"),
    (cow_returns_flag, "returned a bool"),
    (cow_no_bounds_check, "IndexError"),
    (cow_swallows_dry_pool, "a token written into a shared block"),
])
def test_names_the_mistake(fn, diagnosis):
    r = check_copy_on_write(fn, quiet=True)
    assert not r
    assert diagnosis.lower() in r.report.lower(), r.report
    assert r.report.count("💡") == 1 and "🤔" not in r.report


def test_a_stub_is_not_implemented_and_a_class_is_refused():
    def stub(allocator, block_table, position):
        raise NotImplementedError

    assert check_copy_on_write(stub, quiet=True).not_implemented
    with pytest.raises(TypeError, match="FUNCTION"):
        check_copy_on_write(42, quiet=True)
