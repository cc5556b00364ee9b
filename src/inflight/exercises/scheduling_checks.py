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


def _replay(init: dict, script: tuple, steps: list) -> tuple[list[_Request], dict]:
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


def _problem(policy: str, init: dict, script: tuple, steps: list) -> str | None:
    batch, budget = init.get("max_batch_size"), init.get("max_memory")
    reqs, by_id = _replay(init, script, steps)
    if all(isinstance(ids, list) for ids in steps):
        seen: dict[str, int] = {}
        for ids in steps:
            for rid in ids:
                seen[repr(rid)] = seen.get(repr(rid), 0) + 1
        long = [r for r in reqs if r.n > 1 and seen.get(repr(r.rid)) == 1]
        if long and all(v == 1 for v in seen.values()):
            r = long[0]
            return (f"every request appears in one step only, yet {_fmt(r.rid)} asked for {r.n} tokens: step() returns "
                    "the ids of EVERY request processed in the step (each got one token), not only those that "
                    "finished or started in it.")
    done: dict[Any, int] = {}
    for k, ids in enumerate(steps):
        if not isinstance(ids, list):
            return None
        at = f"step {k}"
        if len(set(map(repr, ids))) != len(ids):
            return f"{at} lists the same request twice: {ids}. Each running request gets one token per step."
        for rid in ids:
            r = by_id.get(rid)
            twin = next((x for x in reqs if str(x.rid) == str(rid) and x.rid != rid), None)
            if r is None and twin is not None:
                return (f"{at} returned {_fmt(rid)} ({type(rid).__name__}), but that request was added as "
                        f"{_fmt(twin.rid)} ({type(twin.rid).__name__}): return the ids exactly as they were added.")
            if r is None or r.added_before > k:
                return (f"{at} processed {_fmt(rid)}, which " + ("was never added" if r is None else
                        f"is only added before step {r.added_before}") + ". Return the ids of the requests "
                        "you processed, as they were added.")
            if rid in done:
                return (f"{at} processed {_fmt(rid)} again, but it asked for {r.n} token(s) and had them all by "
                        f"step {done[rid]}: a request leaves the batch in the step that gives it its last token "
                        "(decrement, then drop it at 0).")
        try:
            ordered = sorted(ids)
        except TypeError:
            ordered = ids
        if ordered != ids:
            return f"{at} returned {ids}, which is not sorted: return sorted(...) of the ids processed."
        if batch is not None and len(ids) > batch:
            return (f"{at} ran {len(ids)} requests {ids}, but max_batch_size is {batch}: admit only while "
                    "len(active) < max_batch_size.")
        if budget is not None:
            used = sum(by_id[rid].cost for rid in ids)
            if used > budget + 1e-12:
                return (f"{at} ran {ids}, whose memory_cost adds up to {used:g}, over max_memory={budget:g}: admit "
                        "a request only if the memory in use plus its own cost stays within max_memory.")
        waiting = [r for r in reqs if r.added_before <= k and not r.runs]  # before this step's admissions
        for rid in ids:
            by_id[rid].runs.append(k)
        started = [by_id[rid] for rid in ids if len(by_id[rid].runs) == 1]
        for r in reqs:  # a request that ran last step and is not done must run now
            if r.runs and r.runs[-1] == k - 1 and repr(r.rid) not in set(map(repr, ids)) and len(r.runs) < r.n \
                    and r.rid not in done:
                return (f"{at} left out {_fmt(r.rid)}, which was running and still needed {r.n - len(r.runs)} of its "
                        f"{r.n} token(s): every running request gets a token in every step until it has all of them.")
        for s in started:
            earlier = [w for w in waiting if w.order < s.order and w not in started]
            if earlier:
                w = earlier[0]
                blocked = (f" ({_fmt(w.rid)} costs {w.cost:g} > max_memory={budget:g}: it can never be admitted, and "
                           "under strict FIFO it blocks everyone behind it — the text says so)"
                           if budget is not None and w.cost > budget else "")
                return (f"{at} admitted {_fmt(s.rid)} while {_fmt(w.rid)}, added before it, was still waiting{blocked}: "
                        "admission is first come, first served (the head of the queue first; nobody overtakes it).")
        if policy == "static":
            carried = [rid for rid in ids if len(by_id[rid].runs) > 1]
            if started and carried:
                return (f"{at} admitted {_fmt(started[0].rid)} while {_fmt(carried[0])} of the running batch had not "
                        "finished: static batching starts a new batch only when every request of the old one is done.")
            if not carried and waiting and len(started) < min(batch, len(waiting)):
                return (f"{at} started a batch of {len(started)} while {len(waiting)} request(s) were waiting and "
                        f"max_batch_size is {batch}: when the batch has drained, fill it with up to max_batch_size "
                        "waiting requests, in the same step.")
        else:
            still = [r for r in waiting if r not in started]
            if still and len(ids) < batch:
                head = still[0]
                used = sum(by_id[rid].cost for rid in ids)
                if budget is None or used + head.cost <= budget:
                    room = "" if budget is None else f", and its cost {head.cost:g} fits ({used:g} in use of {budget:g})"
                    return (f"{at} ran {len(ids)} request(s) with max_batch_size {batch} while {_fmt(head.rid)} waited"
                            f"{room}: admit at the start of every step, into every free slot, before processing.")
        for rid in ids:
            if len(by_id[rid].runs) == by_id[rid].n:
                done[rid] = k
    last = len(steps) - 1
    for r in reqs:
        if r.runs and len(r.runs) < r.n and r.runs[-1] < last:
            return (f"{_fmt(r.rid)} asked for {r.n} token(s) but ran in only {len(r.runs)} step(s) "
                    f"({r.runs}) and then never again: a request stays until its count reaches 0.")
    return None


def explain_schedule(policy: str) -> Callable[[Any, list], Diagnosis | None]:
    """The grader's `explain` for a scheduler of `policy` "static" or "continuous" (memory-aware too)."""

    def explain(candidate: Any, failures: list) -> Diagnosis | None:
        for case, _, got in failures:
            if case.data is None or not isinstance(got, list):
                continue
            init, script = case.data
            found = _problem(policy, init, script, got)
            if found:
                return Diagnosis("a rule of the schedule is broken", found, case)
        return None

    return explain
