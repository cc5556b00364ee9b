"""What a schedule must satisfy, checked on the learner's own answers: the diagnosis of a wrong
scheduler that is no known mistake.

`explain_schedule(policy)` replays a failing case's script beside the learner's `step()` results
and finds the first step at which they break a rule of the contract — a request processed that
was never added or already had its tokens, a step over max_batch_size or over max_memory, a step
list out of order, a running request skipped before it finished, a request that got more or
fewer tokens than it asked for, a request admitted ahead of an earlier one (strict FIFO), a free
slot left idle while the head of the queue fits (continuous), a new batch started while the old one
still runs or smaller than the queue allows (static). Every statement quotes the step, the
requests and the numbers, so it points at the line of `step()` that decides it.
"""
from __future__ import annotations

from typing import Any, Callable

from inflight.exercises.diagnosis import Diagnosis

__all__ = ["explain_schedule"]


def _fmt(x: Any) -> str:
    return repr(x)


class _Request:
    def __init__(self, rid: Any, n: int, cost: float, order: int, added_before: int):
        self.rid, self.n, self.cost, self.order, self.added_before = rid, n, cost, order, added_before
        self.runs: list[int] = []  # steps at which the learner processed it


def _replay(init: dict, script: tuple, steps: list) -> tuple[list[_Request], dict]:  # noqa: ARG001
    """The requests of `script`, with the step before which each was added and the learner's runs."""
    reqs, by_id, k = [], {}, 0
    for op in script:
        if op[0] == "add":
            cost = op[3] if len(op) > 3 else 1
            r = _Request(op[1], op[2], cost, len(reqs), k)
            reqs.append(r)
            by_id.setdefault(op[1], r)
        else:
            k += 1
    return reqs, by_id


def _only_once(reqs: list[_Request], steps: list) -> str | None:
    """Every id in one step only, though some asked for several tokens: finished or started ids returned."""
    seen: dict[str, int] = {}
    for ids in steps:
        for rid in ids:
            seen[repr(rid)] = seen.get(repr(rid), 0) + 1
    long = [r for r in reqs if r.n > 1 and seen.get(repr(r.rid)) == 1]
    if long and all(v == 1 for v in seen.values()):
        r = long[0]
        return (f"every request appears in one step only, yet {_fmt(r.rid)} asked for {r.n} tokens: step() returns "
                "the ids of EVERY request processed in the step (each got one token), not only those that finished "
                "or started in it.")
    return None


