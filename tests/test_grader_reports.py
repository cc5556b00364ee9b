"""What every failure report must be (issue 23): it shows the first difference, never two lists cut
off before it; it has exactly one diagnosis line, which never contradicts itself; an answer of the
wrong type is named as such; a changed input, state kept across calls and a scan of the pool are
found by the shared machinery, whatever the exercise."""
from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from inflight.exercises import answers, complexity
from inflight.exercises.diff import difference_lines, first_difference, same_values, window
from inflight.exercises.grading import Case, Mistake, grade, repeat_case
from inflight.exercises.scheduling import check_continuous_scheduler


def _short(value, limit=300):
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- the first difference, windowed ------------------------------------------------------------------
def test_a_late_difference_in_a_long_list_is_shown_not_cut_off():
    expected = [[i, i + 1] for i in range(60)]
    got = [row[:] for row in expected]
    got[47] = [47, 99]
    lines = difference_lines(expected, got, _short, unit="step", depth=1)
    assert any("first difference at step 47: expected [47, 48], got [47, 99]" in line for line in lines), lines
    exp_line, got_line = lines[0], lines[1]
    assert "[47, 48]" in exp_line and "[47, 99]" in got_line  # the differing item is in the window
    assert "…45 equal…" in exp_line and "…10 more" in got_line  # what is left out is counted, not cut


def test_a_difference_inside_a_dict_is_named_by_its_keys():
    expected = {"ttft": {"a": 0.5, "b": 0.4}, "tpot": {"a": 0.1, "b": 0.3}, "throughput": 7.0}
    got = {"ttft": {"a": 0.5, "b": 0.4}, "tpot": {"a": 0.1, "b": 0.15}, "throughput": 7.0}
    assert first_difference(expected, got) == ["tpot", "b"]
    lines = difference_lines(expected, got, _short)
    assert "first difference at ['tpot']['b']: expected 0.3, got 0.15" in lines[-1]


def test_a_missing_item_and_a_kind_difference_are_said_in_words():
    lines = difference_lines([1, 2, 3], [1, 2], _short)
    assert "got nothing (yours ends before)" in lines[-1]
    lines = difference_lines(["a", 7], ["a", "7"], _short)
    assert "(an int expected, a str given)" in lines[-1]


def test_floats_compare_with_a_tolerance_and_nans_are_equal():
    assert same_values({"x": [0.1 + 0.2]}, {"x": [0.3]})
    assert same_values(float("nan"), float("nan"))
    assert not same_values(0.3, 0.31)
    assert not same_values([1, 2], (1, 2))


def test_window_keeps_short_values_whole():
    assert window([1, 2, 3], [1], _short) == "[1, 2, 3]"


# --- one diagnosis line, and never "not a mistake I know" beside a named one --------------------------
# (Every mutant test in test_graders_*.py and test_grader_contracts.py also asserts its report has
# exactly one 💡 line and no 🤔 one.)
def test_an_unknown_mistake_gets_one_line_that_says_so():
    cases = [Case(f"c{i}", lambda f, i=i: f(i)) for i in range(6)]
    result = grade("toy", lambda i: [7, 3, 9, 1, 4, 8][i], lambda i: i, cases, quiet=True)
    assert result.mistake is None
    lines = result.report.splitlines()
    assert [line for line in lines if line.startswith(("💡", "🤔"))] == [lines[-1]]
    assert lines[-1].startswith("🤔 Not a mistake I know")


def test_the_engine_loop_names_a_missing_step_once_as_the_diagnosis():
    from inflight.exercises.engine_loop import check_engine_loop

    def forgets_preempt(engine):
        engine.reap()
        engine.budget()
        engine.admit()
        engine.decode()

    result = check_engine_loop(forgets_preempt, quiet=True)
    assert result.mistake == "your step() never calls preempt"
    assert "Not a mistake I know" not in result.report and result.report.count("💡") == 1


# --- the machinery's findings --------------------------------------------------------------------------
def test_integer_answers_accept_numpy_and_refuse_floats_bools_and_text():
    assert answers.as_int(np.int64(3), "f()") == 3 and type(answers.as_int(np.int32(3), "f()")) is int
    for bad, words in [(2.0, "returned a float"), (True, "returned a bool"), ("2", "returned a str"),
                       (np.float64(2), "returned a numpy float64"), (None, "returned None")]:
        with pytest.raises(answers.Flaw) as info:
            answers.as_int(bad, "f()", "counts are ints")
        assert info.value.first and info.value.name == words


