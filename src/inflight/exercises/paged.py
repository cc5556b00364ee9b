"""Graders for the paged KV cache chapter: blocks needed for n tokens, the slot mapping, and a
block allocator's `allocate` / `free`.

The allocator grader replays scripts of allocate / free / share / double-free operations and
records what an outside observer can check — how many blocks came back, whether any of them is
already held by someone else, what was raised, how many blocks are free afterwards — so any free
list order (FIFO, stack, ...) is accepted. The classic wrong allocators, as code, are in `paged_allocators`.
"""
from __future__ import annotations

import random
from collections import Counter
from typing import Any, Callable, Sequence

from inflight.engine.block_manager import NoFreeBlocksError, blocks_needed, slot_mapping
from inflight.exercises.grading import Case, GradeResult, Mistake, grade
from inflight.exercises.paged_allocators import ALLOCATOR_MISTAKES, ReferenceAllocator, StarterAllocator

__all__ = ["check_blocks_needed", "check_slot_mapping", "check_allocator", "StarterAllocator"]


# --- blocks needed -----------------------------------------------------------------------------------
def _blocks_cases() -> list[Case]:
    pairs = [(0, 16), (1, 16), (15, 16), (16, 16), (17, 16), (32, 16), (33, 16), (1, 1), (5, 1), (7, 8),
             (8, 8), (9, 8), (100, 32), (128, 32), (129, 32), (4096, 16)]
    rng = random.Random("blocks-needed")
    pairs += [(rng.randint(0, 5000), rng.choice([1, 2, 8, 16, 32, 64, 128])) for _ in range(40)]
    return [Case(f"blocks_needed({n}, {bs})", lambda f, n=n, bs=bs: int(f(n, bs)),
                 f"num_tokens={n}, block_size={bs}") for n, bs in pairs]


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
]


def check_blocks_needed(fn: Callable[[int, int], int], *, quiet: bool = False) -> GradeResult:
    """Grade `fn(num_tokens, block_size) -> int`: how many blocks hold `num_tokens` tokens."""
    return grade("blocks_needed", fn, blocks_needed, _blocks_cases(), BLOCKS_NEEDED_MISTAKES, quiet=quiet)


# --- slot mapping ------------------------------------------------------------------------------------
def _slot_cases() -> list[Case]:
    specs = [
        ("the chapter's example", [7, 2, 5], [0, 3, 4, 9, 11], 4),
        ("a whole prompt", [3, 0, 6], list(range(10)), 4),
        ("one decode token at the start of a new block", [9, 4], [16], 16),
        ("one decode token mid-block", [9, 4], [21], 16),
        ("block size 1", [5, 3, 8, 1], [0, 1, 2, 3], 1),
        ("identity block table", [0, 1, 2], list(range(0, 48, 5)), 16),
    ]
    rng = random.Random("slot-mapping")
    for k in range(12):
        bs = rng.choice([2, 4, 8, 16, 32])
        nblocks = rng.randint(1, 6)
        table = rng.sample(range(64), nblocks)
        n = rng.randint(1, nblocks * bs)
        start = rng.randint(0, n - 1)
        specs.append((f"random scrambled table #{k}", table, list(range(start, n)), bs))
    return [Case(name, lambda f, t=t, p=p, bs=bs: [int(x) for x in f(list(t), list(p), bs)],
                 f"block_table={t}, positions={p if len(p) <= 12 else str(p[:12])[:-1] + ', ...]'}, block_size={bs}")
            for name, t, p, bs in specs]


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
]


def check_slot_mapping(fn: Callable[[list, list, int], list], *, quiet: bool = False) -> GradeResult:
    """Grade `fn(block_table, positions, block_size) -> list[int]`: the cache slot of each position."""
    return grade("slot_mapping", fn, slot_mapping, _slot_cases(), SLOT_MAPPING_MISTAKES, quiet=quiet)


# --- the allocator -----------------------------------------------------------------------------------
# A script is a list of ops on an allocator built as cls(num_blocks, block_size):
#   ("alloc", n)          allocate n blocks -> handle h<k> (k counts allocate calls, failed ones too)
#   ("free", h)           free handle h's blocks (one reference each)
#   ("share", h)          incref handle h's blocks (now it must be freed twice)
#   ("refree", h)         free handle h again right after its last free: a double free
#   ("free_ids", [ids])   free raw ids (unknown ones)
#   ("free_bad", h)       free handle h's blocks plus one unknown id: raises, and frees nothing
Script = Sequence[tuple]


