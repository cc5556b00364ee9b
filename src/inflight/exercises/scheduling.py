"""Graders for the scheduling chapters (static batching, continuous batching, memory-aware admission).

Each grader takes the learner's scheduler *class*, builds fresh instances, replays scripted
scenarios (the spec's examples, edge cases, randomized scripts) and compares every `step()` result
with the package's reference. The classic wrong answers, as code, are in `scheduling_mistakes`.
"""
from __future__ import annotations

import random
from typing import Any, Sequence

from inflight.sim.schedulers import ContinuousBatchScheduler, StaticBatchScheduler
from inflight.exercises.answers import Flaw, as_list
from inflight.exercises.grading import Case, GradeResult, grade
from inflight.exercises.scheduling_checks import explain_schedule
from inflight.exercises.scheduling_memory_mistakes import MEMORY_MISTAKES
from inflight.exercises.scheduling_mistakes import CONTINUOUS_MISTAKES, STATIC_MISTAKES

# A scenario: constructor kwargs and a script of ("add", id, num_tokens[, memory_cost]) / ("step",).
Script = Sequence[tuple]


def _step(sched: Any) -> list:
    """One step() result, checked: a list (or tuple) of the ids, as `simulate` and the chapters consume it."""
    return as_list(sched.step(), "step()", "it returns the list of ids it processed, sorted", accept="list or tuple")


def _run(cls: Any, init: dict, script: Script) -> list:
    sched = cls(**init)
    out = []
    for op in script:
        if op[0] == "add":
            sched.add_request(*op[1:])
        else:
            out.append(_step(sched))
    return out


def _fresh_is_empty(cls: Any, init: dict) -> list:
    """Two schedulers must not share a queue: requests added to one never show in a new one."""
    first = cls(**init)
    for rid, n in (("x", 3), ("y", 2), ("z", 2)):  # two slots: x and y run, z waits
        first.add_request(rid, n)
    _step(first)
    second = cls(**init)
    got = _step(second)
    if any(isinstance(rid, str) and rid in ("x", "y", "z") for rid in got):
        raise Flaw("state shared between schedulers", f"a brand-new scheduler's first step() returned {got!r}",
                   "requests added to ONE scheduler showed up in another, freshly created one: your queue or batch "
                   "is shared by every instance — a container created at class level (`waiting = deque()` right "
                   "under `class ...:`) or a global. Create them in __init__, on self.", first=True)
    return got


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


def _tags(init: dict, script: Script) -> frozenset:
    """Properties of a scenario that a wrong scheduler may trip on (see `TAGS`)."""
    adds = [op for op in script if op[0] == "add"]
    budget = init.get("max_memory")
    first_step = next((i for i, op in enumerate(script) if op[0] == "step"), len(script))
    tags = set()
    if any(isinstance(op[1], int) for op in adds):
        tags.add("int ids")
    if any(i > first_step for i, op in enumerate(script) if op[0] == "add"):
        tags.add("late")
    if init.get("max_batch_size") == 1:
        tags.add("batch 1")
    costs = [op[3] for op in adds if len(op) > 3]
    if costs and budget is None:
        tags.add("no budget")
    if budget is not None:
        tags.add("budget")
        if any(c > budget for c in costs):
            tags.add("over budget")
        if len(costs) < len(adds):
            tags.add("default cost")
    if any(isinstance(c, float) for c in costs) or isinstance(budget, float):
        tags.add("fractions")
    return frozenset(tags)


def _case(name: str, init: dict, script: Script) -> Case:
    script = tuple(script)
    return Case(name, lambda impl, i=init, s=script: _run(impl, i, s), _describe(init, script),
                tags=_tags(init, script), unit="step", depth=1, data=(init, script))


def _shared_state_case(init: dict) -> Case:
    return Case("two schedulers don't share requests", lambda impl, i=init: _fresh_is_empty(impl, i),
                f"Scheduler({', '.join(f'{k}={v}' for k, v in init.items())}) with three requests and a step(), "
                "then a NEW scheduler's first step()")


