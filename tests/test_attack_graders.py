"""Graders survive whatever the learner's code returns or does: a one-line endless loop, results
whose `==` raises or never returns or is ambiguous (a numpy array), a `__repr__` that raises, and
`sys.exit()`. Each ends in a failed grade with a report — never an exception out of the check cell
and never a hang."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from inflight.exercises import grading
from inflight.exercises.scheduling import check_continuous_scheduler
from inflight.sim.schedulers import ContinuousBatchScheduler


@pytest.fixture(autouse=True)
def short_limit(monkeypatch):
    monkeypatch.setattr(grading, "TIME_LIMIT_S", 0.3)


class OneLineLoop(ContinuousBatchScheduler):
    def step(self):
        while self._waiting: pass  # noqa: E701 - one line: it runs no new line, only opcodes
        return super().step()


class EqRaises:
    __hash__ = None

    def __eq__(self, other):
        raise RuntimeError("eq boom")


class EqHangs:
    __hash__ = None

    def __eq__(self, other):
        while True: pass  # noqa: E701


class ReprRaises:
    def __repr__(self):
        raise RuntimeError("repr boom")


def returning(make):
    class Learner(ContinuousBatchScheduler):
        def step(self):
            return make(super().step())
    return Learner


class Exits(ContinuousBatchScheduler):
    def step(self):
        sys.exit("bye")


def test_a_loop_on_one_line_is_stopped():
    res = check_continuous_scheduler(OneLineLoop, quiet=True)
    assert not res and res.timed_out
    assert "step() did not return" in res.report


@pytest.mark.parametrize("make, shown", [
    (lambda ids: np.array(ids), "array("),            # `==` is elementwise: no plain truth value
    (lambda ids: [EqRaises()], "EqRaises object"),    # `==` raises
    (lambda ids: ReprRaises(), "whose repr() failed"),  # the report cannot print it
])
def test_results_that_do_not_compare_or_print_fail_with_a_report(make, shown):
    res = check_continuous_scheduler(returning(make), quiet=True)
    assert not res and not res.timed_out
    assert "0/37 cases passed" in res.report and shown in res.report


def test_a_result_whose_eq_never_returns_is_reported_as_a_hang():
    res = check_continuous_scheduler(returning(lambda ids: [EqHangs()]), quiet=True)
    assert not res and res.timed_out
    assert "__eq__() did not return" in res.report


def test_sys_exit_in_the_learners_code_is_a_failed_case():
    res = check_continuous_scheduler(Exits, quiet=True)
    assert not res and "raised SystemExit: bye" in res.report


def test_sys_exit_in_the_engine_loop_is_a_failed_grade():
    """check_engine_loop runs the learner's step() once more to show its call order: a sys.exit()
    there escaped the grader."""
    from inflight.exercises.engine_loop import check_engine_loop

    res = check_engine_loop(lambda engine: sys.exit(1), quiet=True)
    assert not res and "raised SystemExit" in res.report
