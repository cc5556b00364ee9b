"""The fleet in time (`inflight.sim.fleet_sim`, torch-free): the fits recover the coefficients that made
their data, the simulation is deterministic for a seed, more replicas at the same load queue no more,
and routing by prefix or session keeps more of the prompts cached than round robin on shared prefixes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from inflight.sim.fleet import ROUTING_POLICIES
from inflight.sim.fleet_sim import ServiceModel, fit_decode, fit_prefill, session_prompt_tokens, simulate_fleet

SVC = ServiceModel(prefill_base_s=0.004, prefill_s_per_token=3e-4, step_base_s=0.003, step_s_per_seq=2e-4)
ROOT = Path(__file__).resolve().parents[1]


def test_session_prompts_resend_the_history():
    assert session_prompt_tokens(160, 32, 16, 3) == [192, 240, 288]


def test_fit_prefill_recovers_the_line_that_made_the_ttfts():
    settings = {"system_len": 160, "question_len": 32, "output_len": 16, "turns": 4}
    mean_prompt = sum(session_prompt_tokens(160, 32, 16, 4)) / 4
    run = {"settings": settings, "policies": [
        {"policy": p, "hit_rate": h, "p50_ttft_ms": 1e3 * (0.004 + 3e-4 * mean_prompt * (1 - h))}
        for p, h in zip(ROUTING_POLICIES, (0.3, 0.4, 0.6, 0.7))]}
    f = fit_prefill(run)
    assert f["prefill_base_s"] == pytest.approx(0.004, rel=1e-6)
    assert f["prefill_s_per_token"] == pytest.approx(3e-4, rel=1e-6)
    assert f["mean_prompt_tokens"] == mean_prompt


def test_fit_prefill_on_the_committed_run_is_positive_and_close():
    run = json.loads((ROOT / "results" / "fleet_cpu.json").read_text())
    f = fit_prefill(run)
    assert f["prefill_s_per_token"] > 0 and f["prefill_base_s"] >= 0
    for p in f["points"]:  # a line through four points: each within a factor of two of its measurement
        assert 0.5 < p["fitted_s"] / p["p50_ttft_s"] < 2


def test_fit_decode_by_littles_law():
    rows = []
    for batch in (1.0, 4.0, 8.0):
        step = 0.003 + 2e-4 * batch
        rows.append({"request_throughput": batch / (16 * step), "median_tpot_ms": step * 1e3})
    d = fit_decode(rows, output_len=16)
    assert d["step_base_s"] == pytest.approx(0.003, rel=1e-6)
    assert d["step_s_per_seq"] == pytest.approx(2e-4, rel=1e-6)
    one = fit_decode(rows[:1], output_len=16)  # one row: the whole step is the base
    assert one["step_s_per_seq"] == 0 and one["step_base_s"] == pytest.approx(0.0032)
    flat = fit_decode([{"request_throughput": 10, "p50_tpot_ms": 5}, {"request_throughput": 100, "p50_tpot_ms": 4}], 16)
    assert flat["step_s_per_seq"] == 0  # a step that got faster with the batch is no slope


@pytest.mark.parametrize("policy", ROUTING_POLICIES)
def test_deterministic_for_a_seed(policy):
    a = simulate_fleet(policy, 8, SVC, num_sessions=200, seed=3)
    assert a == simulate_fleet(policy, 8, SVC, num_sessions=200, seed=3)
    assert a["requests"] == 800 and sum(a["served"]) == 800
    assert 0 <= a["hit_rate"] <= 1 and 0 < a["p50_ttft_s"] <= a["p99_ttft_s"]


@pytest.mark.parametrize("policy", ("round_robin", "power_of_two", "consistent_hash"))
def test_more_replicas_at_the_same_load_queue_no_more(policy):
    waits = [simulate_fleet(policy, n, SVC, num_sessions=300, session_rate=20.0, seed=1)["mean_wait_s"]
             for n in (2, 4, 8, 16)]
    assert all(b <= a + 1e-12 for a, b in zip(waits, waits[1:])), waits


@pytest.mark.parametrize("replicas", (4, 32, 256))
def test_sticky_policies_keep_more_cached_on_shared_prefixes(replicas):
    res = {p: simulate_fleet(p, replicas, SVC, num_sessions=4 * replicas, cache_blocks=200, seed=0)
           for p in ROUTING_POLICIES}
    for sticky in ("cache_aware", "consistent_hash"):
        assert res[sticky]["hit_rate"] >= res["round_robin"]["hit_rate"]
    assert res["round_robin"]["load_spread_max_over_mean"] == pytest.approx(1.0, abs=0.01)


def test_a_bigger_cache_hits_no_less_and_a_bad_policy_is_refused():
    small, big = (simulate_fleet("consistent_hash", 8, SVC, num_sessions=200, cache_blocks=c)["hit_rate"]
                  for c in (24, 400))
    assert big >= small
    with pytest.raises(ValueError):
        simulate_fleet("random_walk", 2, SVC)


def test_at_the_real_fleets_size_it_reproduces_the_committed_run():
    # chapter 11's check, with the decode step taken flat at the run's own median TPOT (the chapter fits
    # it from a live sweep): hit rates within 0.15 of the measured ones, round robin's median TTFT the worst
    run = json.loads((ROOT / "results" / "fleet_cpu.json").read_text())
    st, pre = run["settings"], fit_prefill(run)
    tpot = run["policies"][0]["p50_tpot_ms"] / 1e3
    svc = ServiceModel(pre["prefill_base_s"], pre["prefill_s_per_token"], tpot, 0.0)
    sim = {}
    for r in run["policies"]:
        runs = [simulate_fleet(r["policy"], st["replicas"], svc, num_sessions=st["sessions"], session_rate=st["session_rate"],
                               turns=st["turns"], num_system_prompts=st["system_prompts"], system_len=st["system_len"],
                               question_len=st["question_len"], output_len=st["output_len"], cache_blocks=st["num_blocks"],
                               seed=k) for k in range(10)]
        sim[r["policy"]] = {k: sum(x[k] for x in runs) / len(runs) for k in ("hit_rate", "p50_ttft_s")}
        assert abs(sim[r["policy"]]["hit_rate"] - r["hit_rate"]) <= 0.15, (r["policy"], sim[r["policy"]], r["hit_rate"])
    for sticky in ("cache_aware", "consistent_hash"):
        assert sim["round_robin"]["p50_ttft_s"] > sim[sticky]["p50_ttft_s"]
