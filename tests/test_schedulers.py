"""The schedulers of Part I: the spec's examples, input checks, and properties over random workloads."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inflight import ContinuousBatchScheduler, StaticBatchScheduler
from inflight.sim.schedulers import SkipAheadScheduler


def run(sched, reqs, steps=None):
    for r in reqs:
        sched.add_request(*r)
    steps = steps if steps is not None else sum(r[1] for r in reqs) + 1
    return [sched.step() for _ in range(steps)]


# --- the spec's worked examples --------------------------------------------------------------------
def test_spec_example_continuous():
    s = ContinuousBatchScheduler(max_batch_size=2)
    s.add_request("A", 3)
    s.add_request("B", 1)
    s.add_request("C", 2)
    assert s.step() == ["A", "B"]
    assert s.step() == ["A", "C"]  # C takes B's slot the step after B finished
    assert s.step() == ["A", "C"]
    assert s.step() == []
    assert not s.has_unfinished()


def test_spec_example_memory():
    s = ContinuousBatchScheduler(max_batch_size=5, max_memory=10)
    s.add_request("A", num_tokens=3, memory_cost=8)
    s.add_request("B", num_tokens=3, memory_cost=8)
    assert s.step() == ["A"]  # a slot is free, memory is not
    assert s.waiting == ["B"] and s.active_memory == 8
    assert [s.step() for _ in range(6)] == [["A"], ["A"], ["B"], ["B"], ["B"], []]


def test_static_waits_for_the_whole_batch():
    out = run(StaticBatchScheduler(2), [("A", 3), ("B", 1), ("C", 2)], 6)
    assert out == [["A", "B"], ["A"], ["A"], ["C"], ["C"], []]


def test_admission_before_processing_and_slot_freed_next_step():
    s = ContinuousBatchScheduler(1)
    s.add_request("x", 1)
    s.add_request("y", 1)
    assert s.step() == ["x"]  # admitted and processed in the same step
    assert s.active == {} and s.waiting == ["y"]  # x's slot frees after the step, y waits for the next
    assert s.step() == ["y"]


def test_strict_fifo_no_skip_ahead_and_skip_ahead_variant():
    reqs = [("a", 3, 6), ("b", 2, 6), ("c", 1, 2)]
    assert run(ContinuousBatchScheduler(4, 10), reqs, 6) == [["a"], ["a"], ["a"], ["b", "c"], ["b"], []]
    assert run(SkipAheadScheduler(4, 10), reqs, 5) == [["a", "c"], ["a"], ["a"], ["b"], ["b"]]


def test_exact_fit_and_release():
    assert run(ContinuousBatchScheduler(3, 10), [("a", 1, 4), ("b", 2, 6), ("c", 1, 4)], 3) == [["a", "b"], ["b", "c"], []]


def test_request_that_never_fits_blocks_the_queue_without_crashing():
    s = ContinuousBatchScheduler(3, max_memory=10)
    s.add_request("a", 1, 2)
    s.add_request("huge", 1, 11)  # accepted, as the spec says
    s.add_request("b", 1, 1)
    assert s.step() == ["a"]
    assert s.is_blocked()
    assert [s.step() for _ in range(5)] == [[]] * 5
    assert s.waiting == ["huge", "b"] and s.has_unfinished()


def test_defaults_are_slot_only():
    reqs = [("r%d" % i, n) for i, n in enumerate([5, 1, 3, 2, 8, 1, 1, 4])]
    plain = run(ContinuousBatchScheduler(3), reqs)
    unlimited = run(ContinuousBatchScheduler(3, max_memory=None), [r + (1000,) for r in reqs])
    assert plain == unlimited


def test_introspection_views_are_copies():
    s = ContinuousBatchScheduler(2)
    s.add_request("a", 2)
    s.add_request("b", 2)
    s.add_request("c", 2)
    s.step()
    assert s.active == {"a": 1, "b": 1} and s.waiting == ["c"]
    s.active["a"] = 99
    s.waiting.clear()
    assert s.active == {"a": 1, "b": 1} and s.waiting == ["c"]
    assert "ContinuousBatchScheduler" in repr(s)


def test_finished_id_may_be_reused():
    s = ContinuousBatchScheduler(1)
    s.add_request("a", 1)
    s.step()
    s.add_request("a", 1)
    assert s.step() == ["a"]


# --- bad input -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [ContinuousBatchScheduler, StaticBatchScheduler])
def test_duplicate_id_rejected(cls):
    s = cls(2)
    s.add_request("a", 2)
    with pytest.raises(ValueError, match="duplicate"):
        s.add_request("a", 3)
    s.step()  # now running
    with pytest.raises(ValueError, match="duplicate"):
        s.add_request("a", 1)


@pytest.mark.parametrize("cls", [ContinuousBatchScheduler, StaticBatchScheduler])
@pytest.mark.parametrize("bad,exc", [(0, ValueError), (-3, ValueError), (2.5, TypeError), ("4", TypeError), (True, TypeError)])
def test_bad_num_tokens_and_batch_size(cls, bad, exc):
    with pytest.raises(exc, match="max_batch_size"):
        cls(bad)
    with pytest.raises(exc, match="num_tokens"):
        cls(2).add_request("a", bad)


@pytest.mark.parametrize("bad,exc", [(0, ValueError), (-1, ValueError), (math.nan, ValueError), ("3", TypeError), (None, TypeError)])
def test_bad_memory_cost_and_budget(bad, exc):
    with pytest.raises(exc, match="memory_cost"):
        ContinuousBatchScheduler(2).add_request("a", 1, bad)
    if bad is not None:
        with pytest.raises(exc, match="max_memory"):
            ContinuousBatchScheduler(2, max_memory=bad)


def test_unhashable_id_rejected():
    with pytest.raises(TypeError, match="hashable"):
        ContinuousBatchScheduler(2).add_request(["a"], 1)


# --- properties over random workloads --------------------------------------------------------------------
workloads = st.lists(
    st.tuples(st.integers(1, 8), st.integers(1, 5), st.integers(0, 3)),  # tokens, memory cost, arrival gap
    min_size=0, max_size=25)


def drive(sched, wl, max_steps=2000):
    """Feed (tokens, cost, gap) requests with arrival gaps; return each step's processed ids."""
    arrivals, t = [], 0
    for i, (_, _, gap) in enumerate(wl):
        t += gap
        arrivals.append(t)
    out, nxt, step = [], 0, 0
    while step < max_steps and (nxt < len(wl) or sched.has_unfinished()):
        while nxt < len(wl) and arrivals[nxt] <= step:
            sched.add_request(nxt, wl[nxt][0], wl[nxt][1])
            nxt += 1
        out.append(sched.step())
        step += 1
    return out


