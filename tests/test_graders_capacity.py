"""Chapter 11's capacity-plan grader (`inflight.exercises.capacity`): the reference and a copy of its
rule pass, answers within the stated tolerance pass, every classic slip is named by name (the SLO's
percentile ignored among them), a slip is named only when the code behaves like it, a stub is "not
implemented", code that never returns is stopped, and a failed check falls back to the reference."""
from __future__ import annotations

import math

import pytest

from inflight.exercises import grading, use_if_passed
from inflight.exercises.capacity import (MISTAKES, REPLICA_TOLERANCE, _plan_variant, capacity_plan, cases,
                                         check_capacity_plan)
from inflight.sim.fleet import H100, LLAMA_70B, SLO, Load, plan


def test_the_reference_and_a_copy_of_its_rule_pass():
    assert check_capacity_plan(capacity_plan, quiet=True)
    assert check_capacity_plan(_plan_variant(), quiet=True)


def test_the_answer_is_the_books_plan():
    load, slo = Load(20, 1000, 200), SLO(1.0, 0.05, 0.99)
    p = plan(LLAMA_70B, H100, load, slo)
    assert capacity_plan(LLAMA_70B, H100, load, slo) == {"tp": p.tp, "replicas": p.replicas, "gpus": p.gpus}


def test_many_cases_and_every_slip_is_wrong_somewhere():
    cs = cases()
    assert len(cs) >= 40
    answers = [c.run(capacity_plan) for c in cs]
    assert None in answers  # a model that fits on no size
    for mistake in MISTAKES:
        assert any(c.run(mistake.impl) != a for c, a in zip(cs, answers)), mistake.name


def test_answers_within_the_tolerance_pass():
    def off_by_some(*a, **k):
        r = capacity_plan(*a, **k)
        if r is None:
            return None
        n = r["replicas"] + max(1, math.floor(REPLICA_TOLERANCE * r["replicas"]))
        return {"tp": r["tp"], "replicas": n, "gpus": n * r["tp"]}

    assert check_capacity_plan(off_by_some, quiet=True)

    def far_off(*a, **k):
        r = capacity_plan(*a, **k)
        return r and {"tp": r["tp"], "replicas": 2 * r["replicas"] + 2, "gpus": (2 * r["replicas"] + 2) * r["tp"]}

    res = check_capacity_plan(far_off, quiet=True)
    assert not res and res.mistake is None  # wrong, but like no slip the grader knows

    def wrong_gpus(*a, **k):
        r = capacity_plan(*a, **k)
        return r and {**r, "gpus": r["replicas"]}

    assert not check_capacity_plan(wrong_gpus, quiet=True)


@pytest.mark.parametrize("mistake", MISTAKES, ids=[m.name for m in MISTAKES])
def test_each_slip_is_named(mistake):
    res = check_capacity_plan(mistake.impl, quiet=True)
    assert not res and res.mistake == mistake.name, (res.mistake, res.report)
    assert mistake.name in res.report


def test_the_percentile_slip_is_the_one_the_issue_names():
    assert any(m.name == "the SLO's percentile ignored" for m in MISTAKES)
    res = check_capacity_plan(_plan_variant(wait="mean"), quiet=True)
    assert "p99" in res.report and "mean wait" in res.report


def test_stub_and_endless_loop(monkeypatch):
    def stub(*a, **k):
        raise NotImplementedError

    assert check_capacity_plan(stub, quiet=True).not_implemented
    monkeypatch.setattr(grading, "TIME_LIMIT_S", 0.3)

    def spin(m, g, load, slo, *rest):
        n = 1
        while n > 0:  # "add replicas until the SLO is met" with a condition that never changes
            n += 1

    res = check_capacity_plan(spin, quiet=True)
    assert not res and res.timed_out and "the rest were not run" in res.report


def test_a_failed_check_falls_back_to_the_reference(capsys):
    bad = _plan_variant(interference=False)
    res = check_capacity_plan(bad, quiet=True)
    assert use_if_passed(res, bad, capacity_plan, "capacity_plan") is capacity_plan
    assert use_if_passed(check_capacity_plan(capacity_plan, quiet=True), bad, capacity_plan) is bad
