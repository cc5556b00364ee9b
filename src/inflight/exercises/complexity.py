"""Measuring a stated cost without a clock: operation counts over a size sweep.

Where an exercise says "O(blocks touched): never scan the pool", the grader runs the same
operations on a small pool and on a pool 64 times bigger and counts the work the learner's code
did: every Python line and opcode it ran (through the grader's tracer) and every element its
containers handed out (the lists, deques, dicts and sets on the object are swapped for counting
subclasses, so `sorted(self.free_list)`, `min(...)`, `x in self.free_list`, `.index()`, `.remove()`
and `for b in range(self.num_blocks)` all count, even though they run in C). Code that touches only
the blocks involved does the same work on both pools; code that scans does ~64 times more. The
margin is generous (2x + 100) and nothing depends on timing, so the check cannot flake.
"""
from __future__ import annotations

from collections import Counter, deque
from typing import Any, Callable, Iterable

__all__ = ["Meter", "instrument", "scan_report"]


class Meter:
    """Counts of container elements handed to the learner's code, by (method, attribute, access)."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.method = "?"
        self.steps = [0]  # Python lines/opcodes run in the learner's frames (filled by the tracer)

    def tick(self, attr: str, how: str, n: int = 1) -> None:
        self.counts[(self.method, attr, how)] += n

    def total(self) -> int:
        return sum(self.counts.values()) + self.steps[0]


class _Counting:
    """Mixin: the container knows its meter and the attribute it is stored in."""

    _meter: Meter
    _attr: str

    def _bind(self, meter: Meter, attr: str):
        self._meter, self._attr = meter, attr
        return self

    def _tick(self, how: str, n: int = 1) -> None:
        meter = getattr(self, "_meter", None)
        if meter is not None:
            meter.tick(self._attr, how, n)


def _iterating(base: type):
    def __iter__(self):
        for x in base.__iter__(self):
            self._tick("iterated over")
            yield x
    return __iter__


class CountingList(_Counting, list):
    __iter__ = _iterating(list)

    def __reversed__(self):
        for x in list.__reversed__(self):
            self._tick("iterated over")
            yield x

    def __contains__(self, x):
        self._tick("searched with `in`", len(self))
        return list.__contains__(self, x)

    def __getitem__(self, i):
        self._tick("indexed", len(range(*i.indices(len(self)))) if isinstance(i, slice) else 1)
        return list.__getitem__(self, i)

    def index(self, *a):
        self._tick("searched with .index()", len(self))
        return list.index(self, *a)

    def count(self, x):
        self._tick("searched with .count()", len(self))
        return list.count(self, x)

    def remove(self, x):
        self._tick("searched with .remove()", len(self))
        return list.remove(self, x)

    def sort(self, *a, **k):
        self._tick("sorted", len(self))
        return list.sort(self, *a, **k)

    def copy(self):
        self._tick("copied", len(self))
        return list.copy(self)

    def pop(self, *a):
        self._tick("shifted by .pop(i)", len(self) - (a[0] % max(len(self), 1)) if a else 1)
        return list.pop(self, *a)

    def insert(self, i, x):
        self._tick("shifted by .insert(i)", max(len(self) - i, 1) if i >= 0 else 1)
        return list.insert(self, i, x)


class CountingDeque(_Counting, deque):
    __iter__ = _iterating(deque)

    def __reversed__(self):
        for x in deque.__reversed__(self):
            self._tick("iterated over")
            yield x

    def __contains__(self, x):
        self._tick("searched with `in`", len(self))
        return deque.__contains__(self, x)

    def index(self, *a):
        self._tick("searched with .index()", len(self))
        return deque.index(self, *a)

    def count(self, x):
        self._tick("searched with .count()", len(self))
        return deque.count(self, x)

    def remove(self, x):
        self._tick("searched with .remove()", len(self))
        return deque.remove(self, x)

    def copy(self):
        self._tick("copied", len(self))
        return deque.copy(self)

    def rotate(self, n=1):
        self._tick("rotated", abs(n))
        return deque.rotate(self, n)


class CountingSet(_Counting, set):
    __iter__ = _iterating(set)

    def copy(self):
        self._tick("copied", len(self))
        return set.copy(self)


class CountingDict(_Counting, dict):
    __iter__ = _iterating(dict)

    def keys(self):
        self._tick("iterated over", len(self))
        return dict.keys(self)

    def values(self):
        self._tick("iterated over", len(self))
        return dict.values(self)

    def items(self):
        self._tick("iterated over", len(self))
        return dict.items(self)

    def copy(self):
        self._tick("copied", len(self))
        return dict.copy(self)


_COUNTING = {list: CountingList, deque: CountingDeque, set: CountingSet, dict: CountingDict}


def instrument(obj: Any, meter: Meter) -> None:
    """Swap the plain lists, deques, sets and dicts in `obj`'s attributes for counting copies (and
    rebind counting ones already there). Called before every measured operation, because the
    learner's code may have replaced an attribute with a fresh plain container."""
    state = getattr(obj, "__dict__", None)
    if state is None:
        return
    for name, value in list(state.items()):
        if isinstance(value, _Counting):
            value._bind(meter, f"self.{name}")
            continue
        cls = _COUNTING.get(type(value))
        if cls is None:
            continue
        copy = cls(value, value.maxlen) if cls is CountingDeque else cls(value)
        state[name] = copy._bind(meter, f"self.{name}")


def measure(make: Callable[[], Any], ops: Iterable[tuple[str, Callable[[Any], Any]]],
            run: Callable[..., Any]) -> Meter:
    """Build an object with `make()`, then run each `(method, op)` on it, counting its work.
    `run(op, obj, steps=...)` calls op(obj) under the grader's tracer, which counts into `steps`;
    exceptions from an op are part of the behaviour (checked elsewhere), not of the cost."""
    meter = Meter()
    obj = make()
    for method, op in ops:
        instrument(obj, meter)
        meter.method = method
        try:
            run(op, obj, steps=meter.steps)
        except Exception:
            pass
    return meter


def scan_report(small: Meter, big: Meter, n_small: int, n_big: int) -> str | None:
    """None when the work did not grow with the pool (within 2x + 100); otherwise what grew, in words."""
    if big.total() <= 2 * small.total() + 100:
        return None
    grown = Counter(big.counts)
    grown.subtract(small.counts)
    parts = [f"{method}() {how} {attr} ({n_big_count:,} element(s) on the big pool, "
             f"{small.counts.get((method, attr, how), 0):,} on the small one)"
             for (method, attr, how), _ in grown.most_common(2) if _ > 0
             for n_big_count in [big.counts[(method, attr, how)]]]
    steps = big.steps[0] - small.steps[0]
    if steps > 100 and (not parts or steps > sum(v for v in grown.values() if v > 0)):
        parts.append(f"your code ran {big.steps[0]:,} Python steps on the pool of {n_big:,} blocks against "
                     f"{small.steps[0]:,} on the pool of {n_small} for the same operations (a loop over the "
                     "pool, e.g. `for b in range(self.num_blocks)`)")
    return "; ".join(parts) or f"the work grew from {small.total():,} to {big.total():,} counted steps"