def check_invariants(out, wl, batch, budget=None):
    counts = {}
    first = {}
    for t, ids in enumerate(out):
        assert ids == sorted(ids)
        assert len(ids) <= batch
        if budget is not None:
            assert sum(wl[i][1] for i in ids) <= budget
        for i in ids:
            counts[i] = counts.get(i, 0) + 1
            first.setdefault(i, t)
    assert counts == {i: wl[i][0] for i in range(len(wl))}  # every request exactly num_tokens times
    starts = [first[i] for i in range(len(wl))]
    assert starts == sorted(starts)  # FIFO admission order


@settings(max_examples=150, deadline=None)
@given(wl=workloads, batch=st.integers(1, 5))
def test_properties_continuous_and_static(wl, batch):
    for cls in (ContinuousBatchScheduler, StaticBatchScheduler):
        check_invariants(drive(cls(batch), wl), wl, batch)


@settings(max_examples=150, deadline=None)
@given(wl=workloads, batch=st.integers(1, 5), budget=st.integers(5, 12))
def test_properties_memory_budget(wl, batch, budget):
    check_invariants(drive(ContinuousBatchScheduler(batch, max_memory=budget), wl), wl, batch, budget)


@settings(max_examples=150, deadline=None)
@given(wl=workloads, batch=st.integers(1, 5))
def test_continuous_never_slower_than_static(wl, batch):
    cont = drive(ContinuousBatchScheduler(batch), wl)
    static = drive(StaticBatchScheduler(batch), wl)
    assert len(cont) <= len(static)


@settings(max_examples=100, deadline=None)
@given(wl=workloads, batch=st.integers(1, 5), budget=st.integers(5, 12))
def test_skip_ahead_respects_budgets(wl, batch, budget):
    out = drive(SkipAheadScheduler(batch, max_memory=budget), wl)
    for ids in out:
        assert len(ids) <= batch and sum(wl[i][1] for i in ids) <= budget
    assert sum(map(len, out)) == sum(w[0] for w in wl)


@settings(max_examples=100, deadline=None)
@given(wl=workloads, batch=st.integers(1, 4), budget=st.integers(1, 6))
def test_oversized_requests_never_crash_and_never_break_the_budget(wl, batch, budget):
    s = ContinuousBatchScheduler(batch, max_memory=budget)
    for i, (n, c, _) in enumerate(wl):
        s.add_request(i, n, c)
    for _ in range(sum(w[0] for w in wl) + 2):
        ids = s.step()
        assert sum(wl[i][1] for i in ids) <= budget
    # it stops exactly at the first request that can never fit (or finishes everything)
    blocked = next((i for i, w in enumerate(wl) if w[1] > budget), None)
    assert s.waiting == ([] if blocked is None else list(range(blocked, len(wl))))
