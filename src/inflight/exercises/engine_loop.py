"""Grader for chapter 6: put the engine's five steps in order.

The learner writes `step(engine)` calling `engine.reap()`, `engine.budget()`, `engine.admit()`,
`engine.preempt()` and `engine.decode()` (or gives the order as a list of those names). The grader
RUNS that order in `SimEngine` — the engine's real scheduler over a simulated KV pool, with a
model that just emits tokens — and compares what it measures with the right order: requests
admitted, blocks left idle while requests waited, tokens wasted on finished requests, tokens with
no KV slot, preemptions, time to first token. A wrong order is explained from those numbers.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

from inflight.engine.scheduler import STEP_ORDER
from inflight.exercises.grading import (Case, CodeTimeout, Diagnosis, GradeResult, Mistake, call_with_time_limit,
                                        grade)
from inflight.sim.engine_sim import SimEngine
from inflight.sim.workloads import Request

__all__ = ["reference_step", "step_from_order", "measure_order", "check_engine_loop",
           "MISTAKE_ORDERS", "WORKLOADS"]


def reference_step(engine: SimEngine) -> None:
    """The right order: reap → budget → admit → preempt → decode."""
    engine.reap()
    engine.budget()
    engine.admit()
    engine.preempt()
    engine.decode()


def step_from_order(order: Sequence[str]) -> Callable[[SimEngine], None]:
    """A `step(engine)` that calls the named steps in the given order."""
    names = [str(n).strip().lower() for n in order]
    unknown = [n for n in names if n not in STEP_ORDER]
    if unknown:
        raise ValueError(f"unknown step name(s) {unknown}; the steps are {list(STEP_ORDER)}")

    def step(engine: SimEngine) -> None:
        for n in names:
            getattr(engine, n)()

    step.order = tuple(names)  # type: ignore[attr-defined]
    return step


# -- workloads and measurements ------------------------------------------------------------------
def _requests(*specs: tuple) -> list[Request]:
    """Requests from (prompt_len, output_len[, arrival step]) triples, named by their position."""
    return [Request(str(i), p, o, *rest) for i, (p, o, *rest) in enumerate(specs)]


def _tight_pool() -> dict:
    """Short and long requests over a pool that holds about three of them: finishes, waits, growth."""
    reqs = _requests((6, 3), (5, 9), (7, 4), (4, 12), (6, 2, 1), (5, 6, 2), (8, 5, 3), (3, 8, 4), (6, 3, 6), (4, 10, 7))
    return dict(requests=reqs, num_blocks=10, block_size=4, max_batch_size=4, max_batched_tokens=32)


def _growth() -> dict:
    """Requests that all keep growing in a pool too small for all of them: preemption territory."""
    reqs = _requests((4, 14), (4, 14), (4, 14), (4, 14), (2, 3, 2), (2, 3, 3))
    return dict(requests=reqs, num_blocks=11, block_size=4, max_batch_size=4, max_batched_tokens=32)


def _trickle() -> dict:
    """One request at a time arriving on an idle engine: every step of delay shows in TTFT."""
    reqs = _requests((3, 2, 0), (3, 2, 4), (5, 3, 8))
    return dict(requests=reqs, num_blocks=16, block_size=4, max_batch_size=4, max_batched_tokens=32)


WORKLOADS = {"tight pool": _tight_pool, "growing requests": _growth, "trickle": _trickle}


def _run(step, workload: dict, max_steps: int = 200) -> SimEngine:
    engine = SimEngine(**workload)
    while not engine.done() and engine.step_no < max_steps:
        engine.run_step(step)
    return engine


def measure_order(step, workload: str = "tight pool", max_steps: int = 200) -> dict:
    """Run `step` over a whole workload; totals of what happened (the numbers the grader compares)."""
    engine = _run(step, WORKLOADS[workload](), max_steps)
    log = engine.log
    ttft = [s.first_token_time - s.arrival_time for s in engine.seqs if s.first_token_time is not None]
    return {
        "finished": sum(s.finish_reason is not None for s in engine.seqs),
        "steps": engine.step_no,
        "deadlocked": not engine.done(),
        "wasted_tokens": sum(r["wasted_tokens"] for r in log),
        "tokens_without_kv": sum(r["tokens_without_kv"] for r in log),
        "overcommitted_blocks": sum(r["overcommitted_blocks"] for r in log),
        "preemptions": sum(r["preempted"] for r in log),
        "idle_block_steps": sum(r["idle_blocks"] for r in log),
        "mean_ttft_steps": round(sum(ttft) / len(ttft), 2) if ttft else None,
        "wrong_lengths": sum(s.num_output_tokens != s.params.max_tokens for s in engine.seqs if s.finish_reason),
    }


def measure_one_step(step, workload: str, after: int) -> dict:
    """Run the right order for `after` steps, then ONE step of `step`, and report what that step did."""
    engine = SimEngine(**WORKLOADS[workload]())
    for _ in range(after):
        engine.run_step(reference_step)
    snapshot = copy.deepcopy(engine)
    rec = snapshot.run_step(step)
    sched = snapshot.scheduler
    rec["free_blocks_after"] = sched.allocator.num_free
    rec["running_after"] = sorted(s.request_id for s in sched.running)
    rec["waiting_after"] = len(sched.waiting) + len(sched.swapped)
    return rec


def _cases() -> list[Case]:
    cases = []
    for name in WORKLOADS:
        cases.append(Case(f"whole workload: {name}", lambda impl, n=name: measure_order(impl, n),
                          describe=f"run your step() until every request of the '{name}' workload finishes"))
    for name, after in _ONE_STEP_CASES:
        cases.append(Case(f"one step: {name} after {after} steps", lambda impl, n=name, a=after: measure_one_step(impl, n, a),
                          describe=f"{after} right steps of '{name}', then one step of yours"))
    return cases


# -- classic wrong orders, each explained from what it measured ----------------------------------
# Templates are filled with numbers measured by running the wrong order: `x` on the whole 'tight
# pool' workload, `os_x` summed over the single steps the grader runs from prepared states, and
# `ref_...` the same for the right order.
MISTAKE_ORDERS = {
    "budget before reap": (("budget", "reap", "admit", "preempt", "decode"),
                           "the budget was computed while finished requests still held their KV blocks, so admission "
                           "saw a fuller pool than there was. Measured: from the same states it admitted {os_admitted} "
                           "request(s) where reap-first admitted {ref_os_admitted}, and over the workload "
                           "{idle_block_steps} block-steps sat idle while requests waited (reap first: "
                           "{ref_idle_block_steps}); mean TTFT {mean_ttft_steps} vs {ref_mean_ttft_steps} steps. "
                           "Free first, then measure."),
    "decode first": (("decode", "reap", "budget", "admit", "preempt"),
                     "the forward pass ran before this step's batch was built, on last step's plan. Measured: "
                     "{os_wasted} token(s) computed for requests that had already finished, {os_nokv} token(s) with no "
                     "KV slot, and every request admitted in a step waited for the next step's decode: mean TTFT "
                     "{mean_ttft_steps} vs {ref_mean_ttft_steps} steps. Decode goes last, on the batch the other "
                     "four steps built."),
    "admit before budget": (("reap", "admit", "budget", "preempt", "decode"),
                            "admission spent the previous step's budget, which no longer matched the pool: "
                            "{overcommitted_blocks} block(s) went to new requests although running requests needed "
                            "them, and elsewhere it under-admitted — {idle_block_steps} idle block-steps while requests "
                            "waited (right order: {ref_idle_block_steps}), mean TTFT {mean_ttft_steps} vs "
                            "{ref_mean_ttft_steps} steps. Measure the budget right before you spend it."),
    "preempt before reap": (("preempt", "reap", "budget", "admit", "decode"),
                            "preemption ran before reap and budget, on a stale plan that still gave finished requests a "
                            "next token: it reserved blocks for requests that were done and evicted live ones to find "
                            "them — {preemptions} preemptions on the workload vs {ref_preemptions} in the right order "
                            "({g_preemptions} vs {ref_g_preemptions} on the growing-requests workload)."),
    "decode before preempt": (("reap", "budget", "admit", "decode", "preempt"),
                              "the forward pass ran before the running requests were given blocks for their new tokens: "
                              "{os_nokv} scheduled token(s) found no KV slot in the steps measured (a real engine would "
                              "write into another request's cache or crash), and allocating after decode reserves "
                              "blocks a step early: {preemptions} preemptions vs {ref_preemptions}."),
    "admit after decode": (("reap", "budget", "preempt", "decode", "admit"),
                           "requests admitted after the forward pass hold their blocks through a step in which they "
                           "compute nothing: mean TTFT {mean_ttft_steps} vs {ref_mean_ttft_steps} steps, and the "
                           "workload took {steps} steps instead of {ref_steps}."),
    "reap last": (("budget", "admit", "preempt", "decode", "reap"),
                  "over whole workloads this loop measures the same as the right one (the previous step's reap runs "
                  "just before this budget), but a step must start from the state the last decode left: from there "
                  "your step budgeted and decoded with finished requests still in the batch — {os_wasted} token(s) "
                  "wasted on finished requests and {os_admitted} admissions vs {ref_os_admitted}. Start each step "
                  "by reaping."),
}

_ONE_STEP_CASES = [("tight pool", 3), ("tight pool", 5), ("tight pool", 8), ("growing requests", 6),
                   ("growing requests", 9), ("trickle", 4)]


def evidence(step) -> dict:
    """The numbers the explanations quote, measured for `step`."""
    full = measure_order(step, "tight pool")
    grow = measure_order(step, "growing requests")
    ones = [measure_one_step(step, w, a) for w, a in _ONE_STEP_CASES]
    return {**full, "g_preemptions": grow["preemptions"],
            "os_admitted": sum(r["admitted"] for r in ones), "os_wasted": sum(r["wasted_tokens"] for r in ones),
            "os_nokv": sum(r["tokens_without_kv"] for r in ones), "os_idle": sum(r["idle_blocks"] for r in ones)}


_MISTAKES_CACHE: list[Mistake] = []


def _mistakes() -> list[Mistake]:
    if _MISTAKES_CACHE:
        return _MISTAKES_CACHE
    ref = evidence(reference_step)
    for name, (order, template) in MISTAKE_ORDERS.items():
        step = step_from_order(order)
        values = {**evidence(step), **{f"ref_{k}": v for k, v in ref.items()}}
        _MISTAKES_CACHE.append(Mistake(name, template.format(**values), step))
    return _MISTAKES_CACHE


# -- what the learner's step() calls, and the rules an order must keep ---------------------------
def _calls_per_step(step: Callable, n_steps: int = 4) -> list[list[str]]:
    """The step names the learner's `step()` calls in each of its first steps on the trickle workload."""
    probe = SimEngine(**WORKLOADS["trickle"]())
    out = []
    for _ in range(n_steps):
        before = len(probe.calls)
        call_with_time_limit(probe.run_step, step)
        out.append(probe.calls[before:])
    return out


