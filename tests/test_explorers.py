"""The chapters' explorers show what the package's code did: chapter 5's pool is the engine's block
tables, slot for slot; chapter 6's steps are the engine's iterations in the order they ran;
chapters 7 and 9's percentiles and goodput are the load generator's; chapter 8's waits are the
priority scheduler's. And a live figure redrawn over its kept background is the figure drawn anew."""
from __future__ import annotations

import random

import matplotlib
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

matplotlib.use("Agg")

from inflight.bench.serve.client import RequestResult  # noqa: E402
from inflight.bench.serve.stats import calculate_metrics  # noqa: E402
from inflight.book import explore_aging, explore_load, explore_loop, explore_paged  # noqa: E402
from inflight.book.widgets import LiveFigure, check_redraw, nice_ceil  # noqa: E402
from inflight.engine.scheduler import STEP_ORDER  # noqa: E402
from inflight.exercises.engine_loop import measure_order, reference_step, step_from_order  # noqa: E402
from inflight.sim import kv_sim  # noqa: E402
from inflight.sim.workloads import Request, capped_exponential, poisson_arrivals  # noqa: E402


# -- the live figure ---------------------------------------------------------------------------

def _pixels(png: bytes) -> np.ndarray:
    import io

    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def test_a_redraw_over_the_kept_background_is_the_full_drawing():
    live = LiveFigure(4, 3)
    ax = live.fig.subplots()
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    line = live.move(ax.plot([1, 2], [1, 2], color="red")[0])
    draws = []
    canvas_draw = live.fig.canvas.draw
    live.fig.canvas.draw = lambda: (draws.append(1), canvas_draw())[1]
    live.png()
    line.set_data([1, 9], [9, 1])  # inside the axes: a moving artist is drawn over the spines, a fixed one under
    live.title.set_text("moved")
    blitted = _pixels(live.png())
    assert len(draws) == 1, "the fixed parts are drawn once while the key stays"
    fresh = LiveFigure(4, 3)
    fax = fresh.fig.subplots()
    fax.set_xlim(0, 10)
    fax.set_ylim(0, 10)
    fax.plot([1, 9], [9, 1], color="red")
    fresh.title.set_text("moved")
    assert np.array_equal(blitted, _pixels(fresh.png())), "the blitted picture differs from a full draw"
    ax.set_xlim(0, 20)
    live.png(key="wider")
    assert len(draws) == 2, "a new key draws everything anew"


@given(st.floats(min_value=1e-6, max_value=1e9, allow_nan=False))
def test_nice_ceil_is_a_little_above(x):
    y = nice_ceil(x)
    assert x <= y * (1 + 1e-9) and y <= x * 1.34
    assert nice_ceil(y) == pytest.approx(y)


# -- chapter 5: the pool -------------------------------------------------------------------------

def test_the_pool_picture_is_the_engines_block_tables():
    requests = explore_paged.workload(20)
    for layout in ("contiguous", 16, 4):
        run = explore_paged.run_pool(requests, layout)
        held = run.pools >= 2
        assert np.array_equal(held.sum(axis=1), run.tokens), "a coloured slot is a token in the cache"
        assert np.array_equal((run.pools >= 1).sum(axis=1), run.reserved), "pink + coloured = the blocks held"
        same = kv_sim.simulate_kv(requests, "paged" if layout != "contiguous" else "contiguous",
                                  block_size=layout if layout != "contiguous" else 16,
                                  max_len=explore_paged.MAX_LEN, pool_slots=explore_paged.POOL_SLOTS)
        assert run.steps == same.steps and np.array_equal(run.tokens, same.tokens)
        assert run.done[-1] == len(requests)
        # a request's unfilled tail is less than one block: the only waste paging leaves
        if layout != "contiguous":
            assert ((run.reserved - run.tokens) < run.unit * np.maximum(run.running, 1) + run.unit).all()


def test_pool_explorers_build_and_redraw():
    site = explore_paged.paged_site(explore_paged.workload(20), layouts=("contiguous", 16, 4), frames=4)
    assert site.views == 12 and site.nbytes < 60_000
    assert "redraws" in check_redraw(explore_paged.paged_live(explore_paged.workload(20), layouts=("contiguous", 8)))


# -- chapter 6: the loop ---------------------------------------------------------------------------

