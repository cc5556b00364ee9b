"""The cases of chapter 5's allocator exercise: scripts of allocate / free / incref replayed on the
learner's class, the cost check, and the diagnosis of the first operation that went wrong.

A script is a list of ops on an allocator built as `cls(num_blocks, 16)`:

    ("alloc", n)          allocate n blocks -> handle h<k> (k counts allocate calls, failed ones too)
    ("free", h)           free handle h's blocks (one reference each)
    ("share", h)          incref handle h's blocks (now it must be freed twice)
    ("refree", h)         free handle h's blocks again right after its last free: a double free
    ("free_ids", [ids])   free raw ids (outside the pool, or known to be held once / free)
    ("free_bad", h)       free handle h's blocks plus one id outside the pool: raises, frees nothing
    ("free_dup", h)       free handle h's blocks with its first block listed twice (held once: a double free)
    ("free_twice", h)     free handle h's blocks listed twice, h shared twice: legal, frees them

The replay records what an outside observer can check — how many blocks came back, whether any is
already held by someone else, what was raised, how many blocks are free afterwards — so any free
list order (FIFO, stack, a set, ...) is accepted, and it stops at the first operation whose outcome
a correct allocator would not give, so the report points at it.
"""
from __future__ import annotations

import random
from collections import Counter
from typing import Any, Sequence

from inflight.exercises import complexity
from inflight.exercises.answers import Flaw, as_int_list
from inflight.exercises.diagnosis import Diagnosis
from inflight.exercises.grading import Case, call_with_time_limit

__all__ = ["allocator_cases", "explain_trace", "cost_case"]

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

    def ids(self, op: tuple) -> list[int]:
        """The ids a free-like op passes to free()."""
        kind = op[0]
        if kind == "free_ids":
            return list(op[1])
        if kind == "refree":
            return list(self.last_freed[op[1]])
        blocks = list(self.handles[op[1]][0])
        return {"free": blocks, "free_bad": blocks + [self.num_blocks], "free_dup": blocks + blocks[:1],
                "free_twice": blocks + blocks}[kind]

    def predict(self, op: tuple) -> tuple:
        """The outcome and num_free a correct allocator gives for `op`."""
        kind, free_now = op[0], self.num_blocks - sum(1 for v in self.held.values() if v > 0)
        if kind == "alloc":
            if op[1] > self.num_blocks:
                return ("raised", "ValueError", free_now)
            if op[1] > free_now:
                return ("raised", "NoFreeBlocksError", free_now)
            return ("ok", free_now - op[1])
        if kind == "share":
            return ("ok", free_now)
        counts = Counter(self.ids(op))
        if any(not 0 <= b < self.num_blocks or self.held[b] < k for b, k in counts.items()):
            return ("raised", "ValueError", free_now)  # an unknown id, or a double free
        return ("ok", free_now + sum(1 for b, k in counts.items() if self.held[b] == k))

    def _allocate(self, n: int, handle: int) -> tuple:
        blocks = as_int_list(self.alloc.allocate(n), f"allocate({n})", "it returns the list of the block ids it "
                             "hands out (the caller appends them to a block table)", accept="list")
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

    def _free(self, op: tuple) -> None:
        ids = self.ids(op)
        given = list(ids)
        self.alloc.free(given)
        if given != ids:
            raise Flaw("changed its input", f"free({ids}) left its argument as {given}",
                       "your free() changed the list it was given (sorted it, popped from it, ...): that list is "
                       "the caller's block table. Read it; don't modify it.")
        kind = op[0]
        if kind == "free_ids":
            self.held.subtract(Counter(ids))
            for blocks, _ in self.handles.values():
                blocks[:] = [b for b in blocks if b not in ids]
            return
        self.held.subtract(Counter(ids))
        if kind in ("free", "free_twice"):
            self.handles[op[1]][1] -= 1 if kind == "free" else 2
            if self.handles[op[1]][1] == 0:
                self.last_freed[op[1]] = self.handles.pop(op[1])[0]

    def apply(self, op: tuple) -> tuple:
        """Run `op` on the learner's allocator: ("ok", problems...) or ("raised", exception name)."""
        kind = op[0]
        if kind == "alloc":  # every allocate() call gets a handle number, failed ones too
            handle, self.n_handles = self.n_handles, self.n_handles + 1
        try:
            if kind == "alloc":
                return self._allocate(op[1], handle)
            if kind == "share":
                blocks = self.handles[op[1]][0]
                self.alloc.incref(list(blocks))
                self.held.update(set(blocks))
                self.handles[op[1]][1] += 1
            else:
                self._free(op)
            return ("ok",)
        except (NotImplementedError, Flaw):
            raise  # not written yet (the grader says so), or a finding that is the diagnosis
        except Exception as exc:
            return ("raised", type(exc).__name__)


def _run(cls: Any, num_blocks: int, script: Script) -> list:
    replay = _Replay(cls, num_blocks)
    trace: list = []
    for op in script:
        predicted = replay.predict(op)
        outcome = replay.apply(op)
        num_free = replay.alloc.num_free
        trace.append((_show(op, replay), *outcome, f"num_free={num_free}"))
        if (*outcome, num_free) != predicted:
            break
    return trace