_UNDONE = {"reap": "finished requests keep their blocks forever", "budget": "admission has no budget to spend",
           "admit": "waiting requests never join the batch",
           "preempt": "running requests never get blocks for their new tokens (and nobody is evicted when the pool is "
                      "dry)", "decode": "no token is ever computed"}


def _structure(step: Callable, failures: list) -> Diagnosis | None:
    """A step() that does not call each of the five steps exactly once per iteration, always in one
    order: that is the diagnosis, whatever the measurements say."""
    try:
        per_step = _calls_per_step(step)
    except (Exception, SystemExit, CodeTimeout):  # the cases report what it raised
        return None
    first = per_step[0]
    missing = [n for n in STEP_ORDER if n not in first]
    twice = sorted({n for n in first if first.count(n) > 1})
    shown = " → ".join(first) or "nothing"
    if missing:
        undone = "; ".join(_UNDONE[n] for n in missing)
        return Diagnosis(f"your step() never calls {', '.join(missing)}",
                         f"it calls {shown}; each of the five steps runs once per iteration, or its work is never "
                         f"done: {undone}.", failures[0][0])
    if twice:
        return Diagnosis(f"your step() calls {', '.join(twice)} more than once",
                         f"it calls {shown}; each step runs exactly once per iteration.", failures[0][0])
    varying = next((k for k, calls in enumerate(per_step) if calls and calls != first), None)
    if varying is not None:
        return Diagnosis("your step() changes its order from one step to the next",
                         f"step 0 calls {shown} but step {varying} calls {' → '.join(per_step[varying])}: the "
                         "iteration is the same five steps in the same order every time (no `if` around them).",
                         failures[0][0])
    return None