def test_the_loop_steps_are_the_engines_iterations():
    run = explore_loop.run_loop(reference_step)
    measured = measure_order(reference_step)
    assert len(run.steps) == measured["steps"]
    assert sum(len(s.preempted) for s in run.steps) == measured["preemptions"]
    assert all([name for name, _, _ in s.said] == list(STEP_ORDER) for s in run.steps)
    assert all(0 <= s.blocks_held <= run.num_blocks for s in run.steps)
    # the last iteration decodes the last tokens: every request is done or finishing in it
    assert set(run.steps[-1].states) <= {explore_loop.DONE, explore_loop.DECODE}
    assert measured["finished"] == len(run.requests)
    wrong = ("decode", "reap", "budget", "admit", "preempt")
    assert [n for n, _, _ in explore_loop.run_loop(step_from_order(wrong)).steps[0].said] == list(wrong)


def test_the_loop_says_what_each_step_did():
    first = explore_loop.run_loop(reference_step).steps[0]
    said = {name: (words, acted) for name, words, acted in first.said}
    assert said["reap"] == ("nobody finished", False)  # step 0: nobody has run yet
    assert said["admit"][1] and "join" in said["admit"][0]
    assert said["decode"][1] and "prefill" in said["decode"][0]


def test_loop_explorers_build_and_redraw():
    site = explore_loop.loop_site()
    assert site.views == len(explore_loop.run_loop().steps)
    assert all(not f["data"][2] for f in site.figure["frames"]), "the timeline is drawn once; a view moves the curtain"
    live = explore_loop.loop_live({"right": reference_step, "budget first": step_from_order(
        ("budget", "reap", "admit", "preempt", "decode"))})
    assert "redraws" in check_redraw(live)


# -- chapters 7 and 9: the load ---------------------------------------------------------------

def _run(rate: float, n: int, seed: int) -> tuple[dict, list[RequestResult]]:
    rng = random.Random(seed)
    results = []
    for i in range(n):
        out = rng.randint(1, 20)
        itl = [rng.uniform(0.005, 0.08) for _ in range(out - 1)]
        ttft = rng.uniform(0.01, 0.5)
        results.append(RequestResult(success=i % 7 != 3, output_len=out, ttft=ttft, itl=itl,
                                     latency=ttft + sum(itl), start_time=100 + i / rate,
                                     error="" if i % 7 != 3 else "boom"))
    m = calculate_metrics(results, duration=n / rate, slos={"ttft": 250, "tpot": 50})
    return {"rate": rate, **m}, results


def test_load_percentiles_and_goodput_are_the_load_generators():
    row, results = _run(4.0, 40, 0)
    p = explore_load.percentiles(row)
    assert p["ttft", 50] == pytest.approx(row["median_ttft_ms"])
    assert p["ttft", 99] == pytest.approx(row["p99_ttft_ms"])
    assert p["itl", 99] == pytest.approx(row["p99_itl_ms"])
    r = explore_load.requests_of(row, {"ttft": 250, "tpot": 50})
    assert r["good"].sum() == pytest.approx(row["request_goodput"] * 10)  # good requests over 10 s
    assert not r["ok"][3] and not r["good"][3]  # a failed request is never good
    assert (np.diff(r["arrival"]) >= 0).all() and r["arrival"][0] == 0


def test_load_explorers_build_and_redraw():
    rows = [_run(rate, 16, k)[0] for k, rate in enumerate((2.0, 8.0, 32.0))]
    site = explore_load.load_site(rows, slo={"ttft": 250, "tpot": 50})
    assert site.views == 3
    assert "redraws" in check_redraw(explore_load.load_live(rows))


# -- chapter 8: aging ------------------------------------------------------------------------

def _priority_workload():
    rng = random.Random(8)
    workload, prio = [], {}
    for i, a in enumerate(poisson_arrivals(120, 0.45, seed=8)):
        workload.append(Request(f"r{i:03d}", 16, capped_exponential(rng, 16, 100), a))
        prio[f"r{i:03d}"] = 1 if rng.random() < 0.3 else 0
    return workload, prio


def test_aging_trades_the_low_classs_tail_for_the_high_ones():
    workload, prio = _priority_workload()
    strict = explore_aging.tails(explore_aging.run(workload, prio, 8, explore_aging.STRICT), prio)
    fast = explore_aging.tails(explore_aging.run(workload, prio, 8, 5), prio)
    assert fast[1] < strict[1] and fast[0] >= strict[0]  # (high, low) p99 waits
    site = explore_aging.aging_site(workload, prio, 8)
    assert site.views == len(explore_aging.AGINGS)
    assert "redraws" in check_redraw(explore_aging.aging_live(workload, prio, 8, agings=("strict", 40, 5)))
