"""Graders for the scheduling chapters (static batching, continuous batching, memory-aware admission).

Each grader takes the learner's scheduler *class*, builds fresh instances, replays scripted
scenarios (the spec's examples, edge cases, randomized scripts) and compares every `step()` result
with the package's reference. The `Mistake`s below are the classic wrong answers, as code.
"""
from __future__ import annotations

import random
from collections import deque
from typing import Any, Sequence

from inflight.sim.schedulers import ContinuousBatchScheduler, StaticBatchScheduler
from inflight.exercises.grading import Case, GradeResult, Mistake, grade

# A scenario: constructor kwargs and a script of ("add", id, num_tokens[, memory_cost]) / ("step",).
Script = Sequence[tuple]


def _run(cls: Any, init: dict, script: Script) -> list:
    sched = cls(**init)
    out = []
    for op in script:
        if op[0] == "add":
            sched.add_request(*op[1:])
        else:
            res = sched.step()
            out.append(list(res) if isinstance(res, (list, tuple)) else res)
    return out


def _describe(init: dict, script: Script) -> str:
    args = ", ".join(f"{k}={v}" for k, v in init.items())
    parts, steps = [], 0
    for op in list(script) + [("end",)]:
        if op[0] == "step":
            steps += 1
            continue
        if steps:
            parts.append(f"step()×{steps}")
            steps = 0
        if op[0] == "add":
            parts.append(f"add{op[1:]!r}".replace(",)", ")"))
    return f"Scheduler({args}); " + "; ".join(parts)


def _case(name: str, init: dict, script: Script) -> Case:
    return Case(name, lambda impl, i=init, s=tuple(script): _run(impl, i, s), _describe(init, script))


def _adds(reqs: Sequence[tuple], steps: int) -> list[tuple]:
    return [("add", *r) for r in reqs] + [("step",)] * steps


def _random_script(rng: random.Random, memory: bool) -> tuple[dict, list[tuple]]:
    batch = rng.randint(1, 4)
    init: dict = {"max_batch_size": batch}
    budget = None
    if memory and rng.random() < 0.8:
        budget = rng.randint(4, 12)
        init["max_memory"] = budget
    names = rng.sample([a + b for a in "abcdefghjkmnpqrstuvwxyz" for b in "0123456789"], 14)
    script, total = [], 0
    for rid in names:
        n = rng.choice([1, 1, 2, 3, 4, 6, 9])
        total += n
        op = ("add", rid, n)
        if memory:
            op += (rng.randint(1, budget) if budget else rng.randint(1, 9),)
        script.append(op)
        script += [("step",)] * rng.choice([0, 0, 0, 1, 2, 3])
    script += [("step",)] * (total + 2)
    return init, script


# --- reference and classic mistakes ------------------------------------------------------------------
class _Sketch:
    """Minimal state shared by the mistakes: a FIFO of [id, remaining, cost] and an active dict."""

    def __init__(self, max_batch_size: int, max_memory: float | None = None):
        self.max_batch_size, self.max_memory = max_batch_size, max_memory
        self.waiting: deque = deque()
        self.active: dict = {}  # id -> [remaining, cost]

    def add_request(self, request_id, num_tokens, memory_cost=1):
        self.waiting.append((request_id, num_tokens, memory_cost))

    def _take(self):
        rid, n, c = self.waiting.popleft()
        self.active[rid] = [n, c]

    def _process(self) -> list:
        done = sorted(self.active)
        for rid in done:
            self.active[rid][0] -= 1
            if self.active[rid][0] == 0:
                del self.active[rid]
        return done

    def _fill(self):
        while self.waiting and len(self.active) < self.max_batch_size:
            self._take()


class _AdmitAfterProcessing(_Sketch):
    def step(self):
        done = self._process()
        self._fill()
        return done


class _AdmitIntoFreedSlot(_Sketch):
    def step(self):
        self._fill()
        done = self._process()
        self._fill()  # a slot freed this step is reused in this same step
        extra = [rid for rid in self.active if rid not in done]
        for rid in extra:
            self.active[rid][0] -= 1
            if self.active[rid][0] == 0:
                del self.active[rid]
        return sorted(done + extra)


class _Unsorted(_Sketch):
    def step(self):
        self._fill()
        done = list(self.active)  # admission order, not sorted
        self._process()
        return done