class _Replay:
    """A script replayed on a learner's allocator beside the counts a correct allocator would keep."""

    def __init__(self, cls: Any, num_blocks: int):
        self.alloc = cls(num_blocks, 16)
        self.num_blocks = num_blocks
        self.held: Counter = Counter()  # block -> holders, as a correct allocator would count them
        self.handles: dict[int, list] = {}  # handle -> [blocks, references]
        self.last_freed: dict[int, list] = {}
        self.n_handles = 0

    def predict(self, op: tuple) -> tuple:
        """The outcome and num_free a correct allocator gives for `op`."""
        kind, free_now = op[0], self.num_blocks - sum(1 for v in self.held.values() if v > 0)
        if kind == "alloc":
            if op[1] > self.num_blocks:
                return ("raised", "ValueError", free_now)
            if op[1] > free_now:
                return ("raised", "NoFreeBlocksError", free_now)
            return ("ok", free_now - op[1])
        if kind == "free" and op[1] in self.handles:
            blocks = self.handles[op[1]][0]
            return ("ok", free_now + sum(1 for b in set(blocks) if self.held[b] == 1))
        if kind == "share":
            return ("ok", free_now)
        return ("raised", "ValueError", free_now)  # a double free or unknown ids

    def _allocate(self, n: int, handle: int) -> tuple:
        blocks = [int(b) for b in self.alloc.allocate(n)]
        problems = []
        if len(blocks) != n:
            problems.append(f"asked for {n} blocks, got {len(blocks)}")
        if len(set(blocks)) != len(blocks):
            problems.append("the same block twice in one allocation")
        if any(not 0 <= b < self.num_blocks for b in blocks):
            problems.append("a block id outside 0..num_blocks-1")
        if any(self.held[b] > 0 for b in set(blocks)):
            problems.append("handed out a block that is still in use")
        self.held.update(set(blocks))
        self.handles[handle] = [blocks, 1]
        return ("ok", *problems)

    def apply(self, op: tuple) -> tuple:
        """Run `op` on the learner's allocator: ("ok", problems...) or ("raised", exception name)."""
        kind = op[0]
        if kind == "alloc":  # every allocate() call gets a handle number, failed ones too
            handle, self.n_handles = self.n_handles, self.n_handles + 1
        try:
            if kind == "alloc":
                return self._allocate(op[1], handle)
            if kind == "free":
                blocks, refs = self.handles[op[1]]
                self.alloc.free(list(blocks))
                self.held.subtract(set(blocks))
                self.handles[op[1]][1] -= 1
                if refs == 1:
                    self.last_freed[op[1]] = self.handles.pop(op[1])[0]
            elif kind == "share":
                blocks = self.handles[op[1]][0]
                self.alloc.incref(list(blocks))
                self.held.update(set(blocks))
                self.handles[op[1]][1] += 1
            elif kind == "refree":
                self.alloc.free(list(self.last_freed[op[1]]))
            elif kind == "free_ids":
                self.alloc.free(list(op[1]))
            elif kind == "free_bad":
                self.alloc.free(list(self.handles[op[1]][0]) + [self.num_blocks])
            else:  # pragma: no cover - a bug in a script
                raise AssertionError(f"unknown op {op!r}")
            return ("ok",)
        except NotImplementedError:
            raise  # the learner has not written it yet: the grader says so
        except (ValueError, NoFreeBlocksError, IndexError, KeyError, TypeError, AssertionError, RuntimeError) as exc:
            return ("raised", type(exc).__name__)


def _run_allocator(cls: Any, num_blocks: int, script: Script) -> list:
    """Replay `script`; the trace stops at the first operation whose outcome a correct allocator
    would not give, so the report points at it (and any free-list order gives the same trace)."""
    replay = _Replay(cls, num_blocks)
    trace: list = []
    for op in script:
        predicted = replay.predict(op)
        outcome = replay.apply(op)
        num_free = replay.alloc.num_free
        trace.append((_show(op), *outcome, f"num_free={num_free}"))
        if (*outcome, num_free) != predicted:
            break
    return trace


def _show(op: tuple) -> str:
    if op[0] == "alloc":
        return f"allocate({op[1]})"
    if op[0] == "free_ids":
        return f"free({list(op[1])})"
    return {"free": "free(h{})", "share": "incref(h{})", "refree": "free(h{}) again",
            "free_bad": "free(h{} + [an id outside the pool])"}[op[0]].format(op[1])


