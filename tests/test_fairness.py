"""Priorities and fairness: the sort key, the preemption victim, priority admission, aging's bound on
waiting, and (hypothesis) that with equal priorities the priority scheduler IS chapter 4's FIFO."""
import pytest
from hypothesis import given, settings, strategies as st

from inflight.engine.priority import check_aging, choose_victim, priority_key
from inflight.sim.schedulers import PriorityScheduler
from inflight.stats import percentile
from inflight.sim.schedulers import ContinuousBatchScheduler
from inflight.sim.simulate import simulate
from inflight.sim.workloads import Request


def test_priority_key_lower_value_first_then_arrival():
    keys = [priority_key(1, 0.0, 0), priority_key(0, 5.0, 1), priority_key(0, 2.0, 2), priority_key(0, 2.0, 3)]
    assert sorted(range(4), key=lambda i: keys[i]) == [2, 3, 1, 0]


def test_aging_is_a_virtual_deadline():
    # priority 2 arriving at 0 with aging 10 ties a priority-0 request arriving at 20: served before later ones
    low = priority_key(2, 0.0, 0, aging=10)
    assert priority_key(0, 19.0, 1, aging=10) < low < priority_key(0, 21.0, 2, aging=10)
    # equal priorities: aging changes nothing (plain arrival order)
    assert sorted([priority_key(3, t, i, aging=5) for i, t in enumerate([4.0, 1.0, 2.0])]) == \
        [priority_key(3, t, i, aging=5) for i, t in [(1, 1.0), (2, 2.0), (0, 4.0)]]


def test_check_aging():
    assert check_aging(None) is None and check_aging(3) == 3.0
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="aging"):
            check_aging(bad)
    with pytest.raises(TypeError, match="aging"):
        check_aging("10")


@pytest.mark.parametrize("running, victim", [
    ([("a", 0, 1.0), ("b", 1, 0.0), ("c", 0, 2.0)], "b"),       # lowest priority, though earliest
    ([("a", 0, 1.0), ("b", 0, 3.0), ("c", 0, 2.0)], "b"),       # equal priority: latest arrival
    ([("a", 2, 1.0), ("b", 2, 3.0), ("c", 0, 9.0)], "b"),
    ([("x", 5, 1.0)], "x"),
    ([("a", 1, 1.0), ("b", 1, 1.0)], "b"),                      # full tie: the later submission
])
def test_choose_victim(running, victim):
    assert choose_victim(running) == victim


def test_choose_victim_empty():
    with pytest.raises(ValueError, match="at least one"):
        choose_victim([])