class _NoImmediateRefill(_Sketch):
    def step(self):
        if not self.active:
            self._fill()
        return self._process()


class _Lifo(_Sketch):
    def step(self):
        while self.waiting and len(self.active) < self.max_batch_size:
            rid, n, c = self.waiting.pop()
            self.active[rid] = [n, c]
        return self._process()


class _ReportAfterRemoval(_Sketch):
    def step(self):
        self._fill()
        self._process()
        return sorted(self.active)


class _ContinuousRight(_Sketch):  # used as a building block of some static mistakes
    def step(self):
        self._fill()
        return self._process()


class _StaticAdmitNextStep(_Sketch):
    def step(self):
        done = self._process()
        if not self.active:
            self._fill()
        return done


class _StaticWaitsForFullBatch(_Sketch):
    def step(self):
        if not self.active and len(self.waiting) >= self.max_batch_size:
            self._fill()
        return self._process()


class _StaticOnePerBatch(_Sketch):
    def step(self):
        if not self.active and self.waiting:
            self._take()
        return self._process()


class _StaticUnsorted(_Sketch):
    def step(self):
        if not self.active:
            self._fill()
        done = list(self.active)
        self._process()
        return done


class _StaticReportAfterRemoval(_Sketch):
    def step(self):
        if not self.active:
            self._fill()
        self._process()
        return sorted(self.active)


class _MemUsed(_Sketch):
    def used(self):
        return sum(c for _, c in self.active.values())


class _SkipAhead(_MemUsed):
    def step(self):
        for item in list(self.waiting):
            if len(self.active) >= self.max_batch_size:
                break
            if self.max_memory is None or self.used() + item[2] <= self.max_memory:
                self.waiting.remove(item)
                self.active[item[0]] = [item[1], item[2]]
        return self._process()


class _CheckAfterAdmission(_MemUsed):
    def step(self):
        while self.waiting and len(self.active) < self.max_batch_size:
            if self.max_memory is not None and self.used() > self.max_memory:
                break
            self._take()  # the newcomer's own cost is never checked before it is in
        return self._process()


class _NeverRelease(_Sketch):
    def __init__(self, max_batch_size, max_memory=None):
        super().__init__(max_batch_size, max_memory)
        self.used = 0

    def step(self):
        while self.waiting and len(self.active) < self.max_batch_size:
            if self.max_memory is not None and self.used + self.waiting[0][2] > self.max_memory:
                break
            self.used += self.waiting[0][2]
            self._take()
        return self._process()  # finished requests never give their memory back


class _NoneAsZero(_MemUsed):
    def step(self):
        budget = self.max_memory or 0
        while self.waiting and len(self.active) < self.max_batch_size:
            if self.used() + self.waiting[0][2] > budget:
                break
            self._take()
        return self._process()


class _IgnoresMemory(_ContinuousRight):
    pass


class _ExactFitRejected(_MemUsed):
    def step(self):
        while self.waiting and len(self.active) < self.max_batch_size:
            if self.max_memory is not None and self.used() + self.waiting[0][2] >= self.max_memory:
                break
            self._take()
        return self._process()


CONTINUOUS_MISTAKES = [
    Mistake("admit after processing",
            "you admit waiting requests after the tokens of this step are processed, so a newly "
            "admitted request idles one step (the very first step returns []). Admit first, then process.",
            _AdmitAfterProcessing),
    Mistake("slot reused within the step",
            "a slot freed in this step is given to a waiting request in the same step, so one slot "
            "serves two requests at once; a finished request's slot is free only from the next step().",
            _AdmitIntoFreedSlot),
    Mistake("unsorted ids",
            "step() must return the processed ids sorted; yours come back in admission order.",
            _Unsorted),
    Mistake("no immediate refill",
            "you wait for the whole batch to drain before admitting anyone — that is static batching. "
            "Fill every free slot at the start of every step.",
            _NoImmediateRefill),
    Mistake("LIFO admission",
            "you admit the newest request first (a stack); the waiting queue is FIFO — popleft, not pop.",
            _Lifo),
    Mistake("finished requests not reported",
            "you return the ids still active after removal, so a request that finished this step is "
            "missing; return every id processed this step, finished ones included.",
            _ReportAfterRemoval),
]