_TAG_HINTS = {
    "int ids": ("the request ids are integers",
                "return the ids themselves, sorted as numbers (sorted([10, 2]) is [2, 10]): don't turn them into "
                "strings, and don't rely on anything that works only for strings."),
    "batch 1": ("max_batch_size is 1", "check your comparison with max_batch_size at its smallest: "
                "`len(active) < max_batch_size` admits exactly one request here."),
    "default cost": ("requests are added without a memory_cost while max_memory is set",
                     "the default memory_cost is 1, and it counts against max_memory like any other cost."),
    "fractions": ("memory costs are fractions (0.5, 0.75)",
                  "memory is a number, not a count: don't round it or use integer division on it."),
    "over budget": ("a request's memory_cost exceeds max_memory on its own",
                    "such a request can never be admitted, and under strict FIFO it blocks everyone behind it "
                    "forever (the text says so): don't admit it, don't skip it, don't drop it."),
    "no budget": ("max_memory is None while requests have memory costs",
                  "None means no memory limit: skip the memory check entirely (don't compare with None, don't "
                  "treat it as 0)."),
}
STATIC_TAGS = {**{k: _TAG_HINTS[k] for k in ("int ids", "batch 1")},
               "late": ("requests arrive while a batch is running (add_request between steps)",
                        "a request added while a batch runs waits until the whole batch has finished, then joins the "
                        "next batch at the start of a step() — check what your step() does with late arrivals.")}
CONTINUOUS_TAGS = {**{k: _TAG_HINTS[k] for k in ("int ids", "batch 1")},
                   "late": ("requests arrive while others are running (add_request between steps)",
                            "a request added between steps joins at the start of the next step() if a slot is "
                            "free — check what your step() does with requests that arrive after the first step.")}
MEMORY_TAGS = {**CONTINUOUS_TAGS, **{k: _TAG_HINTS[k] for k in
                                    ("default cost", "fractions", "over budget", "no budget")}}


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
        _case("requests arrive one per step", {"max_batch_size": 3},
              [op for i, rid in enumerate("abcdef") for op in (("add", rid, 1 + i % 3), ("step",))] + [("step",)] * 5),
        _shared_state_case({"max_batch_size": 2}),
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
    cases.insert(2, _case("a request added mid-batch waits for the batch to drain", {"max_batch_size": 3},
                          [("add", "a", 3), ("add", "b", 1), ("step",), ("add", "c", 1), ("step",), ("step",),
                           ("step",), ("step",)]))
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
        _case("the default memory_cost of 1 counts against the budget", {"max_batch_size": 5, "max_memory": 2},
              _adds([("a", 2), ("b", 1), ("c", 1), ("d", 2)], 5)),
        _case("a huge request behind a running one waits, then blocks the rest", {"max_batch_size": 4, "max_memory": 6},
              [("add", "a", 2, 2), ("step",), ("add", "big", 1, 7), ("add", "c", 1, 1), ("step",), ("step",), ("step",)]),
        _case("the head waits for memory, not for a slot", {"max_batch_size": 2, "max_memory": 10},
              _adds([("a", 3, 6), ("b", 1, 3), ("c", 2, 5), ("d", 1, 1)], 6)),
        _case("integer ids and costs", {"max_batch_size": 3, "max_memory": 6},
              _adds([(7, 2, 3), (3, 1, 3), (11, 2, 2), (5, 1, 4)], 6)),
        _shared_state_case({"max_batch_size": 2, "max_memory": 10}),
    ]
    rng = random.Random(seed)
    for i in range(n_random):
        init, script = _random_script(rng, memory=True)
        cases.append(_case(f"random scenario {i + 1}", init, script))
    return cases


# --- graders -------------------------------------------------------------------------------------------
def check_static_scheduler(cls: Any, *, quiet: bool = False) -> GradeResult:
    """Grade a static-batching scheduler class: `cls(max_batch_size)`, `add_request(id, n)`, `step()`."""
    return grade("StaticBatchScheduler.step", cls, StaticBatchScheduler, static_cases(), STATIC_MISTAKES, quiet=quiet,
                 explain=explain_schedule("static"), tags=STATIC_TAGS)


def check_continuous_scheduler(cls: Any, *, quiet: bool = False) -> GradeResult:
    """Grade a continuous-batching scheduler class: `cls(max_batch_size)`, `add_request(id, n)`, `step()`."""
    return grade("ContinuousBatchScheduler.step", cls, ContinuousBatchScheduler, continuous_cases(),
                 CONTINUOUS_MISTAKES, quiet=quiet, explain=explain_schedule("continuous"), tags=CONTINUOUS_TAGS)


def check_memory_scheduler(cls: Any, *, quiet: bool = False) -> GradeResult:
    """Grade a memory-aware scheduler class: `cls(max_batch_size, max_memory=None)`,
    `add_request(id, n, memory_cost=1)`, `step()`."""
    return grade("memory-aware ContinuousBatchScheduler.step", cls, ContinuousBatchScheduler, memory_cases(),
                 MEMORY_MISTAKES, quiet=quiet, explain=explain_schedule("continuous"), tags=MEMORY_TAGS)

