"""The token-count schedulers of Part I: static batching and continuous batching.

A request is an id and a number of tokens to generate. One call to `step()` is one generation step
of the whole system: every active request gets exactly one token. The two schedulers differ only
in *when* they admit waiting requests into the batch.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from numbers import Number, Real
from typing import Any, Hashable, Mapping

from inflight.checks import integer, number, priority as check_priority, show
from inflight.engine.priority import check_aging, priority_key


@dataclass
class _Entry:
    request_id: Hashable
    remaining: int
    memory_cost: Real


class _SchedulerBase:
    """Waiting queue, active batch and the checks on `add_request` shared by both schedulers."""

    def __init__(self, max_batch_size: int):
        self.max_batch_size = integer("max_batch_size", max_batch_size, minimum=1)
        self._waiting: deque[_Entry] = deque()
        self._active: dict[Hashable, _Entry] = {}  # insertion order = admission order
        self._unfinished: set = set()  # ids waiting or running, for the duplicate check

    def add_request(self, request_id: Hashable, num_tokens: int, memory_cost: Real = 1) -> None:
        """Queue a request that needs `num_tokens` generation steps and holds `memory_cost` while active.

        Ids must be hashable and unique among unfinished requests (a finished id may be reused).
        """
        self._check_id(request_id)
        num_tokens = integer("num_tokens", num_tokens, minimum=1)
        memory_cost = number("memory_cost", memory_cost, above=0)
        if request_id in self._unfinished:
            raise ValueError(f"duplicate request id {show(request_id)}: it is already waiting or running")
        self._unfinished.add(request_id)
        self._waiting.append(_Entry(request_id, num_tokens, memory_cost))

    def _check_id(self, request_id: Hashable) -> None:
        """Ids are hashable and, since `step()` returns them sorted, of one kind: all numbers or all
        strings (or all of one other type) — checked here, not when a later step fails to sort them."""
        try:
            hash(request_id)
        except TypeError:
            raise TypeError(f"request_id must be hashable, got {type(request_id).__name__}") from None
        if isinstance(request_id, Number) and request_id != request_id:  # (numpy's and Decimal's NaN too)
            raise ValueError("request_id NaN cannot be sorted (it is neither smaller nor larger than any id)")
        if not self._unfinished:
            return
        other = next(iter(self._unfinished))
        kind = _id_kind(request_id)
        if _id_kind(other) is not kind:
            raise TypeError(f"request_id {show(request_id)} ({type(request_id).__name__}) cannot be sorted with the "
                            f"other ids ({show(other)} is a {type(other).__name__}): use ids of one type")
        # numbers sort with numbers and strings with strings; any other kind (tuples, say) is sorted
        # with every unfinished id, since (1, 7) sorts with (3, 'y') but not with (1, 'x')
        others = [other] if kind in (Real, str, bytes) else list(self._unfinished)
        try:
            sorted(others + [request_id])
        except (TypeError, ArithmeticError) as exc:
            raise TypeError(f"request_id {show(request_id)} cannot be sorted with the other ids (e.g. "
                            f"{show(other)}): use ids that compare with each other ({exc})") from None

    # --- read-only views, for chapters and tests -------------------------------------------------
    @property
    def active(self) -> dict:
        """{request_id: tokens still to generate} of the running batch, in admission order (a copy)."""
        return {rid: e.remaining for rid, e in self._active.items()}

    @property
    def waiting(self) -> list:
        """Ids of the queued requests, front of the queue first (a copy)."""
        return [e.request_id for e in self._waiting]

    @property
    def active_memory(self) -> Real:
        """Total `memory_cost` of the running batch."""
        return sum(e.memory_cost for e in self._active.values())

    def has_unfinished(self) -> bool:
        """True while any request is waiting or running."""
        return bool(self._waiting or self._active)

    # --- the step ---------------------------------------------------------------------------------
    def _admit(self) -> None:
        raise NotImplementedError

    def step(self) -> list:
        """One generation step: admit, give every active request one token, retire finished ones.

        Returns the sorted ids processed in this step (finished ones included).
        """
        self._admit()  # before processing: a request admitted now gets its first token now
        processed = sorted(self._active)
        for rid in processed:
            entry = self._active[rid]
            entry.remaining -= 1
            if entry.remaining == 0:
                del self._active[rid]
                self._unfinished.discard(rid)  # its slot (and memory) is free from the NEXT step on
        return processed

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(max_batch_size={self.max_batch_size}, "
                f"active={self.active}, waiting={self.waiting})")


class ContinuousBatchScheduler(_SchedulerBase):
    """Continuous (iteration-level) batching: a free slot is refilled at the very next step.

    With `max_memory` set, admission also needs the running batch's total `memory_cost` to stay
    within it. Admission is strict FIFO: if the request at the front of the queue doesn't fit,
    nobody behind it is admitted this step, even a smaller request that would fit.

    A request whose own `memory_cost` exceeds `max_memory` is accepted by `add_request` (as the
    spec says) but can never be admitted: once it reaches the front of the queue it blocks every
    request behind it forever (head-of-line deadlock). `step()` then simply returns `[]`; nothing
    crashes. A real server would reject such a request at submission time.
    With the defaults (`max_memory=None`, `memory_cost=1`) the behaviour is exactly slot-only.
    """

    def __init__(self, max_batch_size: int, max_memory: Real | None = None):
        super().__init__(max_batch_size)
        if max_memory is not None:
            max_memory = number("max_memory", max_memory, above=0)
        self.max_memory = max_memory

    def _fits(self, entry: _Entry, used: Real) -> bool:
        return self.max_memory is None or used + entry.memory_cost <= self.max_memory

    def _admit(self) -> None:
        used = self.active_memory
        while self._waiting and len(self._active) < self.max_batch_size:
            head = self._waiting[0]
            if not self._fits(head, used):
                break  # strict FIFO: no skipping ahead to a smaller request
            self._waiting.popleft()
            self._active[head.request_id] = head
            used += head.memory_cost

    def is_blocked(self) -> bool:
        """True when the front of the queue can never be admitted (its cost exceeds `max_memory`)."""
        return bool(self._waiting) and self.max_memory is not None and self._waiting[0].memory_cost > self.max_memory


class StaticBatchScheduler(_SchedulerBase):
    """Static batching: a new batch (up to `max_batch_size` requests, FIFO) is admitted only when
    every request of the current batch has finished. `memory_cost` is accepted for a uniform
    interface and otherwise ignored."""

    def _admit(self) -> None:
        if self._active:
            return  # the batch is still draining: free slots stay idle
        while self._waiting and len(self._active) < self.max_batch_size:
            entry = self._waiting.popleft()
            self._active[entry.request_id] = entry


class SkipAheadScheduler(ContinuousBatchScheduler):
    """Continuous batching that skips ahead: when the front of the queue doesn't fit the memory
    budget, admit later requests that do (scanning in FIFO order). Chapter 4 measures it against
    strict FIFO: fewer idle slots, but a large request can starve behind a stream of small ones."""

    def _admit(self) -> None:
        used = self.active_memory
        for entry in list(self._waiting):
            if len(self._active) >= self.max_batch_size:
                break
            if self._fits(entry, used):
                self._waiting.remove(entry)
                self._active[entry.request_id] = entry
                used += entry.memory_cost


class PriorityScheduler(ContinuousBatchScheduler):
    """Chapter 4's memory-aware continuous batching, admitting in priority order (optionally aged).

    Same interface as `ContinuousBatchScheduler` (so `inflight.sim.simulate.simulate` runs it), plus a
    `priority` per request — given to `add_request`, or looked up in `priorities` (request id →
    priority) when not. Time is counted in steps. Admission stays strict (no skipping ahead): if the
    best waiting request doesn't fit, nobody is admitted this step. With equal priorities it makes
    exactly the decisions of `ContinuousBatchScheduler`."""

    def __init__(self, max_batch_size: int, max_memory: Real | None = None, *, aging: Real | None = None,
                 priorities: Mapping[Any, int] | None = None):
        super().__init__(max_batch_size, max_memory)
        self.aging = check_aging(aging)
        try:
            self.priorities = dict(priorities or {})
        except (TypeError, ValueError):
            raise TypeError("priorities must be a mapping of request id -> priority, got "
                            f"{type(priorities).__name__} ({show(priorities)})") from None
        self._now = 0                      # steps run so far
        self._seq = 0

    def add_request(self, request_id: Hashable, num_tokens: int, memory_cost: Real = 1,
                    priority: int | None = None) -> None:
        """Queue a request; `priority` (lower = sooner) defaults to `priorities.get(request_id, 0)`."""
        if priority is None:
            priority = self.priorities.get(request_id, 0)
        priority = check_priority("priority", priority)
        super().add_request(request_id, num_tokens, memory_cost)
        self._waiting[-1].sort_key = priority_key(priority, self._now, self._seq, self.aging)
        self._seq += 1

    def _admit(self) -> None:
        # the queue in key order (a stable sort is cheap when arrivals come in order), then chapter 4's
        # strict admission: if the best waiting request doesn't fit, nobody is admitted this step
        if len(self._waiting) > 1:
            self._waiting = type(self._waiting)(sorted(self._waiting, key=lambda e: e.sort_key))
        super()._admit()

    def step(self) -> list:
        ran = super().step()
        self._now += 1
        return ran


def _id_kind(request_id: Hashable) -> type:
    """What an id sorts as: every real number is a number (1 and 2.5 sort together), every string a
    string (numpy's too), anything else its own type."""
    for kind in (Real, str, bytes):
        if isinstance(request_id, kind):
            return kind
    return type(request_id)