STATIC_MISTAKES = [
    Mistake("refills before the batch drains",
            "you admit into a free slot while the batch is still running — that is continuous "
            "batching; a static scheduler admits a new batch only when every request has finished.",
            _ContinuousRight),
    Mistake("new batch not processed in its first step",
            "the new batch is admitted after processing, so every batch starts with an idle step "
            "(the first step returns []); admit first, then process in the same step.",
            _StaticAdmitNextStep),
    Mistake("waits for a full batch",
            "you only start a batch when max_batch_size requests are waiting, so a smaller final "
            "group (or a quiet period) never runs; take whatever is waiting, up to max_batch_size.",
            _StaticWaitsForFullBatch),
    Mistake("one request per batch",
            "you admit a single request when the batch is empty; fill the batch with up to "
            "max_batch_size waiting requests.",
            _StaticOnePerBatch),
    Mistake("unsorted ids",
            "step() must return the processed ids sorted; yours come back in admission order.",
            _StaticUnsorted),
    Mistake("finished requests not reported",
            "you return the ids still active after removal, so a request that finished this step is "
            "missing; return every id processed this step, finished ones included.",
            _StaticReportAfterRemoval),
]

MEMORY_MISTAKES = [
    Mistake("skipping ahead",
            "when the front of the queue doesn't fit you admit a smaller request from further back; "
            "the spec is strict FIFO: stop admitting for this step.",
            _SkipAhead),
    Mistake("memory checked after admission",
            "you compare the memory already in use with the budget before adding the newcomer's own "
            "cost, so the admission that crosses the budget slips through; check used + memory_cost <= max_memory.",
            _CheckAfterAdmission),
    Mistake("memory never released",
            "a finished request keeps its memory counted, so the budget shrinks until nothing fits; "
            "release a request's memory_cost when it finishes (or recompute it from the active set).",
            _NeverRelease),
    Mistake("max_memory=None treated as zero",
            "None means 'no memory limit', but you use it as a budget of 0, so nothing is ever "
            "admitted with the defaults; skip the memory check when max_memory is None.",
            _NoneAsZero),
    Mistake("memory ignored",
            "you only count slots; admission must also keep the total memory_cost of the active "
            "requests within max_memory.",
            _IgnoresMemory),
    Mistake("exact fit rejected",
            "a request that fills the budget exactly is allowed (used + cost <= max_memory); you use <.",
            _ExactFitRejected),
]


# --- cases ---------------------------------------------------------------------------------------------
def continuous_cases(n_random: int = 25, seed: int = 0) -> list[Case]:
    """The slot-only continuous-batching cases (constructor takes max_batch_size only)."""
    abc = [("A", 3), ("B", 1), ("C", 2)]
    cases = [
        _case("spec example A/B/C", {"max_batch_size": 2}, _adds(abc, 5)),
        _case("step on an empty scheduler", {"max_batch_size": 3}, [("step",)] * 3),
        _case("batch size 1 runs one at a time", {"max_batch_size": 1}, _adds([("x", 2), ("y", 1), ("z", 2)], 6)),
        _case("more slots than requests", {"max_batch_size": 8}, _adds([("p", 2), ("q", 4)], 5)),
        _case("everyone finishes together, next ones start at once", {"max_batch_size": 2},
              _adds([("a", 1), ("b", 1), ("c", 2), ("d", 1)], 4)),
        _case("ids come back sorted", {"max_batch_size": 3}, _adds([("zed", 2), ("amy", 3), ("max", 1), ("bob", 2)], 5)),
        _case("integer ids sort as numbers", {"max_batch_size": 3}, _adds([(10, 2), (2, 3), (33, 1), (4, 1)], 5)),
        _case("request added while others run", {"max_batch_size": 2},
              [("add", "A", 4), ("add", "B", 2), ("step",), ("add", "C", 2), ("step",), ("step",),
               ("add", "D", 1), ("step",), ("step",), ("step",)]),
        _case("request added after the scheduler went idle", {"max_batch_size": 2},
              [("add", "A", 1), ("step",), ("step",), ("add", "B", 2), ("step",), ("step",), ("step",)]),
        _case("one long request, many short ones", {"max_batch_size": 2},
              _adds([("long", 8)] + [(f"s{i}", 1) for i in range(6)], 10)),
    ]
    rng = random.Random(seed)
    for i in range(n_random):
        init, script = _random_script(rng, memory=False)
        cases.append(_case(f"random scenario {i + 1}", init, script))
    return cases