class _Schedule:
    """The learner's steps checked one by one against the rules (`problem()` gives the first broken)."""

    def __init__(self, policy: str, init: dict, script: tuple):
        self.policy, self.batch, self.budget = policy, init.get("max_batch_size"), init.get("max_memory")
        self.reqs, self.by_id = _replay(init, script, [])
        self.done: dict[Any, int] = {}

    def problem(self, steps: list) -> str | None:
        if not all(isinstance(ids, list) for ids in steps):
            return None
        found = _only_once(self.reqs, steps)
        for k, ids in enumerate(steps):
            found = found or self._ids(k, ids) or self._limits(k, ids) or self._admission(k, ids)
            if found:
                return found
            for rid in ids:
                if len(self.by_id[rid].runs) == self.by_id[rid].n:
                    self.done[rid] = k
        for r in self.reqs:
            if r.runs and len(r.runs) < r.n and r.runs[-1] < len(steps) - 1:
                return (f"{_fmt(r.rid)} asked for {r.n} token(s) but ran in only {len(r.runs)} step(s) "
                        f"({r.runs}) and then never again: a request stays until its count reaches 0.")
        return None

    def _ids(self, k: int, ids: list) -> str | None:
        """The ids are known, not finished, unique and sorted."""
        if len(set(map(repr, ids))) != len(ids):
            return f"step {k} lists the same request twice: {ids}. Each running request gets one token per step."
        for rid in ids:
            r = self.by_id.get(rid)
            twin = next((x for x in self.reqs if str(x.rid) == str(rid) and x.rid != rid), None)
            if r is None and twin is not None:
                return (f"step {k} returned {_fmt(rid)} ({type(rid).__name__}), but that request was added as "
                        f"{_fmt(twin.rid)} ({type(twin.rid).__name__}): return the ids exactly as they were added.")
            if r is None or r.added_before > k:
                return (f"step {k} processed {_fmt(rid)}, which " + ("was never added" if r is None else
                        f"is only added before step {r.added_before}") + ". Return the ids of the requests you "
                        "processed, as they were added.")
            if rid in self.done:
                return (f"step {k} processed {_fmt(rid)} again, but it asked for {r.n} token(s) and had them all by "
                        f"step {self.done[rid]}: a request leaves the batch in the step that gives it its last token "
                        "(decrement, then drop it at 0).")
        try:
            ordered = sorted(ids)
        except TypeError:
            ordered = ids
        if ordered != ids:
            return f"step {k} returned {ids}, which is not sorted: return sorted(...) of the ids processed."
        return None

    def _limits(self, k: int, ids: list) -> str | None:
        """Slots and memory."""
        if self.batch is not None and len(ids) > self.batch:
            return (f"step {k} ran {len(ids)} requests {ids}, but max_batch_size is {self.batch}: admit only while "
                    "len(active) < max_batch_size.")
        used = sum(self.by_id[rid].cost for rid in ids)
        if self.budget is not None and used > self.budget + 1e-12:
            return (f"step {k} ran {ids}, whose memory_cost adds up to {used:g}, over max_memory={self.budget:g}: "
                    "admit a request only if the memory in use plus its own cost stays within max_memory.")
        return None

    def _admission(self, k: int, ids: list) -> str | None:
        """Running requests keep running; newcomers in FIFO order, when (and as many as) the policy says."""
        waiting = [r for r in self.reqs if r.added_before <= k and not r.runs]  # before this step's admissions
        for rid in ids:
            self.by_id[rid].runs.append(k)
        started = [self.by_id[rid] for rid in ids if len(self.by_id[rid].runs) == 1]
        shown = set(map(repr, ids))
        for r in self.reqs:  # a request that ran last step and is not done must run now
            if r.runs and r.runs[-1] == k - 1 and repr(r.rid) not in shown and len(r.runs) < r.n:
                return (f"step {k} left out {_fmt(r.rid)}, which was running and still needed {r.n - len(r.runs)} of "
                        f"its {r.n} token(s): every running request gets a token in every step until it has all of them.")
        for s in started:
            earlier = [w for w in waiting if w.order < s.order and w not in started]
            if earlier:
                w = earlier[0]
                blocked = (f" ({_fmt(w.rid)} costs {w.cost:g} > max_memory={self.budget:g}: it can never be admitted, "
                           "and under strict FIFO it blocks everyone behind it — the text says so)"
                           if self.budget is not None and w.cost > self.budget else "")
                return (f"step {k} admitted {_fmt(s.rid)} while {_fmt(w.rid)}, added before it, was still waiting"
                        f"{blocked}: admission is first come, first served (the head of the queue first; nobody "
                        "overtakes it).")
        return self._static(k, ids, waiting, started) if self.policy == "static" else \
            self._continuous(k, ids, waiting, started)

    def _static(self, k: int, ids: list, waiting: list, started: list) -> str | None:
        carried = [rid for rid in ids if len(self.by_id[rid].runs) > 1]
        if started and carried:
            return (f"step {k} admitted {_fmt(started[0].rid)} while {_fmt(carried[0])} of the running batch had not "
                    "finished: static batching starts a new batch only when every request of the old one is done.")
        if not carried and waiting and len(started) < min(self.batch, len(waiting)):
            return (f"step {k} started a batch of {len(started)} while {len(waiting)} request(s) were waiting and "
                    f"max_batch_size is {self.batch}: when the batch has drained, fill it with up to max_batch_size "
                    "waiting requests, in the same step.")
        return None

    def _continuous(self, k: int, ids: list, waiting: list, started: list) -> str | None:
        still = [r for r in waiting if r not in started]
        if not still or len(ids) >= self.batch:
            return None
        head, used = still[0], sum(self.by_id[rid].cost for rid in ids)
        if self.budget is not None and used + head.cost > self.budget:
            return None
        room = "" if self.budget is None else f", and its cost {head.cost:g} fits ({used:g} in use of {self.budget:g})"
        return (f"step {k} ran {len(ids)} request(s) with max_batch_size {self.batch} while {_fmt(head.rid)} waited"
                f"{room}: admit at the start of every step, into every free slot, before processing.")


def explain_schedule(policy: str) -> Callable[[Any, list], Diagnosis | None]:
    """The grader's `explain` for a scheduler of `policy` "static" or "continuous" (memory-aware too)."""

    def explain(candidate: Any, failures: list) -> Diagnosis | None:
        for case, _, got in failures:
            if case.data is None or not isinstance(got, list):
                continue
            init, script = case.data
            found = _Schedule(policy, init, script).problem(got)
            if found:
                return Diagnosis("a rule of the schedule is broken", found, case)
        return None

    return explain
