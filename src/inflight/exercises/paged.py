"""Graders for the paged KV cache chapter: blocks needed for n tokens, the slot mapping, and a
block allocator's `allocate` / `free`.

Answers are checked as strictly as the code that consumes them: block counts and slots are ints
(numpy ints too; never floats, bools or strings), and the inputs are left unchanged. The allocator's
cases (scripts of allocate / free / incref, and the O(blocks touched) cost) are in
`allocator_cases`; the classic wrong allocators, as code, in `paged_allocators`.
"""
from __future__ import annotations

import random
from typing import Callable

from inflight.engine.block_manager import blocks_needed, slot_mapping
from inflight.exercises.answers import as_int, as_int_list, call_unchanged
from inflight.exercises.grading import Case, Diagnosis, GradeResult, Mistake, grade, repeat_case
from inflight.exercises.allocator_cases import TAGS as ALLOCATOR_TAGS
from inflight.exercises.allocator_cases import allocator_cases, explain_trace
from inflight.exercises.paged_allocators import ALLOCATOR_MISTAKES, ReferenceAllocator, StarterAllocator

__all__ = ["check_blocks_needed", "check_slot_mapping", "check_allocator", "StarterAllocator"]


# --- blocks needed -----------------------------------------------------------------------------------
def _blocks_cases() -> list[Case]:
    pairs = [(0, 16), (1, 16), (15, 16), (16, 16), (17, 16), (32, 16), (33, 16), (1, 1), (5, 1), (7, 8),
             (8, 8), (9, 8), (100, 32), (128, 32), (129, 32), (4096, 16),
             # one token past a boundary with big blocks: a rounding trick (`round(n / bs + 0.49)`) misses them
             (1, 128), (129, 128), (65, 64), (1, 64), (191, 128)]
    rng = random.Random("blocks-needed")
    pairs += [(rng.randint(0, 5000), rng.choice([1, 2, 8, 16, 32, 64, 128])) for _ in range(40)]
    cases = [Case(f"blocks_needed({n}, {bs})", lambda f, n=n, bs=bs: _blocks(f, n, bs),
                  f"num_tokens={n}, block_size={bs}", tags=_block_tags(n, bs)) for n, bs in pairs]
    return cases + [repeat_case(cases, (4, 3, 1))]


def _blocks(f: Callable, n: int, bs: int) -> int:
    return as_int(f(n, bs), f"blocks_needed({n}, {bs})", "block counts are ints (the allocator takes nothing else)")


def _block_tags(n: int, bs: int) -> frozenset:
    tags = set()
    if n == 0:
        tags.add("zero")
    elif n % bs == 0:
        tags.add("exact multiple")
    else:
        tags.add("partial block")
    if bs == 1:
        tags.add("block size 1")
    if 0 < n < bs:
        tags.add("less than a block")
    return frozenset(tags)


BLOCKS_TAGS = {
    "zero": ("num_tokens is 0", "0 tokens need 0 blocks: look at what your formula gives for 0."),
    "exact multiple": ("num_tokens is an exact multiple of block_size (16 tokens in blocks of 16)",
                       "a full last block needs no extra block: 16 tokens fit in ONE block of 16."),
    "partial block": ("the last block is only partly filled (17 tokens in blocks of 16)",
                      "a partly filled last block is still a block: round UP."),
    "less than a block": ("num_tokens is less than one block", "1 to block_size - 1 tokens need one block."),
    "block size 1": ("block_size is 1", "with blocks of one token, n tokens need n blocks."),
}


