"""Workload generators and the step simulator: seeded, honest about arrivals, metrics that add up."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inflight import ContinuousBatchScheduler, StaticBatchScheduler
from inflight.sim import workloads as W
from inflight.sim.schedulers import SkipAheadScheduler
from inflight.sim.simulate import compare, simulate


def test_generators_are_seeded_and_shaped():
    a, b = W.long_tailed(300, seed=4), W.long_tailed(300, seed=4)
    assert a == b and a != W.long_tailed(300, seed=5)
    outs = [r.output_len for r in a]
    assert min(outs) >= 1 and max(outs) <= 400
    assert sorted(outs)[150] < sum(outs) / len(outs)  # long tail: median below the mean
    assert [r.id for r in a] == sorted(r.id for r in a)  # zero-padded ids sort in arrival order
    u = W.uniform(200, seed=1, low=5, high=9)
    assert {r.output_len for r in u} <= set(range(5, 10))
    s = W.sharegpt_like(400, seed=0)
    mean_out = sum(r.output_len for r in s) / len(s)
    assert 150 < mean_out < 600 and all(4 <= r.prompt_len <= 2048 for r in s)
    assert {r.output_len for r in W.with_spread(50, mean=20, spread=0)} == {20}


def test_poisson_arrivals_sorted_with_the_right_rate():
    arr = W.poisson_arrivals(2000, rate=0.5, seed=3)
    assert arr == sorted(arr)
    assert 2000 / 0.5 * 0.9 < arr[-1] < 2000 / 0.5 * 1.1
    assert all(r.arrival == 0 for r in W.long_tailed(10))
    assert W.long_tailed(10, arrival_rate=1.0)[-1].arrival > 0


def test_kv_memory_cost_counts_blocks():
    reqs = W.kv_memory_cost([W.Request("a", 10, 7), W.Request("b", 16, 16)], block_size=16)
    assert [r.memory_cost for r in reqs] == [2, 2]
    with pytest.raises(ValueError):
        W.kv_memory_cost(reqs, block_size=0)


def test_bad_generator_input():
    with pytest.raises(ValueError):
        W.long_tailed(-1)
    with pytest.raises(ValueError):
        W.uniform(5, low=10, high=2)
    with pytest.raises(ValueError):
        W.with_spread(5, spread=-1)


def test_timeline_of_the_spec_example():
    wl = W.from_lengths([3, 1, 2])
    r = simulate(ContinuousBatchScheduler(2), wl)
    assert r.timeline == [["r0", "r1"], ["r0", "r2"], ["r0", "r2"]]  # r2 takes r1's slot
    assert r.steps == 3 and r.utilization == 1.0 and r.throughput == 2.0
    assert r.requests["r2"].waiting_steps == 1 and r.requests["r2"].completion_steps == 3
    s = simulate(StaticBatchScheduler(2), wl)
    assert s.timeline == [["r0", "r1"], ["r0", None], ["r0", None], ["r2", None], ["r2", None]]
    assert s.idle_slot_steps == 4 and s.wasted_slot_steps == 2  # r2 waited during steps 1-2
    assert s.utilization == pytest.approx(6 / 10)


def test_arrivals_are_honoured():
    wl = W.from_lengths([2, 2], arrivals=[0, 5])
    r = simulate(ContinuousBatchScheduler(2), wl)
    assert r.requests["r1"].first_step == 5 and r.requests["r1"].waiting_steps == 0
    assert r.steps == 7 and r.timeline[3] == [None, None] and r.wasted_slot_steps == 0


def test_deadlock_is_reported_not_looped():
    wl = W.from_lengths([2, 1, 1], memory_costs=[3, 20, 1])
    r = simulate(ContinuousBatchScheduler(3, max_memory=10), wl)
    assert r.deadlocked and r.unfinished == ["r1", "r2"] and r.steps == 2


def test_memory_trace_stays_under_budget():
    wl = W.kv_memory_cost(W.sharegpt_like(60, seed=2), block_size=16)
    r = simulate(ContinuousBatchScheduler(16, max_memory=200), wl)
    assert not r.deadlocked and max(r.memory) <= 200


def test_bad_scheduler_output_is_caught():
    class Liar:
        max_batch_size = 1

        def add_request(self, *a):
            pass

        def step(self):
            return ["nobody"]

    with pytest.raises(RuntimeError, match="unknown"):
        simulate(Liar(), W.from_lengths([1]))


def test_compare_runs_every_factory():
    res = compare({"static": lambda: StaticBatchScheduler(4), "continuous": lambda: ContinuousBatchScheduler(4)},
                  W.long_tailed(50, seed=1))
    assert res["continuous"].steps < res["static"].steps
    assert res["continuous"].total_tokens == res["static"].total_tokens == W.total_tokens(W.long_tailed(50, seed=1))
    assert set(res["static"].summary()) >= {"steps", "utilization", "throughput", "wasted_slot_steps"}


@settings(max_examples=80, deadline=None)
@given(lens=st.lists(st.integers(1, 12), min_size=1, max_size=30), gaps=st.lists(st.integers(0, 4), min_size=30, max_size=30),
       batch=st.integers(1, 6), which=st.sampled_from(["static", "continuous", "skip"]))
def test_simulation_accounting(lens, gaps, batch, which):
    arrivals, t = [], 0
    for g in gaps[: len(lens)]:
        t += g
        arrivals.append(t)
    wl = W.from_lengths(lens, arrivals=arrivals)
    sched = {"static": StaticBatchScheduler, "continuous": ContinuousBatchScheduler, "skip": SkipAheadScheduler}[which](batch)
    r = simulate(sched, wl)
    assert not r.deadlocked and r.total_tokens == sum(lens)
    assert r.busy_slot_steps + r.idle_slot_steps == r.steps * batch
    assert 0 <= r.wasted_slot_steps <= r.idle_slot_steps
    for req in wl:  # each request holds one slot for a contiguous run of exactly output_len steps
        st_ = r.requests[req.id]
        assert st_.first_step >= req.arrival
        assert st_.finish_step - st_.first_step + 1 == req.output_len
        slots = {row.index(req.id) for row in r.timeline[st_.first_step: st_.finish_step + 1]}
        assert len(slots) == 1
    if which == "continuous":
        assert r.wasted_slot_steps == 0  # continuous batching never idles a slot while someone waits


def test_plots_smoke():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from inflight.book import plots

    wl = W.long_tailed(20, seed=0, mean=10, max_len=60)
    runs = {"static": simulate(StaticBatchScheduler(4), wl), "continuous": simulate(ContinuousBatchScheduler(4), wl)}
    ax = plots.gantt(runs["static"])
    assert ax.get_xlim() == (0, runs["static"].steps) and len(ax.collections) == 3  # idle, wasted, busy
    plots.utilization_plot(runs)
    plots.memory_plot(runs)
    plt.close("all")


def test_short_chat_uniform_prompt_ranges_and_arrival_times():
    chat = W.short_chat(300, seed=2, prompt_range=(16, 64), mean_output=20, max_output=80)
    assert chat == W.short_chat(300, seed=2, prompt_range=(16, 64), mean_output=20, max_output=80)
    assert all(16 <= r.prompt_len <= 64 and 1 <= r.output_len <= 80 for r in chat)
    with pytest.raises(ValueError, match="prompt_range"):
        W.short_chat(3, prompt_range=(10, 5))
    # a prompt range for `uniform` leaves its output lengths as they were
    ranged = W.uniform(50, seed=1, low=5, high=9, prompt_len=(3, 7))
    assert [r.output_len for r in ranged] == [r.output_len for r in W.uniform(50, seed=1, low=5, high=9)]
    assert {r.prompt_len for r in ranged} <= set(range(3, 8))
    # the same seed gives the same pattern at every rate, stretched; steps are those times rounded down
    slow, fast = W.arrival_times(40, 0.5, seed=3), W.arrival_times(40, 2.0, seed=3)
    assert slow == pytest.approx([4 * t for t in fast])
    assert W.poisson_arrivals(40, 0.5, seed=3) == [int(t) for t in slow]
