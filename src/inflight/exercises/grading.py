"""The machinery behind every "check your answer" cell.

A grader runs a list of `Case`s against the learner's code and against the package's reference,
compares the results, and — when a case fails — prints the first difference (windowed around it,
`inflight.exercises.diff`) and ONE diagnosis, the first of these that holds:

1. a wrong type (a case's strict check raised `answers.Flaw` with `first=True`: "returned a float");
2. the exercise's own structural check (`grade(..., diagnose=...)`: "your step() never calls preempt");
3. a known mistake (a `Mistake`: a small, deliberately wrong implementation) that behaves like the
   learner's code across the cases, not on one case alone (see `recognise_mistake`);
4. a rule of the exercise the answers break (`grade(..., explain=...)`: "step 3 admitted C while B,
   added before it, was waiting"; "right offset, wrong block");
5. another finding of a case (`Flaw`: an input changed, the pool scanned, state kept across calls);
6. a pattern in the failures (`inflight.exercises.diagnosis`): every failing case shares a property
   (a tag: "num_tokens is an exact multiple of block_size"), only one part of the answer is wrong, a
   list of the wrong length, a constant factor or offset, a value of the wrong kind, an exception
   and the learner's line that raised it;
7. otherwise it says it does not know the mistake rather than guess.

The result is a `GradeResult`, truthy when every case passed.

Code that never returns is stopped: see `inflight.exercises.timelimit`.
"""
from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from inflight.exercises import timelimit
from inflight.exercises.diagnosis import (MISTAKE_MIN_SHARE, choose, find_pattern, recognise_mistake,
                                          repeat_case)
from inflight.exercises.diff import difference_lines
from inflight.exercises.outcomes import (Case, Diagnosis, Mistake, _Flawed, _Raised, _TimedOut, outcome, same,
                                         short)
from inflight.exercises.timelimit import CodeTimeout, call_with_time_limit

__all__ = ["Case", "Mistake", "GradeResult", "Diagnosis", "grade", "recognise_mistake", "repeat_case", "use_if_passed",
           "call_with_time_limit", "CodeTimeout", "MISTAKE_MIN_SHARE"]  # (and TIME_LIMIT_S: see _Module)

# the names graders and tests used when all of this lived here
_outcome, _same, _short = outcome, same, short
_KEPT = (_Flawed, _Raised)


@dataclass
class GradeResult:
    """Outcome of a grader. `bool(result)` is pass/fail; the rest is there to print and to test."""

    exercise: str
    passed: bool
    n_passed: int = 0
    n_total: int = 0
    failed_case: str | None = None
    expected: Any = None
    got: Any = None
    mistake: str | None = None  # name of the recognised Mistake, if any
    explanation: str | None = None
    not_implemented: bool = False
    timed_out: bool = False  # the learner's code did not return within the time limit
    report: str = field(default="", repr=False)

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return self.report