def static_cases(n_random: int = 25, seed: int = 1) -> list[Case]:
    """Static batching uses the same scenarios: only the expected answers differ."""
    cases = continuous_cases(n_random, seed)
    cases.insert(1, _case("fewer requests than the batch size", {"max_batch_size": 4}, _adds([("u", 2), ("v", 1)], 3)))
    return cases


def memory_cases(n_random: int = 25, seed: int = 2) -> list[Case]:
    """Memory-aware cases: the spec's A/B example, head-of-line blocking, release, exact fits,
    defaults that must behave like slot-only, a request that can never fit, randomized scripts."""
    cases = [
        _case("spec example A/B (memory 8 + 8 > 10)", {"max_batch_size": 5, "max_memory": 10},
              _adds([("A", 3, 8), ("B", 3, 8)], 7)),
        _case("defaults behave like slot-only (A/B/C)", {"max_batch_size": 2},
              [("add", "A", 3), ("add", "B", 1), ("add", "C", 2)] + [("step",)] * 5),
        _case("no budget: memory costs don't matter", {"max_batch_size": 3, "max_memory": None},
              _adds([("a", 2, 50), ("b", 2, 70), ("c", 1, 90), ("d", 1, 1)], 5)),
        _case("exact fit is allowed", {"max_batch_size": 4, "max_memory": 10},
              _adds([("a", 2, 4), ("b", 2, 6), ("c", 1, 1)], 4)),
        _case("head of the queue doesn't fit: nobody behind it jumps ahead", {"max_batch_size": 4, "max_memory": 10},
              _adds([("a", 3, 6), ("b", 2, 6), ("c", 1, 2), ("d", 1, 2)], 7)),
        _case("memory comes back when a request finishes", {"max_batch_size": 3, "max_memory": 9},
              _adds([("a", 1, 5), ("b", 2, 5), ("c", 2, 5), ("d", 1, 4)], 6)),
        _case("slots bind before memory", {"max_batch_size": 2, "max_memory": 100},
              _adds([("a", 2, 1), ("b", 1, 1), ("c", 1, 1)], 4)),
        _case("a request too big for the budget blocks the queue forever",
              {"max_batch_size": 3, "max_memory": 10},
              _adds([("a", 2, 3), ("huge", 1, 11), ("b", 1, 1)], 6)),
        _case("fractional memory costs", {"max_batch_size": 3, "max_memory": 1.0},
              _adds([("a", 2, 0.5), ("b", 1, 0.5), ("c", 1, 0.75)], 5)),
        _case("request arriving while memory is tight", {"max_batch_size": 3, "max_memory": 8},
              [("add", "a", 3, 5), ("step",), ("add", "b", 2, 4), ("add", "c", 1, 3), ("step",), ("step",),
               ("step",), ("step",), ("step",)]),
    ]
    rng = random.Random(seed)
    for i in range(n_random):
        init, script = _random_script(rng, memory=True)
        cases.append(_case(f"random scenario {i + 1}", init, script))
    return cases


# --- graders -------------------------------------------------------------------------------------------
def check_static_scheduler(cls: Any, *, quiet: bool = False) -> GradeResult:
    """Grade a static-batching scheduler class: `cls(max_batch_size)`, `add_request(id, n)`, `step()`."""
    return grade("StaticBatchScheduler.step", cls, StaticBatchScheduler, static_cases(), STATIC_MISTAKES, quiet=quiet)


def check_continuous_scheduler(cls: Any, *, quiet: bool = False) -> GradeResult:
    """Grade a continuous-batching scheduler class: `cls(max_batch_size)`, `add_request(id, n)`, `step()`."""
    return grade("ContinuousBatchScheduler.step", cls, ContinuousBatchScheduler, continuous_cases(),
                 CONTINUOUS_MISTAKES, quiet=quiet)


def check_memory_scheduler(cls: Any, *, quiet: bool = False) -> GradeResult:
    """Grade a memory-aware scheduler class: `cls(max_batch_size, max_memory=None)`,
    `add_request(id, n, memory_cost=1)`, `step()`."""
    return grade("memory-aware ContinuousBatchScheduler.step", cls, ContinuousBatchScheduler, memory_cases(),
                 MEMORY_MISTAKES, quiet=quiet)

