"""Stopping learner code that never returns, in any thread, on every OS.

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
from typing import Any, Callable

__all__ = ["TIME_LIMIT_S", "CodeTimeout", "call_with_time_limit", "PACKAGE_DIR"]

#: How long one case may run the learner's code before the grader stops it (seconds): graded
#: cases take milliseconds, so only code that never returns gets anywhere near it. (Setting
#: `inflight.exercises.grading.TIME_LIMIT_S` sets this one: tests shorten it there.)
TIME_LIMIT_S = 10.0

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../inflight


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
        if frame.f_code.co_filename.startswith(PACKAGE_DIR):
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
        if not code.co_filename.startswith(PACKAGE_DIR) and not name.startswith("<"):
            names.append(name)
        frame = frame.f_back
    if not names:
        return "your code"
    where = f" (stopped inside {names[0]}())" if names[0] != names[-1] else ""
    return f"your {names[-1]}(){where}"
