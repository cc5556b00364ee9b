"""Priorities and fairness: who is admitted first, who is preempted first, and how to bound starvation.

vLLM's rule: a request with a *lower* `priority` value is served first; ties go to the earlier
arrival. Preemption takes the opposite end of the same order: the lowest-priority request, and
among those the latest arrival. That is an ordering rule, for fairness (first come, first served:
no request is sent back while a later one of its priority keeps running) and simplicity — not a
minimiser of lost work: under recompute a victim loses its computed tokens, which arrival order
does not bound (a late request with a long prompt loses more than an early short one).

Strict priorities can starve: under a steady stream of important requests, an unimportant one may
wait forever. *Aging* bounds that: a request's effective priority improves with its waiting time,
one level per `aging` time units (seconds in the engine, steps in the simulator):

    effective(t) = priority - (t - arrival) / aging

Everyone ages at the same rate, so comparing effective priorities at any moment t is the same as
comparing `arrival + priority * aging` — a fixed *virtual deadline* per request. That makes aging
cheap (the key never changes, the queue never needs re-sorting) and its bound easy to state: a
request is overtaken only by requests that arrived less than `(its priority - theirs) * aging`
after it. With equal priorities (or any aging, with equal priorities) the order is plain FIFO —
the memory-aware FIFO scheduler of chapter 4 is the special case.
"""
from __future__ import annotations

from numbers import Real
from typing import Hashable, Sequence

from inflight.checks import number, show

__all__ = ["effective_priority", "priority_key", "choose_victim", "check_aging"]


def check_aging(aging: Real | None) -> float | None:
    """Validate an aging knob: None (strict priorities) or a positive finite number of time units per level."""
    if aging is None:
        return None
    try:
        return number("aging", aging, above=0.0)
    except TypeError:
        raise TypeError(f"aging must be a positive number (time per priority level) or None, "
                        f"got {type(aging).__name__}") from None
    except ValueError:
        raise ValueError(f"aging must be a positive finite number (time per priority level) or None, "
                         f"got {show(aging)}") from None


def effective_priority(priority: int, arrival: float, aging: float | None = None) -> float:
    """What requests are compared by: the priority itself, or with aging the virtual deadline
    `arrival + priority * aging` (see the module docstring). Lower = more important."""
    return priority if aging is None else arrival + priority * aging


def priority_key(priority: int, arrival: float, seq_no: int = 0, aging: float | None = None) -> tuple:
    """Sort key of a request: smaller = served first, larger = preempted first —
    (effective priority, arrival, submission order)."""
    return (effective_priority(priority, arrival, aging), arrival, seq_no)


def choose_victim(running: Sequence[tuple[Hashable, int, float]]) -> Hashable:
    """The request to preempt among `running` = [(request_id, priority, arrival), ...]: the lowest
    priority (largest value), then the latest arrival; on a full tie the one listed last (it was
    submitted last). The engine calls this with each request's effective priority (aged, when aging
    is on), so the rule the chapter asks for is the rule the engine runs."""
    if not running:
        raise ValueError("choose_victim needs at least one running request")
    best_i = max(range(len(running)), key=lambda i: (running[i][1], running[i][2], i))
    return running[best_i][0]
