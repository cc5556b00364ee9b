"""What running one case gives: the learner's result, or a stand-in that compares and prints like
one — `_Raised` (it raised; it keeps the learner's line), `_Flawed` (a case's own check found the
problem: `answers.Flaw`), `_TimedOut` (it never returned) — and the `Case`, `Mistake` and
`Diagnosis` records the graders are made of. Comparing and printing the learner's objects runs
under the time limit too: their `__eq__` or `__repr__` may raise or loop."""
from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Callable

from inflight.exercises.answers import Flaw
from inflight.exercises.diff import same_values
from inflight.exercises.timelimit import PACKAGE_DIR, CodeTimeout, call_with_time_limit

__all__ = ["Case", "Mistake", "Diagnosis", "outcome", "same", "short"]


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
class Diagnosis:
    """What the report says is wrong: a title, the explanation, and the failing case it is about."""

    name: str
    explanation: str
    case: Case | None = None
    kind: str = "pattern"  # "type", "structure", "mistake", "flaw", "pattern"
    counts: tuple[int, int] = (0, 0)  # for a mistake: (failures it reproduces, failures)

    def line(self) -> str:
        if self.kind == "mistake":
            reproduced, failed = self.counts
            return (f"💡 This looks like a classic mistake — {self.name} (it gives your answer on {reproduced} of "
                    f"your {failed} failing cases): {self.explanation}")
        return f"💡 {self.name[:1].upper()}{self.name[1:]}: {self.explanation}"


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
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(PACKAGE_DIR)]
    except Exception:
        return None
    if not frames:
        return None
    f = frames[-1]
    text = (f.line or "").strip()
    where = f"line {f.lineno}" + (f", in {f.name}()" if not f.name.startswith("<") else "")
    return where + (f": `{text}`" if text else "")


def outcome(case: Case, impl: Any) -> Any:
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


def same(a: Any, b: Any, *, hang: bool = False) -> bool:
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


def short(value: Any, limit: int = 300) -> str:
    """`repr(value)`, cut to `limit`; a learner's `__repr__` that raises or hangs cannot break the report."""
    try:
        text = call_with_time_limit(repr, value)
    except (Exception, CodeTimeout):
        text = f"<a {type(value).__name__} whose repr() failed>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