#: (earlier, later, why): the rules an order must keep; the two orders that keep them all are the
#: book's (admit then preempt) and vLLM's (preempt then admit).
RULES = [
    ("reap", "budget", "the budget counts free blocks, and finished requests still hold theirs until reap frees them"),
    ("budget", "admit", "admission spends this step's budget; spent before it is computed, it is last step's"),
    ("budget", "preempt", "preemption gives the running requests the blocks their planned tokens need, and the plan "
                          "is made by budget"),
    ("admit", "decode", "a request admitted after the forward pass holds its blocks through a step it computes nothing in"),
    ("preempt", "decode", "the forward pass writes each new token's K and V into a block that preempt must have "
                          "given it first"),
]


def _order_rules(step: Callable, failures: list) -> Diagnosis | None:
    """For an order that is a wrong permutation no known mistake matches: the rules it breaks."""
    try:
        order = _calls_per_step(step, 1)[0]
    except (Exception, SystemExit, CodeTimeout):
        return None
    if sorted(order) != sorted(STEP_ORDER):
        return None
    broken = [(a, b, why) for a, b, why in RULES if order.index(a) > order.index(b)]
    if not broken:
        return None
    a, b, why = broken[0]
    more = f" (and {len(broken) - 1} more rule(s) like it)" if len(broken) > 1 else ""
    return Diagnosis(f"{b} runs before {a}", f"your order {' → '.join(order)} calls {b} before {a}, but {why}{more}. "
                     "The order that keeps every rule: reap → budget → admit → preempt → decode (admit and preempt "
                     "may swap).", failures[0][0])


