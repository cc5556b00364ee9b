"""The machinery behind every "check your answer" cell.

A grader runs a list of `Case`s against the learner's code and against the package's reference,
compares the results, and — when a case fails — looks for a known mistake (a `Mistake`: a small,
deliberately wrong implementation) that behaves like the learner's code across the cases, not on one
case alone (see `recognise_mistake`). If one does, its one-sentence explanation is printed; if none
does, the report says so rather than guess. The result is a `GradeResult`, truthy when every case passed.

Code that never returns is stopped. Every case runs the learner's code under a time limit
(`TIME_LIMIT_S`), enforced by a trace function (`sys.settrace`) that checks the clock at every line
and opcode the learner's code runs (opcodes too: a loop on one line runs no new line) and at every
call it makes; past the deadline it raises `CodeTimeout` in that code, and the grader reports
"your step() did not return within 10 s" instead of hanging the cell. Why a trace function: `signal.alarm` exists only on Unix and only in the main thread (not on
Windows kernels, not in a worker thread); a watchdog thread cannot stop a Python loop; a separate
process would have to pickle the learner's classes, which notebooks define in `__main__`. Tracing
works in any thread on every OS, and costs only while graded code runs: the package's own code is
not traced line by line. The learner's results are compared and printed under the same limit (an
`__eq__` or `__repr__` of their own may raise or loop), and `sys.exit()` is a failed case.
(Only a loop inside one C call — `time.sleep(1e9)` — escapes it.)
"""
from __future__ import annotations

import operator
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

#: How long one case may run the learner's code before the grader stops it (seconds): graded
#: cases take milliseconds, so only code that never returns gets anywhere near it.
TIME_LIMIT_S = 10.0

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../inflight


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
    timed_out: bool = False  # the learner's code did not return within the time limit
    report: str = field(default="", repr=False)

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return self.report


class CodeTimeout(BaseException):
    """Raised inside the learner's code when it runs past its time limit. A BaseException, like
    KeyboardInterrupt, so that an `except Exception:` in the learner's loop does not swallow it."""

    def __init__(self, where: str, seconds: float):
        self.where, self.seconds = where, seconds  # where: "your step()" or "your step() (stopped inside f())"
        super().__init__(self.message)

    @property
    def message(self) -> str:
        name, _, inside = self.where.partition(" (")
        return f"{name} did not return within {self.seconds:g} s" + (f" ({inside}" if inside else "")


