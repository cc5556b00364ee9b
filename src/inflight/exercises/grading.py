"""The machinery behind every "check your answer" cell.

A grader runs a list of `Case`s against the learner's code and against the package's reference,
compares the results, and — when a case fails — looks for a known mistake (a `Mistake`: a small,
deliberately wrong implementation) that behaves exactly like the learner's code. If one does, its
one-sentence explanation is printed. The result is a `GradeResult`, truthy when every case passed.
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
    mistake = _recognise(candidate, case, cases, mistakes)
    lines = [
        f"❌ {exercise}: {n_passed}/{len(cases)} cases passed.",
        f"   First failing case: {case.name}" + (f" — {case.describe}" if case.describe else ""),
        f"   expected: {_short(expected)}",
        f"   got:      {_short(got)}",
    ]
    if mistake is not None:
        lines.append(f"💡 This looks like a classic mistake — {mistake.name}: {mistake.explanation}")
    result = GradeResult(exercise, False, n_passed, len(cases), case.name, expected, got,
                         mistake.name if mistake else None, mistake.explanation if mistake else None,
                         report="\n".join(lines))
    if not quiet:
        print(result.report)
    return result


def _recognise(candidate: Any, failing: Case, cases: Sequence[Case], mistakes: Sequence[Mistake]) -> Mistake | None:
    """The known mistake that agrees with the candidate on the failing case and on the most other cases."""
    mine = {c.name: _safe(c, candidate) for c in cases}
    best, best_score = None, -1
    for mistake in mistakes:
        if _safe(failing, mistake.impl) != mine[failing.name]:
            continue
        score = sum(_safe(c, mistake.impl) == mine[c.name] for c in cases)
        if score > best_score:
            best, best_score = mistake, score
    return best


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