def _show(op: tuple, replay: _Replay | None = None) -> str:
    if op[0] == "alloc":
        return f"allocate({op[1]})"
    if op[0] == "free_ids":
        return f"free({list(op[1])})"
    return {"free": "free(h{})", "share": "incref(h{})", "refree": "free(h{}) again",
            "free_bad": "free(h{} + [an id outside the pool])", "free_dup": "free(h{} with its first block twice)",
            "free_twice": "free(h{} + h{}) (h{} is held twice)"}[op[0]].format(op[1], op[1], op[1])


def _describe(num_blocks: int, script: Script) -> str:
    parts, h = [], 0
    for op in script:
        if op[0] == "alloc":
            parts.append(f"h{h}=" + _show(op))
            h += 1
        else:
            parts.append(_show(op))
    return f"Allocator({num_blocks} blocks); " + "; ".join(parts)


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


_TAGGED = {  # op kind -> tag of the cases that use it (see TAGS)
    "share": "shared", "free_dup": "duplicate ids", "free_twice": "duplicate ids", "free_bad": "bad id",
    "free_ids": "raw ids", "refree": "double free",
}


def _tags(num_blocks: int, script: Script) -> frozenset:
    tags = {_TAGGED[op[0]] for op in script if op[0] in _TAGGED}
    if any(op[0] == "alloc" and op[1] > num_blocks for op in script):
        tags.add("over the pool")
    return frozenset(tags)


def allocator_cases() -> list[Case]:
    specs: list[tuple[str, int, list[tuple]]] = [
        ("allocate then free everything", 8, [("alloc", 3), ("alloc", 5), ("free", 0), ("free", 1)]),
        ("freed blocks are handed out again", 4, [("alloc", 4), ("free", 0), ("alloc", 4), ("free", 1), ("alloc", 2)]),
        ("allocating 0 blocks", 4, [("alloc", 0), ("alloc", 4)]),
        ("more than the pool has", 4, [("alloc", 5)]),
        ("exactly the whole pool, then exactly what is free", 6, [("alloc", 6), ("free", 0), ("alloc", 2), ("alloc", 4)]),
        ("more than is free right now", 6, [("alloc", 4), ("alloc", 3), ("alloc", 2)]),
        ("a failed allocation takes nothing", 6, [("alloc", 4), ("alloc", 3), ("alloc", 2), ("free", 2), ("alloc", 6)]),
        ("double free", 6, [("alloc", 2), ("alloc", 2), ("free", 0), ("refree", 0), ("alloc", 4)]),
        ("a block freed twice in one call", 6, [("alloc", 2), ("free_dup", 0), ("free", 0), ("alloc", 6)]),
        ("a block held twice, freed twice in one call", 6,
         [("alloc", 3), ("share", 0), ("free_twice", 0), ("alloc", 6)]),
        ("freeing a block that does not exist", 6, [("alloc", 2), ("free_ids", [6]), ("free_ids", [-1]), ("alloc", 4)]),
        ("ids at both ends of the pool", 8, [("alloc", 8), ("free_ids", [0, 7]), ("alloc", 2), ("free_ids", [7]),
                                              ("free_ids", [7]), ("free_ids", [0])]),
        ("a free() that raises frees nothing", 4, [("alloc", 2), ("free_bad", 0), ("free", 0), ("alloc", 4)]),
        ("a shared block stays in use until its last holder frees it", 4,
         [("alloc", 2), ("share", 0), ("free", 0), ("alloc", 2), ("alloc", 1), ("free", 0), ("alloc", 2)]),
        ("no block is handed out twice", 10, [("alloc", 3), ("alloc", 3), ("alloc", 3), ("free", 1), ("alloc", 4), ("alloc", 1)]),
    ]
    rng = random.Random("allocator")
    for k in range(12):
        nb = rng.choice([4, 8, 12])
        specs.append((f"random interleaving #{k}", nb, _random_script(rng, nb, rng.randint(8, 20))))
    cases = [Case(name, lambda cls, nb=nb, s=tuple(script): _run(cls, nb, s), _describe(nb, script),
                  tags=_tags(nb, script), unit="operation", depth=1, data=(nb, tuple(script)))
             for name, nb, script in specs]
    return cases + [cost_case()]


TAGS = {
    "shared": ("a block is shared (incref) before it is freed",
               "a shared block goes back on the free list only when its LAST holder frees it: decrement, and append "
               "only when the count reaches 0."),
    "duplicate ids": ("one free() call lists the same block twice",
                      "each occurrence drops one reference: count the ids (`collections.Counter`) and compare each "
                      "count with the block's reference count before changing anything."),
    "bad id": ("a free() call mixes good ids with one outside the pool",
               "check every id first, then change anything: a call that raises frees nothing."),
    "over the pool": ("allocate() asks for more blocks than the pool has",
                      "n > num_blocks can never fit: raise ValueError (not NoFreeBlocksError) before taking anything."),
}