def grade(
    exercise: str,
    candidate: Any,
    reference: Any,
    cases: Sequence[Case],
    mistakes: Sequence[Mistake] = (),
    *,
    quiet: bool = False,
    diagnose: Callable[[Any, list], Any] | None = None,
    explain: Callable[[Any, list], Any] | None = None,
    tags: dict[str, tuple[str, str]] | None = None,
    factors: dict[float, str] | None = None,
    fields: dict[str, str] | None = None,
) -> GradeResult:
    """Run every case on `candidate` and `reference`; report the first difference and ONE diagnosis
    (see the module docstring). Keyword arguments (all optional, all exercise-specific knowledge):
    `diagnose(candidate, failures)` a structural check returning a `Diagnosis` or None, where
    `failures` is a list of `(case, expected, got)`; `explain(candidate, failures)` the same, asked
    only when no known mistake matched (a rule the answers break); `tags` {tag: (what the cases
    have, hint)} for the cases' `tags`; `factors` {ratio: meaning} for answers that are a constant
    multiple of the right one; `fields` {key: its rule} for dict answers one key of which may be
    the only one wrong."""
    try:
        ran = _run_cases(candidate, reference, cases)
    except NotImplementedError:
        return _say(GradeResult(exercise, False, 0, len(cases), not_implemented=True, report=(
            f"⏳ {exercise}: not implemented yet — fill in the cell above and run this check again.")), quiet)
    if isinstance(ran[0], _TimedOut):  # stop here: every further case could hang just as long
        got, case, n_passed = ran
        return _say(_timeout_result(exercise, case, got, n_passed, len(cases)), quiet)
    n_passed, failures, mine = ran
    if not failures:
        return _say(GradeResult(exercise, True, n_passed, len(cases),
                                report=f"✅ {exercise}: all {len(cases)} cases passed."), quiet)
    found = choose(candidate, reference, cases, mistakes, failures, mine, diagnose, explain)
    found = found or find_pattern(cases, failures, tags or {}, factors or {}, short, fields)
    shown = found.case if found and found.case is not None else failures[0][0]
    case, expected, got = next(f for f in failures if f[0] is shown)
    label = "First failing case" if case is failures[0][0] else "Failing case"
    lines = [f"❌ {exercise}: {n_passed}/{len(cases)} cases passed.",
             f"   {label}: {case.name}" + (f" — {case.describe}" if case.describe else "")]
    lines += difference_lines(expected, got, short, unit=case.unit, fields=case.fields, depth=case.depth,
                              same=_same_or_false)
    lines.append(found.line() if found else
                 "🤔 Not a mistake I know: no classic slip gives your answers on the failing cases. "
                 "Compare the first difference above with the rule in the text.")
    return _say(GradeResult(exercise, False, n_passed, len(cases), case.name, expected, got,
                            found.name if found else None, found.explanation if found else None,
                            report="\n".join(lines)), quiet)


def _run_cases(candidate: Any, reference: Any, cases: Sequence[Case]) -> tuple:
    """(passed count, [(case, expected, got) that differ], {case name: got}) — or, when a case never
    returned, (its `_TimedOut`, the case, passed count). NotImplementedError passes through."""
    n_passed, failures, mine = 0, [], {}
    for case in cases:
        expected = case.run(reference)
        got = outcome(case, candidate)
        ok = False
        if not isinstance(got, _TimedOut):
            try:
                ok = same(got, expected)
            except CodeTimeout as stop:  # the learner's result has an __eq__ that never returns
                got = _TimedOut(stop)
        if isinstance(got, _TimedOut):
            return got, case, n_passed
        mine[case.name] = got
        if ok:
            n_passed += 1
        else:
            failures.append((case, expected, got))
    return n_passed, failures, mine


def _say(result: GradeResult, quiet: bool) -> GradeResult:
    if not quiet:
        print(result.report)
    return result


def _same_or_false(a: Any, b: Any) -> bool:
    return same(a, b, hang=True)


def _timeout_result(exercise: str, case: Case, got: _TimedOut, n_passed: int, n_total: int) -> GradeResult:
    lines = [f"❌ {exercise}: {got.message}, so the grader stopped it.",
             f"   Case: {case.name}" + (f" — {case.describe}" if case.describe else ""),
             "💡 Look for a loop that never ends: a `while` whose condition nothing in the loop changes, or "
             "one that waits for something only a later step would do.",
             f"   ({n_passed} case(s) passed before it; the rest were not run.)"]
    return GradeResult(exercise, False, n_passed, n_total, case.name, None, got, timed_out=True,
                       report="\n".join(lines))


def use_if_passed(result: GradeResult, mine: Any, reference: Any, what: str | None = None) -> Any:
    """Pick the learner's implementation if it passed, else the package's, and say which one runs on."""
    what = what or getattr(reference, "__name__", "implementation")
    if result:
        print(f"▶ The rest of this chapter uses YOUR {what}.")
        return mine
    print(f"▶ The rest of this chapter uses the package's reference {what} (yours didn't pass yet).")
    return reference


class _Module(types.ModuleType):
    """`grading.TIME_LIMIT_S` reads and sets `timelimit.TIME_LIMIT_S`, where the limit now lives, so
    code (and tests) that set it here keep working."""

    @property
    def TIME_LIMIT_S(self) -> float:  # noqa: N802 - a module constant's name
        return timelimit.TIME_LIMIT_S

    @TIME_LIMIT_S.setter
    def TIME_LIMIT_S(self, value: float) -> None:  # noqa: N802
        timelimit.TIME_LIMIT_S = value


sys.modules[__name__].__class__ = _Module
