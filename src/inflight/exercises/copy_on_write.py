"""The grader of chapter 5's copy-on-write exercise.

`copy_on_write(allocator, block_table, position)` runs just before a sample writes the keys and
values of token `position`. If the block that position falls in is shared (its reference count is
above 1), the sample must not write into it: take a new block, point `block_table` at it (in
place), drop the sample's reference to the shared block, and return `(shared, new)` so the caller
copies the contents. Otherwise (a block held alone, or a position past the table's end: the token
starts a new block) return None and change nothing. On a dry pool it raises `NoFreeBlocksError`
and changes nothing. `allocator` is the package's `BlockAllocator` (`ref_count`, `allocate`, `free`).

Each case is a script, as the engine runs one: a prompt's blocks, samples forked from it (every
block `incref`'d), then writes — the learner's function, then the table grown for the token (the
package's `ensure_capacity`). What is compared: what each call returned and how many tables held
the block the token then went into, the tables and reference counts at the end, and the free
blocks. Blocks are named by first appearance, so any free-list order passes.
"""
from __future__ import annotations

import random
from typing import Any, Callable

from inflight.engine.block_manager import BlockAllocator, NoFreeBlocksError, copy_on_write, ensure_capacity
from inflight.exercises.answers import Flaw, as_int, type_name
from inflight.exercises.grading import Case, Diagnosis, GradeResult, Mistake, grade, repeat_case

__all__ = ["check_copy_on_write", "run_script", "COW_MISTAKES"]

FIELDS = ("each write: (what it returned, tables holding the block written)", "block tables after",
          "reference counts after", "free blocks after")


def _returned(value: Any, what: str) -> tuple | None:
    if value is None:
        return None
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise Flaw(f"returned {type_name(value)}", repr(value)[:60],
                   f"{what} returned {type_name(value)}: return the pair (shared block, new block) when it "
                   "copied, or None when nothing had to be copied.", first=True)
    return tuple(as_int(v, what, "block ids are ints") for v in value)