def _describe_script(num_blocks: int, script: Script) -> str:
    return f"Allocator({num_blocks} blocks); " + "; ".join(
        f"h{i}=" + _show(op) if op[0] == "alloc" else _show(op)
        for i, op in _number_handles(script))


def _number_handles(script: Script):
    h = 0
    for op in script:
        if op[0] == "alloc":
            yield h, op
            h += 1
        else:
            yield None, op


def _random_script(rng: random.Random, num_blocks: int, length: int) -> list[tuple]:
    script: list[tuple] = []
    live: dict[int, int] = {}  # handle -> references, as the reference allocator would see it
    free_blocks, sizes, n_handles = num_blocks, {}, 0
    for _ in range(length):
        r = rng.random()
        if r < 0.45 or not live:
            n = rng.choice([0, 1, 1, 2, 3, 5, rng.randint(1, num_blocks + 2)])
            script.append(("alloc", n))
            if n <= free_blocks:
                live[n_handles], sizes[n_handles] = 1, n
                free_blocks -= n
            n_handles += 1  # handles number allocate() calls, failed ones included
        elif r < 0.8:
            h = rng.choice(sorted(live))
            script.append(("free", h))
            live[h] -= 1
            if not live[h]:
                del live[h]
                free_blocks += sizes[h]
                if rng.random() < 0.3:
                    script.append(("refree", h))
        elif r < 0.92:
            h = rng.choice(sorted(live))
            script.append(("share", h))
            live[h] += 1
        else:
            script.append(("free_ids", [rng.choice([num_blocks, num_blocks + 3, -1])]))
    return script


def _allocator_cases() -> list[Case]:
    specs: list[tuple[str, int, list[tuple]]] = [
        ("allocate then free everything", 8, [("alloc", 3), ("alloc", 5), ("free", 0), ("free", 1)]),
        ("freed blocks are handed out again", 4, [("alloc", 4), ("free", 0), ("alloc", 4), ("free", 1), ("alloc", 2)]),
        ("allocating 0 blocks", 4, [("alloc", 0), ("alloc", 4)]),
        ("more than the pool has", 4, [("alloc", 5)]),
        ("more than is free right now", 6, [("alloc", 4), ("alloc", 3), ("alloc", 2)]),
        ("a failed allocation takes nothing", 6, [("alloc", 4), ("alloc", 3), ("alloc", 2), ("free", 2), ("alloc", 6)]),
        ("double free", 6, [("alloc", 2), ("alloc", 2), ("free", 0), ("refree", 0), ("alloc", 4)]),
        ("freeing a block that does not exist", 6, [("alloc", 2), ("free_ids", [6]), ("free_ids", [-1]), ("alloc", 4)]),
        ("a free() that raises frees nothing", 4, [("alloc", 2), ("free_bad", 0), ("free", 0), ("alloc", 4)]),
        ("a shared block stays in use until its last holder frees it", 4,
         [("alloc", 2), ("share", 0), ("free", 0), ("alloc", 2), ("alloc", 1), ("free", 0), ("alloc", 2)]),
        ("no block is handed out twice", 10, [("alloc", 3), ("alloc", 3), ("alloc", 3), ("free", 1), ("alloc", 4), ("alloc", 1)]),
    ]
    rng = random.Random("allocator")
    for k in range(12):
        nb = rng.choice([4, 8, 12])
        specs.append((f"random interleaving #{k}", nb, _random_script(rng, nb, rng.randint(8, 20))))
    return [Case(name, lambda cls, nb=nb, s=tuple(script): _run_allocator(cls, nb, s), _describe_script(nb, script))
            for name, nb, script in specs]


def check_allocator(cls: type, *, quiet: bool = False) -> GradeResult:
    """Grade an allocator class built as `cls(num_blocks, block_size)` with `allocate`, `free`,
    `incref` and `num_free`: replays scripted and random operation sequences."""
    if not isinstance(cls, type):
        raise TypeError(f"pass the allocator CLASS (e.g. MyBlockAllocator), not {type(cls).__name__}")
    return grade("BlockAllocator.allocate/free", cls, ReferenceAllocator, _allocator_cases(), ALLOCATOR_MISTAKES, quiet=quiet)