# --- the cost: O(blocks touched), never a scan of the pool ---------------------------------------
_SMALL, _BIG = 64, 1024


def _ops() -> list[tuple[str, Any]]:
    h: dict[int, Any] = {}

    def alloc(k: int, n: int):
        return lambda a: h.__setitem__(k, a.allocate(n))

    def free(*ks: int):
        return lambda a: a.free([b for k in ks for b in h[k]])

    once = [("allocate", alloc(0, 3)), ("allocate", alloc(1, 5)), ("free", free(0)), ("allocate", alloc(2, 4)),
            ("free", free(1)), ("free", free(1)), ("allocate", alloc(3, 2)), ("free", free(2, 3))]
    return once * 3


def _cost(cls: Any) -> str:
    def run(op, obj, steps):
        return call_with_time_limit(op, obj, steps=steps)

    small = complexity.measure(lambda: cls(_SMALL, 16), _ops(), run)
    big = complexity.measure(lambda: cls(_BIG, 16), _ops(), run)
    grew = complexity.scan_report(small, big, _SMALL, _BIG)
    if grew:
        raise Flaw("the pool is scanned", f"for the same operations, on {_BIG:,} blocks instead of {_SMALL}: {grew}",
                   f"the text asks for O(blocks touched): the work of allocate() and free() must not grow with the "
                   f"pool. Here it did — {grew}. Take blocks with popleft() (no sorting, no min(), no search of the "
                   "free list), and detect a double free from ref_counts, not with `b in self.free_list`.")
    return f"allocate() and free() did the same work on pools of {_SMALL} and {_BIG:,} blocks"


def cost_case() -> Case:
    return Case("allocate and free cost O(blocks touched)", _cost,
                f"the same 24 allocate/free calls on a pool of {_SMALL} blocks and one of {_BIG:,}, work counted")


# --- the diagnosis of the first operation that went wrong ------------------------------------------
def _clause(op: tuple, want: tuple, got: tuple, num_blocks: int, earlier: list) -> str:
    """Which rule of the text the operation `op` broke, from the outcome wanted and the one given."""
    kind, shown = op[0], got[0]
    want_raised = want[1] == "raised"
    got_raised = got[1] == "raised"
    if want_raised and not got_raised:
        if kind == "alloc":
            why = ("n > num_blocks can never fit: raise ValueError" if want[2] == "ValueError"
                   else "n is more than is free right now: raise NoFreeBlocksError (it may fit later)")
        elif kind == "free_dup":
            why = ("a block listed twice in one free() but held once is a double free: raise ValueError — count the "
                   "occurrences of each id before changing anything")
        elif kind == "free_bad" or (kind == "free_ids" and any(not 0 <= b < num_blocks for b in op[1])):
            why = "an id outside 0..num_blocks-1 must raise ValueError (and ref_counts[-1] is silently the last block)"
        else:
            why = "a block whose reference count is already 0 is a double free: raise ValueError"
        return f"{shown} should raise {want[2]}, yours returned: {why}."
    if got_raised and not want_raised:
        why = {"alloc": "this allocation fits: n <= num_free (asking for exactly the free blocks, or 0, is allowed)",
               "free_twice": "the block is held twice, so listing it twice in one call drops both references",
               "share": "incref of blocks in use is allowed"}.get(kind, "every id is held, so this free is allowed")
        failed = [(j, e[0]) for j, e in enumerate(earlier) if e[1] == "raised"]
        if failed and kind != "alloc":
            j, text = failed[-1]
            why += (f" — unless an earlier call changed something although it raised: operation {j}, {text}, raised "
                    "as it should, and a call that raises must change nothing (check every id first)")
        return f"{shown} should succeed, yours raised {got[2]}: {why}."
    if want_raised and got_raised:
        return (f"{shown} should raise {want[2]}, yours raised {got[2]}: the text names the exception for each case "
                "(ValueError: never fits / unknown id / double free; NoFreeBlocksError: not enough free now).")
    problems = [p for p in got[2:-1]]
    if problems:
        return f"{shown} {problems[0]}: allocate() takes n distinct free blocks OFF the free list (popleft)."
    w, g = want[-1], got[-1]
    if kind in ("alloc", "share"):
        return f"after {shown}, {g} (expected {w}): a call's blocks leave the free list, and nothing else changes."
    return (f"after {shown}, {g} (expected {w}): free() drops ONE reference per id listed, and a block goes back on "
            "the free list exactly when its count reaches 0 — no sooner (it may be shared), no later, and once.")


def explain_trace(candidate: Any, failures: list) -> Diagnosis | None:
    """The allocator grader's `explain`: the first operation that went wrong and the rule it broke."""
    for case, expected, got in failures:
        if case.data is None or not isinstance(got, list) or not got:
            continue
        i = len(got) - 1
        if i >= len(expected) or got[i] == expected[i]:
            continue
        num_blocks, script = case.data
        return Diagnosis(f"operation {i} breaks a rule", _clause(script[i], expected[i], got[i], num_blocks, expected[:i]), case)
    return None