def run_script(fn: Callable, num_blocks: int, block_size: int, prompt_len: int, samples: int,
               writes: list[int], fill: int = 0) -> tuple:
    """Fork a prompt of `prompt_len` tokens into `samples` samples (with `fill` blocks taken by
    someone else), then let `writes[k]`'s sample write its next token: `fn` first, then growth."""
    alloc = BlockAllocator(num_blocks, block_size)
    prompt = alloc.allocate(-(-prompt_len // block_size))
    tables = [list(prompt)] + [list(prompt) for _ in range(samples - 1)]
    for t in tables[1:]:
        alloc.incref(t)
    alloc.allocate(fill)
    lengths = [prompt_len] * samples
    names: dict[int, str] = {}

    def name(b: int) -> str:
        return names.setdefault(b, f"b{len(names)}")

    for t in tables:
        [name(b) for b in t]
    log = []
    for j in writes:
        p = lengths[j]
        what = f"copy_on_write(allocator, sample {j}'s table, {p})"
        try:
            got = _returned(fn(alloc, tables[j], p), what)
        except NoFreeBlocksError:
            log.append(("NoFreeBlocksError", None))
            continue
        try:
            ensure_capacity(alloc, tables[j], p + 1)
        except NoFreeBlocksError:
            log.append((got and tuple(map(name, got)), "no block to grow into"))
            continue
        block = tables[j][p // block_size]
        log.append((got and tuple(map(name, got)), alloc.ref_count(block)))
        lengths[j] += 1
    final = [[name(b) for b in t] for t in tables]
    refs = {names[b]: alloc.ref_count(b) for b in sorted(names, key=lambda b: names[b])}
    return log, final, refs, alloc.num_free


def _tags(bs: int, prompt_len: int, samples: int, writes: list[int], fill: int, num_blocks: int) -> frozenset:
    tags = set()
    if samples > 1 and prompt_len % bs:
        tags.add("shared partial block")
    if samples > 1 and not prompt_len % bs:
        tags.add("block boundary")
    if samples == 1:
        tags.add("held alone")
    if len(set(writes)) == samples > 1:
        tags.add("last holder")
    if num_blocks - fill - (-(-prompt_len // bs)) < samples:
        tags.add("few free blocks")
    return frozenset(tags)


TAGS = {
    "shared partial block": ("the prompt's last block is partly filled and shared: the samples' first tokens go there",
                             "a sample may write into that block only once it holds it alone."),
    "block boundary": ("the prompt fills its blocks exactly", "the first token then starts a NEW block: nothing "
                       "shared is written, so nothing is copied — look at the block `position` falls in, not the "
                       "table's last block."),
    "held alone": ("one sequence holds every block (reference count 1)", "a block held alone is written in place: "
                   "no copy, no new block."),
    "last holder": ("every sample writes in turn", "the last sample to write finds the shared block with a "
                    "reference count of 1: it writes in place."),
    "few free blocks": ("the pool has fewer free blocks than writers", "when `allocate` raises "
                        "NoFreeBlocksError nothing may have changed yet: allocate before dropping any reference."),
}


def _cases() -> list[Case]:
    specs = [
        ("the first of two samples writes into the shared last block", 8, 4, 6, 2, [0], 0),
        ("two samples write in turn", 8, 4, 6, 2, [0, 1], 0),
        ("four samples write in turn", 16, 4, 9, 4, [0, 1, 2, 3], 0),
        ("three samples, the middle one first", 12, 4, 5, 3, [1, 0, 2], 0),
        ("a prompt that fills its blocks exactly", 12, 4, 8, 3, [0, 1, 2], 0),
        ("a request alone", 8, 4, 6, 1, [0, 0, 0], 0),
        ("samples writing on after their copies", 12, 4, 6, 2, [0, 0, 1, 1, 0, 1, 0, 1], 0),
        ("no free block for the copy", 4, 4, 6, 2, [0], 2),
        ("one free block, two writers", 3, 4, 6, 2, [0, 1], 0),
        ("blocks of one token", 12, 1, 3, 3, [0, 1, 2], 0),
        ("blocks of two, a long prompt", 40, 2, 31, 3, [2, 1, 0, 0, 1, 2], 0),
    ]
    rng = random.Random("copy-on-write")
    for k in range(24):
        bs, samples = rng.choice([1, 2, 4, 8]), rng.randint(1, 5)
        prompt_len = rng.randint(1, 20)
        prompt_blocks = -(-prompt_len // bs)
        num_blocks = prompt_blocks + rng.randint(0, 3 * samples + 2)
        writes = [rng.randrange(samples) for _ in range(rng.randint(1, 12))]
        specs.append((f"random script #{k}", num_blocks, bs, prompt_len, samples, writes, 0))
    cases = []
    for title, nb, bs, plen, n, writes, fill in specs:
        cases.append(Case(title, lambda f, a=(nb, bs, plen, n, writes, fill): run_script(f, *a),
                          f"pool of {nb} blocks of {bs}, a {plen}-token prompt forked into {n} sample(s)"
                          + (f", {fill} block(s) taken by another request" if fill else "")
                          + f"; writes by samples {writes}", tags=_tags(bs, plen, n, writes, fill, nb),
                          fields=FIELDS, data=(nb, bs, plen, n, writes, fill)))
    return cases + [repeat_case(cases, (0, 1, 2))]


# -- the classic mistakes, as code ---------------------------------------------------------------
def _never(alloc, table, p):
    return None


def _always(alloc, table, p):
    i = p // alloc.block_size
    if i >= len(table):
        return None
    new = alloc.allocate(1)[0]
    old, table[i] = table[i], new
    alloc.free([old])
    return old, new


def _last_block(alloc, table, p):
    if not table or alloc.ref_count(table[-1]) <= 1:
        return None
    new = alloc.allocate(1)[0]
    old, table[-1] = table[-1], new
    alloc.free([old])
    return old, new


def _copy(alloc, table, p, *, drop=True, update=True, swap=False, threshold=1, incref=False, free_first=False):
    i = p // alloc.block_size
    if i >= len(table) or alloc.ref_count(table[i]) <= threshold:
        return None
    old = table[i]
    if free_first:
        alloc.free([old])
    new = alloc.allocate(1)[0]
    if incref:
        alloc.incref([new])
    if drop and not free_first:
        alloc.free([old])
    if update:
        table[i] = new
    return (new, old) if swap else (old, new)


def _drop_all(alloc, table, p):
    i = p // alloc.block_size
    if i >= len(table) or alloc.ref_count(table[i]) <= 1:
        return None
    old, new = table[i], alloc.allocate(1)[0]
    alloc.free([old] * alloc.ref_count(old))
    table[i] = new
    return old, new


COW_MISTAKES = [
    Mistake("writes into the shared block", "the block is shared (reference count above 1): the other samples still "
            "read it, so writing there changes their past. Copy it first: a new block, the table pointed at it, "
            "one reference fewer on the shared one.", _never),
    Mistake("copies a block it holds alone", "a block with reference count 1 is the sample's own: write it in "
            "place. Copying it costs a block and a copy for nothing (and the last sharer never needs one).", _always),
    Mistake("the table's last block, not the position's", "at a block boundary the token starts a new block, and "
            "the table's last block (full, shared) is never written: look at `block_table[position // "
            "block_size]`, and do nothing when that is past the table's end.", _last_block),
    Mistake("the shared block keeps its reference", "after the copy this table no longer holds the shared block, "
            "so its reference must be dropped (`allocator.free([shared])`): else the block can never be freed, "
            "a leak.", lambda a, t, p: _copy(a, t, p, drop=False)),
    Mistake("all references dropped", "free([shared]) once drops THIS table's reference; dropping them all frees "
            "a block the other samples still hold.", _drop_all),
    Mistake("the table still points at the shared block", "the block table must hold the new block "
            "(`block_table[i] = new`, in place): the sample would otherwise write into the shared block anyway.",
            lambda a, t, p: _copy(a, t, p, update=False)),
    Mistake("the pair the wrong way round", "return (shared, new): the caller copies FROM the shared block INTO the "
            "new one.", lambda a, t, p: _copy(a, t, p, swap=True)),
    Mistake("shared means more than two holders", "a block is shared as soon as TWO tables hold it: copy when the "
            "reference count is above 1.", lambda a, t, p: _copy(a, t, p, threshold=2)),
    Mistake("the new block shared too", "a block from `allocate` already has reference count 1, for this table: "
            "an `incref` on it counts a holder that does not exist (it is never freed).",
            lambda a, t, p: _copy(a, t, p, incref=True)),
    Mistake("dropped the reference before allocating", "when the pool is dry, `allocate` raises — and the shared "
            "block has already lost this table's reference while the table still names it. Allocate first, then "
            "drop the reference.", lambda a, t, p: _copy(a, t, p, free_first=True)),
]


def _explain(candidate: Any, failures: list) -> Diagnosis | None:
    """A rule the answers break, read off the observations: a token written into a block other tables
    hold, or reference counts that no longer match the tables."""
    for case, expected, got in failures:
        if not (isinstance(got, tuple) and len(got) == 4):
            continue
        log, tables, refs, _ = got
        for k, (_, holders) in enumerate(log):
            if isinstance(holders, int) and holders > 1:
                return Diagnosis("a token written into a shared block", f"after your function, write {k + 1} of this "
                                 f"script went into a block {holders} tables hold: the other samples would read the "
                                 "new token as part of their own past. A shared block must be copied before the "
                                 "write.", case)
        held: dict[str, int] = {}
        for t in tables:
            for b in t:
                held[b] = held.get(b, 0) + 1
        wrong = [b for b in refs if refs[b] != held.get(b, 0)]
        if wrong:
            b = wrong[0]
            return Diagnosis("reference counts that miss the tables", f"at the end, block {b} is in {held.get(b, 0)} "
                             f"table(s) but its reference count is {refs[b]}: every table that stops holding a block "
                             "drops one reference (`free([block])`), and a new block starts at 1.", case)
    return None


def check_copy_on_write(fn: Callable[[BlockAllocator, list, int], Any], *, quiet: bool = False) -> GradeResult:
    """Grade `fn(allocator, block_table, position) -> (shared, new) | None` (see the module docstring)."""
    if not callable(fn):
        raise TypeError(f"pass your copy_on_write FUNCTION, not {type(fn).__name__}")
    return grade("copy_on_write", fn, copy_on_write, _cases(), COW_MISTAKES, quiet=quiet, explain=_explain, tags=TAGS)
