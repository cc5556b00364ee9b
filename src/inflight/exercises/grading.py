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

import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from inflight.exercises.answers import Flaw
from inflight.exercises.diff import difference_lines, same_values

__all__ = ["Case", "Mistake", "GradeResult", "Diagnosis", "grade", "recognise_mistake", "repeat_case", "use_if_passed",
           "call_with_time_limit", "CodeTimeout", "TIME_LIMIT_S", "MISTAKE_MIN_SHARE"]

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
    tags: frozenset = frozenset()  # properties of the input ("exact multiple", "a tie"): see grade(tags=...)
    unit: str | None = None  # what the items of a list result are called in the report ("step", "operation")
    fields: tuple[str, ...] | None = None  # names of the items of a tuple result ("keys", "num_cached_tokens")
    depth: int | None = None  # how deep the report looks for the first difference (1: a step's list as a whole)
    data: Any = None  # the case's input, for an exercise's own diagnosis (a scheduler's script)


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


def call_with_time_limit(fn: Callable[..., Any], *args: Any, seconds: float | None = None,
                         steps: list[int] | None = None, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, stopped with `CodeTimeout` if code outside the package is still running
    after `seconds` (default `TIME_LIMIT_S`). Works in any thread, on every OS. With `steps` (a
    one-item list), every line, opcode, call and return the learner's code runs is counted into
    `steps[0]`: the operation count behind the complexity checks (`inflight.exercises.complexity`)."""
    seconds = TIME_LIMIT_S if seconds is None else seconds
    deadline = time.monotonic() + seconds
    clock = time.monotonic
    entry = sys._getframe()  # the stack above this frame is the grader's, not the learner's

    def line(frame, event, arg):  # in the learner's frames: every line, opcode, call and return
        if steps is not None:
            steps[0] += 1
        if clock() > deadline:
            raise CodeTimeout(_learner_function(frame, entry), seconds)
        return line

    def call(frame, event, arg):  # every new frame; the package's own are not traced line by line
        if clock() > deadline:
            raise CodeTimeout(_learner_function(frame, entry), seconds)
        if frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            return None
        if steps is not None:
            steps[0] += 1
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
    """Stands for "the implementation raised" so that exceptions compare like results; keeps the
    learner's line that raised it (the last frame outside the package) for the diagnosis."""

    def __init__(self, exc: BaseException):
        self.type = type(exc).__name__
        self.message = str(exc)
        self.where = _learner_line(exc)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Raised) and other.type == self.type

    def __repr__(self) -> str:
        return f"raised {self.type}: {self.message}"


class _Flawed:
    """Stands for "a case's own check found what is wrong" (`answers.Flaw`)."""

    def __init__(self, flaw: Flaw):
        self.flaw = flaw

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Flawed) and (other.flaw.name, other.flaw.shown) == (self.flaw.name, self.flaw.shown)

    def __repr__(self) -> str:
        return self.flaw.shown


def _learner_line(exc: BaseException) -> str | None:
    """"line 7 of your cell, in allocate(): `return self.free_list[n]`" — where the learner's code raised."""
    try:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_PACKAGE_DIR)]
    except Exception:
        return None
    if not frames:
        return None
    f = frames[-1]
    text = (f.line or "").strip()
    where = f"line {f.lineno}" + (f", in {f.name}()" if not f.name.startswith("<") else "")
    return where + (f": `{text}`" if text else "")


def _outcome(case: Case, impl: Any) -> Any:
    """What the learner's `impl` gives on `case` (under the time limit): a result, `_Raised`,
    `_Flawed` or `_TimedOut`."""
    try:
        return call_with_time_limit(case.run, impl)
    except NotImplementedError:
        raise
    except CodeTimeout as stop:
        return _TimedOut(stop)
    except Flaw as flaw:
        return _Flawed(flaw)
    except (Exception, SystemExit) as exc:  # the learner's bug (even a sys.exit()) is data here, not a crash of the notebook
        return _Raised(exc)


def _same(a: Any, b: Any, *, hang: bool = False) -> bool:
    """`same_values(a, b)` for results that may hold the learner's objects (a numpy array, a class of
    their own): their `__eq__` and `__bool__` run under the time limit, and a comparison that raises
    or gives no plain truth value (an array's ambiguous one) counts as "not equal". One that hangs
    raises `CodeTimeout` (the grader reports it and stops), or with `hang=True` is "not equal" too."""
    try:
        return call_with_time_limit(lambda: bool(same_values(a, b)))
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
    n_passed = 0
    failures: list[tuple[Case, Any, Any]] = []
    mine: dict[str, Any] = {}
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
            mine[case.name] = got
            if same:
                n_passed += 1
            else:
                failures.append((case, expected, got))
    except NotImplementedError:
        result = GradeResult(exercise, False, 0, len(cases), not_implemented=True,
                             report=f"⏳ {exercise}: not implemented yet — fill in the cell above and run this check again.")
        if not quiet:
            print(result.report)
        return result

    if not failures:
        result = GradeResult(exercise, True, n_passed, len(cases),
                             report=f"✅ {exercise}: all {len(cases)} cases passed.")
        if not quiet:
            print(result.report)
        return result

    found = choose(candidate, reference, cases, mistakes, failures, mine, diagnose, explain)
    found = found or find_pattern(cases, failures, tags or {}, factors or {}, _short, fields)
    shown = found.case if found and found.case is not None else failures[0][0]
    case, expected, got = next(f for f in failures if f[0] is shown)
    label = "First failing case" if case is failures[0][0] else "Failing case"
    lines = [f"❌ {exercise}: {n_passed}/{len(cases)} cases passed.",
             f"   {label}: {case.name}" + (f" — {case.describe}" if case.describe else "")]
    lines += difference_lines(expected, got, _short, unit=case.unit, fields=case.fields, depth=case.depth,
                              same=_same_or_false)
    lines.append(found.line() if found else
                 "🤔 Not a mistake I know: no classic slip gives your answers on the failing cases. "
                 "Compare the first difference above with the rule in the text.")
    result = GradeResult(exercise, False, n_passed, len(cases), case.name, expected, got,
                         found.name if found else None, found.explanation if found else None,
                         report="\n".join(lines))
    if not quiet:
        print(result.report)
    return result


def _same_or_false(a: Any, b: Any) -> bool:
    return _same(a, b, hang=True)


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


def use_if_passed(result: GradeResult, mine: Any, reference: Any, what: str | None = None) -> Any:
    """Pick the learner's implementation if it passed, else the package's, and say which one runs on."""
    what = what or getattr(reference, "__name__", "implementation")
    if result:
        print(f"▶ The rest of this chapter uses YOUR {what}.")
        return mine
    print(f"▶ The rest of this chapter uses the package's reference {what} (yours didn't pass yet).")
    return reference


# The diagnosis (steps 1-5 of the module docstring) lives in its own module; it uses the outcome
# classes above, so it is imported last. Re-exported here: graders and tests import them from here.
from inflight.exercises.diagnosis import (MISTAKE_MIN_SHARE, Diagnosis, choose, find_pattern,  # noqa: E402
                                          recognise_mistake, repeat_case)