def check_engine_loop(step: Callable[[SimEngine], Any] | Sequence[str], *, quiet: bool = False) -> GradeResult:
    """Grade a `step(engine)` (or a list of the five step names) by running it and measuring."""
    if not callable(step):
        try:
            step = step_from_order(step)
        except (ValueError, TypeError) as exc:
            result = GradeResult("the engine loop", False, report=f"❌ the engine loop: {exc}")
            if not quiet:
                print(result.report)
            return result
    result = grade("the engine loop", step, reference_step, _cases(), _mistakes(), quiet=True,
                   diagnose=_structure, explain=_order_rules)
    order = None
    if not result.timed_out:  # (a step() that never returns was reported above: don't run it again)
        try:
            order = " → ".join(_calls_per_step(step, 1)[0])
        except (Exception, SystemExit, CodeTimeout):  # the cases above already reported it
            order = None
    lines = result.report.split("\n")
    if order:
        lines.insert(1, f"   Your step() calls: {order}")
    if result and order and order.split(" → ") != list(STEP_ORDER):
        lines.append("   (Your order differs from reap → budget → admit → preempt → decode but measured the same on "
                     "every case: here admit and preempt commute, because the budget already reserved the running "
                     "requests' blocks, so admission cannot take them. vLLM's scheduler runs them in your order.)")
    result.report = "\n".join(lines)
    if not quiet:
        print(result.report)
    return result
