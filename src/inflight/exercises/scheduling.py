"""Graders for the scheduling chapters (static batching, continuous batching, memory-aware admission).

Each grader takes the learner's scheduler *class*, builds fresh instances, replays scripted
scenarios (the spec's examples, edge cases, randomized scripts) and compares every `step()` result
with the package's reference. The classic wrong answers, as code, are in `scheduling_mistakes`.
"""
from __future__ import annotations

import random
from typing import Any, Sequence

from inflight.sim.schedulers import ContinuousBatchScheduler, StaticBatchScheduler
from inflight.exercises.grading import Case, GradeResult, grade
from inflight.exercises.scheduling_mistakes import CONTINUOUS_MISTAKES, MEMORY_MISTAKES, STATIC_MISTAKES

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

