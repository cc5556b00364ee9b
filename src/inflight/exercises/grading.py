"""The machinery behind every "check your answer" cell.

A grader runs a list of `Case`s against the learner's code and against the package's reference,
compares the results, and — when a case fails — looks for a known mistake (a `Mistake`: a small,
deliberately wrong implementation) that behaves like the learner's code across the cases, not on one
case alone (see `recognise_mistake`). If one does, its one-sentence explanation is printed; if none
does, the report says so rather than guess. The result is a `GradeResult`, truthy when every case passed.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence


@dataclass
class Case:
    """One graded case: `run(impl)` exercises an implementation and returns a comparable result."""

    name: str
    run: Callable[[Any], Any]
    describe: str = ""  # what the case feeds in, shown when it fails


@dataclass
class Mistake:
    """A classic wrong answer, as code, with the sentence that explains it."""

    name: str
    explanation: str
    impl: Any


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
    report: str = field(default="", repr=False)

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return self.report


class _Raised:
    """Stands for "the implementation raised" so that exceptions compare like results."""

    def __init__(self, exc: BaseException):
        self.type = type(exc).__name__
        self.message = str(exc)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Raised) and other.type == self.type

    def __repr__(self) -> str:
        return f"raised {self.type}: {self.message}"


def _outcome(case: Case, impl: Any) -> Any:
    try:
        return case.run(impl)
    except NotImplementedError:
        raise
    except Exception as exc:  # the learner's bug is data here, not a crash of the notebook
        return _Raised(exc)


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def grade(
    exercise: str,
    candidate: Any,
    reference: Any,
    cases: Sequence[Case],
    mistakes: Sequence[Mistake] = (),
    *,
    quiet: bool = False,
) -> GradeResult:
    """Run every case on `candidate` and `reference`; report the first difference and its likely cause."""
    n_passed = 0
    failure: tuple[Case, Any, Any] | None = None
    try:
        for case in cases:
            expected = case.run(reference)
            got = _outcome(case, candidate)
            if got == expected:
                n_passed += 1
            elif failure is None:
                failure = (case, expected, got)
    except NotImplementedError:
        result = GradeResult(exercise, False, 0, len(cases), not_implemented=True,
                             report=f"⏳ {exercise}: not implemented yet — fill in the cell above and run this check again.")
        if not quiet:
            print(result.report)
        return result

    if failure is None:
        result = GradeResult(exercise, True, n_passed, len(cases),
                             report=f"✅ {exercise}: all {len(cases)} cases passed.")
        if not quiet:
            print(result.report)
        return result

    case, expected, got = failure
    mistake, explained = recognise_mistake(candidate, reference, case, cases, mistakes)
    lines = [
        f"❌ {exercise}: {n_passed}/{len(cases)} cases passed.",
        f"   First failing case: {case.name}" + (f" — {case.describe}" if case.describe else ""),
        f"   expected: {_short(expected)}",
        f"   got:      {_short(got)}",
    ]
    lines.append(_mistake_line(mistake, explained))
    result = GradeResult(exercise, False, n_passed, len(cases), case.name, expected, got,
                         mistake.name if mistake else None, mistake.explanation if mistake else None,
                         report="\n".join(lines))
    if not quiet:
        print(result.report)
    return result


# A known mistake is named only when it gives the learner's exact (wrong) answer on the first failing
# case shown AND on at least this share of all the cases the learner failed. One shared case proves
# little: a shortest-job-first scheduler and a LIFO one both put B before A in the spec's example,
# yet LIFO reproduces only 2 of its 28 failures. Every mistake the test suite writes independently is
# reproduced on >= 75 % of its failures (most on all of them; a few learner-style mutants carry a
# second slip, e.g. a free() without a double-free check that also drops reference counts: 9 of 12).
MISTAKE_MIN_SHARE = 0.75


def recognise_mistake(candidate: Any, reference: Any, failing: Case, cases: Sequence[Case],
                      mistakes: Sequence[Mistake]) -> tuple[Mistake | None, tuple[int, int]]:
    """The known mistake that reproduces the candidate's wrong answers, with (reproduced, failed) counts.

    A mistake qualifies when it gives the candidate's answer on `failing` and on at least
    `MISTAKE_MIN_SHARE` of the cases the candidate fails; the one reproducing the most failures
    wins (ties: the most agreement over all cases). None when no mistake qualifies.
    """
    mine = {c.name: _safe(c, candidate) for c in cases}
    failed = [c for c in cases if mine[c.name] != _safe(c, reference)]
    best, best_key = None, (-1, -1)
    for mistake in mistakes:
        theirs = {c.name: _safe(c, mistake.impl) for c in cases}
        if theirs[failing.name] != mine[failing.name]:
            continue
        reproduced = sum(theirs[c.name] == mine[c.name] for c in failed)
        key = (reproduced, sum(theirs[c.name] == mine[c.name] for c in cases))
        if reproduced >= MISTAKE_MIN_SHARE * len(failed) and key > best_key:
            best, best_key = mistake, key
    return best, (max(best_key[0], 0), len(failed))


def _mistake_line(mistake: Mistake | None, explained: tuple[int, int]) -> str:
    if mistake is None:
        return ("🤔 Not a mistake I know: no classic slip gives your answers on the failing cases. "
                "Compare the first failing case above with the rule in the text.")
    reproduced, failed = explained
    return (f"💡 This looks like a classic mistake — {mistake.name} (it gives your answer on {reproduced} of "
            f"your {failed} failing cases): {mistake.explanation}")


def _safe(case: Case, impl: Any) -> Any:
    try:
        return _outcome(case, impl)
    except NotImplementedError as exc:
        return _Raised(exc)


def use_if_passed(result: GradeResult, mine: Any, reference: Any, what: str | None = None) -> Any:
    """Pick the learner's implementation if it passed, else the package's, and say which one runs on."""
    what = what or getattr(reference, "__name__", "implementation")
    if result:
        print(f"▶ The rest of this chapter uses YOUR {what}.")
        return mine
    print(f"▶ The rest of this chapter uses the package's reference {what} (yours didn't pass yet).")
    return reference


def format_exception(exc: BaseException) -> str:  # pragma: no cover - debugging helper
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()