BLOCKS_NEEDED_MISTAKES = [
    Mistake("floor division", "`n // block_size` drops the partly filled last block: 17 tokens in blocks of "
            "16 need 2 blocks, not 1. Round UP: `-(-n // block_size)` or `(n + block_size - 1) // block_size`.",
            lambda n, bs: n // bs),
    Mistake("one block too many", "`n // block_size + 1` is right unless n is an exact multiple: 16 tokens fit in "
            "ONE block of 16. Use ceiling division: `(n + block_size - 1) // block_size`.",
            lambda n, bs: n // bs + 1),
    Mistake("a block for nothing", "0 tokens need 0 blocks; a `max(1, ...)` reserves a block an empty sequence "
            "never uses.", lambda n, bs: max(1, -(-n // bs))),
    Mistake("rounding to nearest", "`round(n / block_size)` rounds 17/16 down to 1 block; the cache needs the "
            "ceiling, never the nearest integer.", lambda n, bs: round(n / bs)),
    Mistake("slots instead of blocks", "that is the number of token SLOTS (blocks × block_size); the allocator "
            "counts blocks.", lambda n, bs: -(-n // bs) * bs),
    Mistake("one block too few", "`(n - 1) // block_size` is one less than the blocks needed (the ceiling is "
            "`(n - 1) // block_size + 1` for n >= 1, and 0 for n = 0): use `(n + block_size - 1) // block_size`.",
            lambda n, bs: (n - 1) // bs),
    Mistake("rounded up by adding 1 block", "`n // block_size + 1` rounds up a partial block but adds a block for "
            "nothing when n is an exact multiple (and for n = 0): add 1 only when `n % block_size` is not 0.",
            lambda n, bs: n // bs + (1 if n else 0)),
]


def check_blocks_needed(fn: Callable[[int, int], int], *, quiet: bool = False) -> GradeResult:
    """Grade `fn(num_tokens, block_size) -> int`: how many blocks hold `num_tokens` tokens."""
    return grade("blocks_needed", fn, blocks_needed, _blocks_cases(), BLOCKS_NEEDED_MISTAKES, quiet=quiet,
                 tags=BLOCKS_TAGS)


# --- slot mapping ------------------------------------------------------------------------------------
def _slot_cases() -> list[Case]:
    specs = [
        ("the chapter's example", [7, 2, 5], [0, 3, 4, 9, 11], 4),
        ("a whole prompt", [3, 0, 6], list(range(10)), 4),
        ("one decode token at the start of a new block", [9, 4], [16], 16),
        ("one decode token mid-block", [9, 4], [21], 16),
        ("block size 1", [5, 3, 8, 1], [0, 1, 2, 3], 1),
        ("identity block table", [0, 1, 2], list(range(0, 48, 5)), 16),
        ("no new tokens", [4, 1], [], 8),
        ("the last slot of the table", [2, 9, 6], [23], 8),
        ("a chunk that crosses two block boundaries", [11, 3, 0, 7], list(range(6, 26)), 8),
        ("blocks at both ends of the pool", [0, 63], [0, 1, 2, 3, 4, 5, 6, 7], 4),
    ]
    rng = random.Random("slot-mapping")
    for k in range(12):
        bs = rng.choice([2, 4, 8, 16, 32])
        nblocks = rng.randint(1, 6)
        table = rng.sample(range(64), nblocks)
        n = rng.randint(1, nblocks * bs)
        start = rng.randint(0, n - 1)
        specs.append((f"random scrambled table #{k}", table, list(range(start, n)), bs))
    cases = [Case(name, lambda f, t=t, p=p, bs=bs: _slots(f, t, p, bs),
                  f"block_table={t}, positions={p if len(p) <= 12 else str(p[:12])[:-1] + ', ...]'}, block_size={bs}",
                  tags=_slot_tags(t, p, bs), unit="position", data=(t, p, bs)) for name, t, p, bs in specs]
    return cases + [repeat_case(cases)]


def _slots(f: Callable, table: list, positions: list, bs: int) -> list[int]:
    got = call_unchanged(f, [list(table), list(positions), bs], ["block_table", "positions", "block_size"],
                         "They are the request's own block table and positions.")
    return as_int_list(got, "slot_mapping(...)", "it returns one int slot per position")


def _slot_tags(table: list, positions: list, bs: int) -> frozenset:
    tags = set()
    if any(p // bs > 0 for p in positions):
        tags.add("past the first block")
    if any(p % bs == 0 for p in positions):
        tags.add("block start")
    if len(table) > 1 and any(t != i for i, t in enumerate(table)):
        tags.add("scrambled table")
    if bs == 1:
        tags.add("block size 1")
    if not positions:
        tags.add("no positions")
    if positions and positions[0] > 0:
        tags.add("starts mid-sequence")
    return frozenset(tags)


SLOT_TAGS = {
    "no positions": ("there are no new positions", "no positions, no slots: return an empty list."),
    "past the first block": ("some positions lie beyond the first block",
                             "the block of position p is block_table[p // block_size]: the table is indexed by "
                             "p // block_size, and the offset inside the block is p % block_size."),
    "starts mid-sequence": ("the new positions start after position 0 (a decode, or a later chunk)",
                            "positions are absolute positions in the sequence, not counted from the first new "
                            "token: use p itself."),
    "block size 1": ("block_size is 1", "with blocks of one token, the slot of p is block_table[p]."),
}


SLOT_MAPPING_MISTAKES = [
    Mistake("logical block instead of physical", "the token's block is `block_table[p // block_size]`, not "
            "`p // block_size`: blocks are scattered through the pool, that is the whole point of the block table.",
            lambda t, ps, bs: [(p // bs) * bs + p % bs for p in ps]),
    Mistake("block id not scaled", "a block id counts BLOCKS; multiply it by block_size to get the first slot of "
            "that block: `block_table[p // bs] * bs + p % bs`.",
            lambda t, ps, bs: [t[p // bs] + p % bs for p in ps]),
    Mistake("block index and offset swapped", "`p // block_size` picks the block (table index) and "
            "`p % block_size` is the offset inside it, not the other way round.",
            lambda t, ps, bs: [t[p % bs] * bs + p // bs for p in ps]),
    Mistake("positions counted from 1", "positions start at 0: the first token of a sequence is position 0, "
            "slot `block_table[0] * block_size`.",
            lambda t, ps, bs: [t[(p - 1) // bs] * bs + (p - 1) % bs for p in ps]),
    Mistake("scaled by the table length", "the stride between blocks is block_size (the tokens per block), "
            "not the number of blocks in the table.",
            lambda t, ps, bs: [t[p // bs] * len(t) + p % bs for p in ps]),
    Mistake("every token in the last block", "only a decode's single new token is sure to land in the LAST block; "
            "a prompt's positions span several blocks: look each one up, `block_table[p // block_size]`.",
            lambda t, ps, bs: [t[-1] * bs + p % bs for p in ps]),
    Mistake("offset not taken modulo block_size", "the offset inside a block is `p % block_size`; adding p itself "
            "counts the earlier blocks' tokens twice.", lambda t, ps, bs: [t[p // bs] * bs + p for p in ps]),
    Mistake("positions counted from the first new token", "a position is absolute (where the token sits in the "
            "whole sequence), so use p itself, not p minus the first new position.",
            lambda t, ps, bs: [t[(p - ps[0]) // bs] * bs + (p - ps[0]) % bs for p in ps]),
]


def _slot_parts(candidate: Callable, failures: list) -> Diagnosis | None:
    """Which half of a slot is wrong — the block (through the table) or the offset inside it."""
    pairs = []
    for case, expected, got in failures:
        if case.data is None or type(got) is not list or len(got) != len(expected):
            continue
        table, positions, bs = case.data
        pairs += [(p, bs, divmod(e, bs), divmod(g, bs), case) for p, e, g in zip(positions, expected, got) if e != g]
    if not pairs:
        return None
    for k in (1, -1, 2, -2):  # the slot of a neighbouring position: positions counted from 1, or a +1 too many
        shifted = [(c.data[0], p + k, bs, got) for p, bs, _, (gb, go), c in pairs for got in [gb * bs + go]]
        if all(0 <= q < len(t) * bs and t[q // bs] * bs + q % bs == g for t, q, bs, g in shifted):
            p = pairs[0][0]
            return Diagnosis("the slot of another position", f"each of your slots is the slot of position p {k:+d}, "
                             f"not of p (for position {p} you return the slot of position {p + k}): positions are "
                             "0-based and the slot of p uses p itself.", pairs[0][4])
    blocks_ok = all(gb == eb for _, _, (eb, _), (gb, _), _ in pairs)
    offsets_ok = all(go == eo for _, _, (_, eo), (_, go), _ in pairs)
    p, bs, (eb, eo), (gb, go), case = pairs[0]
    if offsets_ok and not blocks_ok:
        return Diagnosis("right offset, wrong block", f"your slots sit at the right offset inside a block (p % "
                         f"block_size) but in the wrong block: position {p} belongs in block {eb} (block_table[{p} // "
                         f"{bs}]), yours is in block {gb}. Look up the block through the table, then multiply by "
                         "block_size.", case)
    if blocks_ok and not offsets_ok:
        return Diagnosis("right block, wrong offset", f"your slots are in the right block but at the wrong offset "
                         f"inside it: position {p} is at offset {eo} (= {p} % {bs}), yours at {go}. The offset inside "
                         "the block is p % block_size.", case)
    return None


def check_slot_mapping(fn: Callable[[list, list, int], list], *, quiet: bool = False) -> GradeResult:
    """Grade `fn(block_table, positions, block_size) -> list[int]`: the cache slot of each position."""
    return grade("slot_mapping", fn, slot_mapping, _slot_cases(), SLOT_MAPPING_MISTAKES, quiet=quiet, tags=SLOT_TAGS,
                 explain=_slot_parts)


# --- the allocator -----------------------------------------------------------------------------------
def check_allocator(cls: type, *, quiet: bool = False) -> GradeResult:
    """Grade an allocator class built as `cls(num_blocks, block_size)` with `allocate`, `free`,
    `incref` and `num_free`: replays scripted and random operation sequences (`allocator_cases`) and
    checks that the work of allocate/free does not grow with the pool."""
    if not isinstance(cls, type):
        raise TypeError(f"pass the allocator CLASS (e.g. MyBlockAllocator), not {type(cls).__name__}")
    return grade("BlockAllocator.allocate/free", cls, ReferenceAllocator, allocator_cases(), ALLOCATOR_MISTAKES,
                 quiet=quiet, explain=explain_trace, tags=ALLOCATOR_TAGS)