def call_with_time_limit(fn: Callable[..., Any], *args: Any, seconds: float | None = None, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, stopped with `CodeTimeout` if code outside the package is still running
    after `seconds` (default `TIME_LIMIT_S`). Works in any thread, on every OS."""
    seconds = TIME_LIMIT_S if seconds is None else seconds
    deadline = time.monotonic() + seconds
    clock = time.monotonic
    entry = sys._getframe()  # the stack above this frame is the grader's, not the learner's

    def line(frame, event, arg):  # in the learner's frames: every line, opcode, call and return
        if clock() > deadline:
            raise CodeTimeout(_learner_function(frame, entry), seconds)
        return line

    def call(frame, event, arg):  # every new frame; the package's own are not traced line by line
        if clock() > deadline:
            raise CodeTimeout(_learner_function(frame, entry), seconds)
        if frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            return None
        # every opcode, not only every line: a loop on one line (`while busy: pass`) runs no new line
        frame.f_trace_opcodes = True
        return line

    previous = sys.gettrace()  # (a debugger's or coverage's tracer comes back afterwards)
    sys.settrace(call)
    try:
        return fn(*args, **kwargs)
    finally:
        sys.settrace(previous)


def _learner_function(frame: Any, entry: Any) -> str:
    """What hung, from the stack: "your step()" for the function the grader called, plus where it
    was when stopped if that is another function ("your step() (stopped inside wait_for())")."""
    names = []  # the learner's named functions on the stack, innermost first (lambdas and <module> skipped)
    while frame is not None and frame is not entry:
        code = frame.f_code
        name = getattr(code, "co_qualname", code.co_name)
        if not code.co_filename.startswith(_PACKAGE_DIR) and not name.startswith("<"):
            names.append(name)
        frame = frame.f_back
    if not names:
        return "your code"
    where = f" (stopped inside {names[0]}())" if names[0] != names[-1] else ""
    return f"your {names[-1]}(){where}"


class _TimedOut:
    """Stands for "the implementation did not return": unequal to every result."""

    def __init__(self, stop: CodeTimeout):
        self.message = stop.message

    def __eq__(self, other: object) -> bool:
        return False

    def __repr__(self) -> str:
        return self.message


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
    """What the learner's `impl` gives on `case` (under the time limit): a result, `_Raised` or `_TimedOut`."""
    try:
        return call_with_time_limit(case.run, impl)
    except NotImplementedError:
        raise
    except CodeTimeout as stop:
        return _TimedOut(stop)
    except (Exception, SystemExit) as exc:  # the learner's bug (even a sys.exit()) is data here, not a crash of the notebook
        return _Raised(exc)


def _same(a: Any, b: Any, *, hang: bool = False) -> bool:
    """`a == b` for results that may hold the learner's objects (a numpy array, a class of their
    own): their `__eq__` and `__bool__` run under the time limit, and a comparison that raises or
    gives no plain truth value (an array's ambiguous one) counts as "not equal". One that hangs
    raises `CodeTimeout` (the grader reports it and stops), or with `hang=True` is "not equal" too."""
    try:
        return call_with_time_limit(lambda: bool(operator.eq(a, b)))
    except Exception:
        return False
    except CodeTimeout:
        if hang:
            return False
        raise


def _short(value: Any, limit: int = 300) -> str:
    """`repr(value)`, cut to `limit`; a learner's `__repr__` that raises or hangs cannot break the report."""
    try:
        text = call_with_time_limit(repr, value)
    except (Exception, CodeTimeout):
        text = f"<a {type(value).__name__} whose repr() failed>"
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
            if not isinstance(got, _TimedOut):
                try:
                    same = _same(got, expected)
                except CodeTimeout as stop:  # the learner's result has an __eq__ that never returns
                    got = _TimedOut(stop)
            if isinstance(got, _TimedOut):  # stop here: every further case could hang just as long
                return _report_timeout(exercise, case, got, n_passed, len(cases), quiet)
            if same:
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


def _report_timeout(exercise: str, case: Case, got: _TimedOut, n_passed: int, n_total: int,
                    quiet: bool) -> GradeResult:
    lines = [f"❌ {exercise}: {got.message}, so the grader stopped it.",
             f"   Case: {case.name}" + (f" — {case.describe}" if case.describe else ""),
             "💡 Look for a loop that never ends: a `while` whose condition nothing in the loop changes, or "
             "one that waits for something only a later step would do.",
             f"   ({n_passed} case(s) passed before it; the rest were not run.)"]
    result = GradeResult(exercise, False, n_passed, n_total, case.name, None, got, timed_out=True,
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
    mine: dict[str, Any] = {}
    for c in cases:  # after one case that hangs, don't wait for the others
        hung = any(isinstance(v, _TimedOut) for v in mine.values())
        mine[c.name] = _TimedOut(CodeTimeout("your code", 0)) if hung else _safe(c, candidate)
    failed = [c for c in cases if not _same(mine[c.name], _safe(c, reference), hang=True)]
    best, best_key = None, (-1, -1)
    for mistake in mistakes:
        theirs = {c.name: _safe(c, mistake.impl) for c in cases}
        if not _same(theirs[failing.name], mine[failing.name], hang=True):
            continue
        reproduced = sum(_same(theirs[c.name], mine[c.name], hang=True) for c in failed)
        key = (reproduced, sum(_same(theirs[c.name], mine[c.name], hang=True) for c in cases))
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
