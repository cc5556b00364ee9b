"""Run a scheduler over a workload, record who ran where at each step, and measure it.

Any object with `add_request(request_id, num_tokens[, memory_cost])` and `step() -> list` works
(the package's schedulers, a learner's, a skip-ahead variant). Requests are handed to the scheduler
at their arrival step, before that step runs. Each processed request is pinned to one slot for
its whole life (the lowest free slot when it first runs), so Gantt charts read well.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from inflight.sim.workloads import Request


@dataclass
class RequestStats:
    """When one request arrived, first ran and finished (steps, 0-based)."""

    id: Any
    arrival: int
    num_tokens: int
    memory_cost: float
    first_step: int | None = None
    finish_step: int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_step is not None

    @property
    def waiting_steps(self) -> int | None:
        """Steps spent queued before the first token."""
        return None if self.first_step is None else self.first_step - self.arrival

    @property
    def completion_steps(self) -> int | None:
        """Steps from arrival to the last token, inclusive (the request's latency)."""
        return None if self.finish_step is None else self.finish_step - self.arrival + 1


@dataclass
class SimResult:
    """A finished simulation: the timeline and everything measured from it."""

    num_slots: int
    timeline: list[list[Any]]  # timeline[t][slot] = request id processed there at step t, or None
    requests: dict[Any, RequestStats]
    memory: list[float]  # total memory_cost of the processed requests at each step
    waiting: list[int]  # requests arrived but not yet running, at each step
    deadlocked: bool = False  # stopped because nothing could ever run again
    name: str = ""
    max_memory: float | None = None

    @property
    def steps(self) -> int:
        """Steps until the last token was produced (the makespan)."""
        return len(self.timeline)

    @property
    def busy_slot_steps(self) -> int:
        return sum(rid is not None for row in self.timeline for rid in row)

    @property
    def slot_steps(self) -> int:
        return self.steps * self.num_slots

    @property
    def utilization(self) -> float:
        """Fraction of slot-steps that produced a token."""
        return self.busy_slot_steps / self.slot_steps if self.slot_steps else 0.0

    @property
    def idle_slot_steps(self) -> int:
        return self.slot_steps - self.busy_slot_steps

    @property
    def wasted_slot_steps(self) -> int:
        """Idle slot-steps while some request was waiting: capacity the scheduler threw away."""
        return sum(row.count(None) for row, w in zip(self.timeline, self.waiting) if w > 0)

    @property
    def throughput(self) -> float:
        """Tokens generated per step."""
        return self.busy_slot_steps / self.steps if self.steps else 0.0

    @property
    def total_tokens(self) -> int:
        return self.busy_slot_steps

    def _mean(self, attr: str) -> float:
        vals = [getattr(r, attr) for r in self.requests.values() if getattr(r, attr) is not None]
        return sum(vals) / len(vals) if vals else float("nan")

    @property
    def mean_waiting(self) -> float:
        return self._mean("waiting_steps")

    @property
    def mean_completion(self) -> float:
        return self._mean("completion_steps")

    @property
    def max_waiting(self) -> int:
        return max((r.waiting_steps for r in self.requests.values() if r.waiting_steps is not None), default=0)

    @property
    def unfinished(self) -> list:
        return [rid for rid, r in self.requests.items() if not r.finished]

    def busy_per_step(self) -> list[int]:
        return [sum(rid is not None for rid in row) for row in self.timeline]

    def summary(self) -> dict[str, float]:
        """The headline metrics as a plain dict (handy for tables)."""
        return {
            "steps": self.steps,
            "utilization": self.utilization,
            "throughput": self.throughput,
            "wasted_slot_steps": self.wasted_slot_steps,
            "idle_slot_steps": self.idle_slot_steps,
            "mean_waiting": self.mean_waiting,
            "max_waiting": self.max_waiting,
            "mean_completion": self.mean_completion,
        }


def simulate(scheduler: Any, workload: Sequence[Request], *, num_slots: int | None = None,
             max_steps: int = 100_000, name: str = "") -> SimResult:
    """Feed `workload` to `scheduler` step by step (honouring arrivals) until every request finished.

    Stops early with `deadlocked=True` when nothing ran, nothing is left to arrive, and requests
    are still unfinished (e.g. a request too big for the memory budget blocks the queue).
    """
    num_slots = num_slots or getattr(scheduler, "max_batch_size", None)
    if not num_slots:
        raise ValueError("pass num_slots= (the scheduler has no max_batch_size attribute)")
    pending = sorted(workload, key=lambda r: r.arrival)  # stable: same-step arrivals keep order
    stats = {r.id: RequestStats(r.id, r.arrival, r.output_len, r.memory_cost) for r in workload}
    if len(stats) != len(pending):
        raise ValueError("workload has duplicate request ids")
    remaining = {r.id: r.output_len for r in workload}
    slot_of: dict[Any, int] = {}
    timeline, memory, waiting = [], [], []
    deadlocked, nxt, arrived_unstarted = False, 0, 0
    t = 0
    while remaining and t < max_steps:
        while nxt < len(pending) and pending[nxt].arrival <= t:
            r = pending[nxt]
            # memory_cost only when it matters, so slot-only schedulers (add_request(id, n)) work too
            args = (r.id, r.output_len) if r.memory_cost == 1 else (r.id, r.output_len, r.memory_cost)
            scheduler.add_request(*args)
            nxt, arrived_unstarted = nxt + 1, arrived_unstarted + 1
        ran = scheduler.step()
        if not ran and nxt == len(pending) and not any(s.first_step is not None and not s.finished
                                                       for s in stats.values()):
            deadlocked = True  # nothing running, nothing to come, work left: it will never move
            break
        row: list[Any] = [None] * num_slots
        for rid in ran:
            if rid not in remaining:
                raise RuntimeError(f"step {t}: scheduler processed {rid!r}, which is unknown or already finished")
            if rid not in slot_of:
                free = [s for s in range(num_slots) if s not in slot_of.values()]
                if not free:
                    raise RuntimeError(f"step {t}: more than {num_slots} requests running")
                slot_of[rid] = free[0]
                stats[rid].first_step = t
                arrived_unstarted -= 1
            row[slot_of[rid]] = rid
        waiting.append(arrived_unstarted)
        timeline.append(row)
        memory.append(sum(stats[rid].memory_cost for rid in ran))
        for rid in ran:
            remaining[rid] -= 1
            if remaining[rid] == 0:
                del remaining[rid]
                del slot_of[rid]
                stats[rid].finish_step = t
        t += 1
    # trailing idle steps (nothing arrived yet, then nothing at all) don't count toward the makespan
    while timeline and all(rid is None for rid in timeline[-1]):
        timeline.pop(), memory.pop(), waiting.pop()
    return SimResult(num_slots, timeline, stats, memory, waiting, deadlocked, name,
                     getattr(scheduler, "max_memory", None))


def compare(factories: dict[str, Callable[[], Any]], workload: Sequence[Request], **kwargs: Any) -> dict[str, SimResult]:
    """Simulate several schedulers (given as zero-argument factories) on the same workload."""
    return {name: simulate(make(), workload, name=name, **kwargs) for name, make in factories.items()}