def test_percentile_matches_numpy_default():
    np = pytest.importorskip("numpy")
    xs = [5, 1, 9, 3, 7, 2]
    for q in (0, 50, 90, 99, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert percentile([], 50) != percentile([], 50)  # NaN


def test_priority_admission_order():
    s = PriorityScheduler(max_batch_size=1)
    s.add_request("late-low", 1, priority=3)
    s.add_request("high", 1, priority=0)
    s.add_request("mid", 1, priority=1)
    s.add_request("high2", 1, priority=0)
    order = [s.step()[0] for _ in range(4)]
    assert order == ["high", "high2", "mid", "late-low"]


def test_priorities_mapping_for_simulate():
    wl = [Request("lo", 1, 3, 0), Request("hi", 1, 3, 0)]
    res = simulate(PriorityScheduler(1, priorities={"hi": 0, "lo": 1}), wl)
    assert res.requests["hi"].first_step == 0 and res.requests["lo"].first_step == 3
    with pytest.raises(TypeError, match="priority"):
        PriorityScheduler(1).add_request("x", 1, priority="high")


def _stream(n_high, out_len, low_arrival):
    """One high-priority (0) request per step for n_high steps, plus one low-priority (1) request."""
    wl = [Request(f"h{i:03d}", 1, out_len, i) for i in range(n_high)]
    wl.append(Request("low", 1, out_len, low_arrival))
    return wl, {r.id: (1 if r.id == "low" else 0) for r in wl}


def test_strict_priorities_starve_and_aging_bounds_the_wait():
    wl, prio = _stream(n_high=150, out_len=2, low_arrival=5)  # arrivals twice as fast as one slot serves
    strict = simulate(PriorityScheduler(1, priorities=prio), wl)
    assert strict.requests["low"].first_step > 2 * 150 - 5, "without a guard the low request waits for the whole stream"
    for aging in (5, 10, 20):
        aged = simulate(PriorityScheduler(1, aging=aging, priorities=prio), wl)
        wait = aged.requests["low"].waiting_steps
        # overtaken only by requests that arrived up to `gap * aging` steps after it (and those before it)
        ahead = sum(1 for r in wl if r.id != "low" and r.arrival <= 5 + 1 * aging)
        assert wait <= ahead * 2, (aging, wait)
        assert wait < strict.requests["low"].waiting_steps


_wl = st.lists(st.tuples(st.integers(1, 6), st.integers(0, 8), st.sampled_from([1, 2, 3])), min_size=1, max_size=12)


@given(_wl, st.integers(1, 3), st.sampled_from([None, 4]), st.sampled_from([None, 1.0, 7.5]), st.integers(0, 3))
@settings(max_examples=80, deadline=None)
def test_equal_priorities_is_chapter4_fifo(spec, slots, max_memory, aging, prio):
    wl = [Request(f"r{i:02d}", 1, n, a, cost) for i, (n, a, cost) in enumerate(sorted(spec, key=lambda x: x[1]))]
    if max_memory is not None:
        wl = [r for r in wl if r.memory_cost <= max_memory]
    fifo = simulate(ContinuousBatchScheduler(slots, max_memory), wl)
    pri = simulate(PriorityScheduler(slots, max_memory, aging=aging, priorities={r.id: prio for r in wl}), wl)
    assert pri.timeline == fifo.timeline


# -- the engine: priorities from SamplingParams or add_request, aging, victims ---------------------

from inflight.engine.llm_engine import LLMEngine  # noqa: E402
from inflight.engine.sampling import SamplingParams  # noqa: E402



def _admission_order(engine):
    order = []
    while engine.has_unfinished_requests():
        order += [o.request_id for o in engine.step() if len(o.token_ids) == 1]
    return order


@pytest.mark.parametrize("aging, expected", [
    (None, ["h1", "h2", "h3", "h4", "low"]),      # strict: the low request waits for every high one
    (1.0, ["h1", "h2", "low", "h3", "h4"]),       # aged: overtaken only by requests arriving < 1 s after it
    (3.0, ["h1", "h2", "h3", "h4", "low"]),
])
def test_engine_admission_order_with_and_without_aging(model, aging, expected):
    engine = LLMEngine(model, block_size=4, num_blocks=40, max_batch_size=1, priority_aging=aging, debug=True)
    sp = SamplingParams(max_tokens=2, ignore_eos=True)
    engine.add_request([1, 2, 3], sp, request_id="low", arrival_time=100.0, priority=1)
    for i, t in enumerate([99.0, 100.5, 101.5, 102.0], start=1):  # h2 arrives 0.5 s after low, h3 1.5 s after
        engine.add_request([4, 5, 6], SamplingParams(max_tokens=2, ignore_eos=True, priority=0),
                           request_id=f"h{i}", arrival_time=t)
    assert _admission_order(engine) == expected


def test_request_priority_overrides_sampling_params(model):
    engine = LLMEngine(model, block_size=4, num_blocks=40, max_batch_size=1, debug=True)
    sp = SamplingParams(max_tokens=1, ignore_eos=True, priority=0)
    engine.add_request([1], sp, request_id="a", priority=5)
    engine.add_request([2], sp, request_id="b")
    assert _admission_order(engine) == ["b", "a"]
    with pytest.raises(TypeError, match="priority"):
        engine.add_request([3], sp, priority=1.5)
    with pytest.raises(ValueError, match="aging"):
        LLMEngine(model, block_size=4, num_blocks=40, priority_aging=0)


def test_engine_victim_matches_choose_victim(model):
    # three requests grow in a pool too small for all: every preemption takes the lowest priority, latest arrival
    engine = LLMEngine(model, block_size=2, num_blocks=12, max_batch_size=3, debug=True)
    spec = {"a": (1, 0.0), "b": (1, 1.0), "c": (0, 2.0)}
    for rid, (prio, t) in spec.items():
        engine.add_request([1, 2], SamplingParams(max_tokens=14, ignore_eos=True), request_id=rid, arrival_time=t,
                           priority=prio)
    victims = []
    while engine.has_unfinished_requests():
        running = [(s.request_id, s.priority, s.arrival_time) for s in engine.scheduler.running]
        engine.step()
        for s in engine.scheduler.events.preempted:
            victims.append(s.request_id)
            assert s.request_id == choose_victim([r for r in running if r[0] in
                                                  {x.request_id for x in engine.scheduler.running} | {s.request_id}])
    assert victims and set(victims) <= {"a", "b"} and victims[0] == "b"