def test_list_answers_follow_what_their_consumer_takes():
    assert answers.as_list((x for x in [1, 2]), "f()", "ints") == [1, 2]  # a generator, read once
    assert answers.as_list(np.array([1, 2]), "f()", "ints", accept="sequence") == [1, 2]
    for bad, accept in [({1, 2}, "iterable"), ((x for x in [1]), "list or tuple"), ((1, 2), "list"), ("12", "iterable")]:
        with pytest.raises(answers.Flaw):
            answers.as_list(bad, "f()", "ints", accept=accept)


def test_a_changed_input_is_found_and_located():
    def pops(xs):
        xs.pop()
        return 1

    with pytest.raises(answers.Flaw) as info:
        answers.call_unchanged(pops, [[1, 2, 3]], ["positions"], "why.")
    assert info.value.name == "changed its input"
    with pytest.raises(answers.Flaw, match="reordered"):
        answers.call_unchanged(lambda xs: xs.sort(), [[3, 1, 2]], ["running"], "why.")
    assert answers.call_unchanged(lambda xs: sorted(xs), [[3, 1, 2]], ["running"], "why.") == [1, 2, 3]


def test_state_kept_across_calls_is_named():
    cases = [Case(f"c{i}", lambda f, i=i: f(i)) for i in range(5)]

    def running_total(x, seen=[]):  # noqa: B006 - the mutable default is the bug under test
        seen.append(x)
        return sum(seen)

    result = grade("toy", running_total, lambda x: x, cases + [repeat_case(cases)], quiet=True)
    assert not result and result.mistake == "state kept across calls", result.report


def test_a_mistake_that_fails_cases_the_learner_passes_is_not_named():
    cases = [Case(f"c{i}", lambda f, i=i: f(i)) for i in range(10)]
    learner = lambda i: 1 if i == 0 else 0  # noqa: E731 - fails c0 only
    broad = Mistake("broad", "fails everything", lambda i: 1)  # agrees on c0, wrong on 9 cases the learner passes
    assert grade("toy", learner, lambda i: 0, cases, [broad], quiet=True).mistake != "broad"


def test_patterns_constant_factor_and_offset():
    cases = [Case(f"c{i}", lambda f, i=i: f(i)) for i in range(1, 9)]
    factor = grade("toy", lambda i: 1000 * i, lambda i: i, cases, quiet=True, factors={1000.0: "milliseconds!"})
    assert factor.mistake == "your answer is 1000× the right one" and "milliseconds!" in factor.explanation
    offset = grade("toy", lambda i: i + 1, lambda i: i, cases, quiet=True)
    assert offset.mistake == "your answer is off by +1"


def test_a_raised_exception_is_traced_to_the_learners_line():
    cases = [Case(f"c{i}", lambda f, i=i: f(i)) for i in range(3)]

    def divides(i):
        return 10 // (i - i)

    result = grade("toy", divides, lambda i: i, cases, quiet=True)
    assert result.mistake == "your code raised ZeroDivisionError"
    assert "return 10 // (i - i)" in result.explanation and "in divides()" in result.explanation


def test_counting_containers_see_scans_that_run_in_c():
    meter = complexity.Meter()

    class Holder:
        def __init__(self):
            self.free = deque(range(100))
            self.refs = [0] * 100

    h = Holder()
    complexity.instrument(h, meter)
    meter.method = "allocate"
    sorted(h.free)
    _ = 50 in h.free
    h.refs.index(0)
    assert meter.counts[("allocate", "self.free", "iterated over")] == 100
    assert meter.counts[("allocate", "self.free", "searched with `in`")] == 100
    assert meter.counts[("allocate", "self.refs", "searched with .index()")] == 100
    assert isinstance(h.free, deque) and list(h.free) == list(range(100))  # same contents, same type family


def test_check_continuous_scheduler_reports_a_deep_difference_at_its_step():
    from inflight import ContinuousBatchScheduler

    class LateSlip(ContinuousBatchScheduler):  # right for 12 steps, then forgets to sort
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.n = 0

        def step(self):
            self.n += 1
            ids = super().step()
            return ids[::-1] if self.n > 12 and len(ids) > 1 else ids

    result = check_continuous_scheduler(LateSlip, quiet=True)
    assert not result and "first difference at step 13: expected ['q0', 'y2'], got ['y2', 'q0']" in result.report
    assert "…11 equal…" in result.report and "not sorted" in result.report
