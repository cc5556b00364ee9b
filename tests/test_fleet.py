"""Fleets: the capacity arithmetic and the routing simulation (`inflight.sim.fleet`, torch-free), and
the process helper (`inflight.bench.serve.fleet`): two real servers behind `vllm-router` on
loopback, a policy that spreads requests, a replica killed and seen down by the router, everything
stopped by its PID and nothing left running. Every wait is bounded; no timing is asserted."""
from __future__ import annotations

import math

import pytest

from inflight.sim.fleet import (GPU, H100, colocated_tpot, erlang_c, fleet_wait_quantile, LLAMA_70B, LLAMA_8B, ROUTING_POLICIES, SLO, Load, Model, kv_bytes_per_token,
                                max_batch, plan, plan_for_tp, replica_rate, replicas_from_curve, simulate_routing,
                                step_time)


def test_kv_bytes_per_token_of_llama_70b():
    assert kv_bytes_per_token(LLAMA_70B) == 2 * 80 * 8 * 128 * 2 == 327_680


def test_max_batch_is_the_memory_limit_at_the_peak_context():
    load, slo = Load(10, 1000, 200), SLO(5.0, 10.0)  # a TPOT so loose that memory decides
    b = max_batch(LLAMA_8B, H100, load, slo, tp=1)
    budget = 80e9 * 0.9 - LLAMA_8B.weight_bytes
    assert b == int(budget // (1200 * kv_bytes_per_token(LLAMA_8B)))
    assert max_batch(LLAMA_70B, H100, load, slo, tp=1) == 0  # 141 GB of weights on one 80 GB GPU
    assert max_batch(LLAMA_70B, H100, load, slo, tp=2) > 0


def test_max_batch_meets_the_tpot_slo():
    load = Load(10, 1000, 200)
    for tpot in (0.01, 0.02, 0.05):
        b = max_batch(LLAMA_8B, H100, load, SLO(5.0, tpot))
        if b:
            assert step_time(LLAMA_8B, H100, b, 1100) <= tpot
            assert b == max_batch(LLAMA_8B, H100, load, SLO(5.0, 10.0)) or \
                step_time(LLAMA_8B, H100, b + 1, 1100) > tpot


def test_replica_rate_meets_ttft_at_the_percentile_and_tighter_percentiles_cost_replicas():
    load = Load(20, 1000, 200)
    loose = replica_rate(LLAMA_70B, H100, load, SLO(1.0, 0.05, 0.5), tp=4)
    tight = replica_rate(LLAMA_70B, H100, load, SLO(1.0, 0.05, 0.99), tp=4)
    assert 0 < tight["rate"] < loose["rate"] < tight["mu"]
    lam, mu = tight["rate"], tight["mu"]
    wait = math.log((lam / mu) / 0.01) / (mu - lam)
    assert tight["t_prefill_s"] + wait == pytest.approx(1.0, rel=1e-6)


def test_plan_takes_the_fewest_gpus():
    load, slo = Load(20, 1000, 200), SLO(1.0, 0.05, 0.99)
    best = plan(LLAMA_70B, H100, load, slo)
    options = [p for tp in (1, 2, 4, 8) if (p := plan_for_tp(LLAMA_70B, H100, load, slo, tp))]
    assert best.gpus == min(p.gpus for p in options)
    r, n = best.per_replica, best.replicas

    def meets(k):
        return (r["t_prefill_s"] + fleet_wait_quantile(20, r["mu"], k, 0.99) <= 1.0
                and colocated_tpot(r["t_step_s"], 20 / k, r["t_prefill_s"]) <= 0.05)

    assert meets(n) and not meets(n - 1)
    assert plan(Model(1e12, 100, 8, 128), H100, load, slo) is None  # 2 TB of weights: not on 8 GPUs


def test_erlang_c_against_known_values():
    assert erlang_c(1, 0.5) == pytest.approx(0.5)  # M/M/1: the probability of waiting is rho
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert erlang_c(10, 8.0) == pytest.approx(0.4092, abs=1e-4)  # the textbook table
    # pooling: ten servers wait less than one server of a tenth the load
    assert fleet_wait_quantile(8, 1, 10, 0.99) < fleet_wait_quantile(0.8, 1, 1, 0.99)


def test_replicas_from_a_measured_curve():
    curve = [{"request_rate": r, "p99_ttft_ms": 100 * r, "p99_tpot_ms": 20} for r in (1, 2, 4, 8)]
    out = replicas_from_curve(curve, 30, {"ttft": 500, "tpot": 50})
    assert out == {"max_rate_within_slo": 4, "replicas": 8}
    assert replicas_from_curve(curve, 30, {"ttft": 50})["replicas"] is None


def test_routing_simulation_cache_affinity_beats_spreading():
    res = {p: simulate_routing(p, 8, num_sessions=400) for p in ROUTING_POLICIES}
    assert res["round_robin"]["load_spread_max_over_mean"] == pytest.approx(1.0, abs=0.01)
    for sticky in ("cache_aware", "consistent_hash"):
        assert res[sticky]["hit_rate"] > res["round_robin"]["hit_rate"] + 0.1
    with pytest.raises(ValueError):
        simulate_routing("random_walk", 2)


# -- the processes ---------------------------------------------------------------------------------
def test_fleet_of_two_behind_vllm_router_with_a_replica_killed(tmp_path):
    pytest.importorskip("httpx")
    from inflight.bench.serve.cluster import policy_run, session_workload
    from inflight.bench.serve.fleet import Fleet, router_executable

    if router_executable() is None:
        pytest.skip("vllm-router is not installed (pip install 'inflight[router]')")
    import time

    fleet = Fleet(2, policy="round_robin", log_dir=tmp_path, timeout=240,
                  server_args=["--enable-prefix-caching", "--num-blocks", "64", "--threads", "1"],
                  router_args=["--health-check-interval-secs", "1"])
    procs = [fleet.router, *(r.proc for r in fleet.replicas)]
    try:
        # one system prompt of 40 tokens (two full blocks): round robin gives each replica first turns, so
        # every second turn finds at least the system prompt cached wherever it lands
        r = policy_run(fleet, session_workload(4, num_system_prompts=1, turns=2, system_len=40, question_len=8,
                                               session_rate=50), output_len=4)
        assert r["completed"] == r["requests"] == 8 and r["replica_requests"] == [4, 4]  # round robin
        assert r["hit_rate"] > 0
        fleet.kill(0)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and all(w["is_healthy"] for w in fleet.workers()):
            time.sleep(0.2)
        assert [w["is_healthy"] for w in fleet.workers() if w["url"] == fleet.urls[0]] == [False]
    finally:
        fleet.stop()
    assert all(p.poll() is not None for p in procs)


# -- chapter 11's grader and explorer -------------------------------------------------------------
def test_grader_passes_the_reference_and_names_every_classic_slip():
    from inflight.exercises.fleet import MISTAKES, check_max_batch

    assert check_max_batch(max_batch, quiet=True)
    for mistake in MISTAKES:
        r = check_max_batch(mistake.impl, quiet=True)
        assert not r and r.mistake == mistake.name, (mistake.name, r.mistake, r.report)

    def stub(*a, **k):
        raise NotImplementedError

    assert check_max_batch(stub, quiet=True).not_implemented


def test_the_explorer_draws_the_simulation():
    import matplotlib

    matplotlib.use("Agg")
    from inflight.book import explore_fleet

    site = explore_fleet.fleet_site(replicas=(2, 8), caches=(100, 200))
    assert site.views == 4
    rs = explore_fleet.runs(8, 100)
    assert [r["policy"] for r in rs] == list(ROUTING_POLICIES)
    assert explore_fleet.LiveFleet()(8, 100)[:4] == b"\x89PNG"


def test_disaggregated_plan_sizes_each_pool_for_its_objective():
    from inflight.sim.fleet import plan_disaggregated

    slo = SLO(1.0, 0.05, 0.99)
    for prompt in (1000, 8000):
        load = Load(20, prompt, 200)
        d = plan_disaggregated(LLAMA_70B, H100, load, slo)
        p, dec = d["prefill"], d["decode"]
        assert p["t_prefill_s"] + d["transfer_s"] + fleet_wait_quantile(20, p["mu"], p["instances"], 0.99) <= 1.0
        assert dec["instances"] * dec["mu"] >= 20
        assert d["gpus"] == p["instances"] * p["tp"] + dec["instances"] * dec["tp"]
        assert dec["batch"] == max_batch(LLAMA_70B, H100, load, slo, dec["tp"])
        assert d["transfer_s"] == pytest.approx(prompt * 327_680 / 50e9)
    long = Load(20, 8000, 200)  # long prompts: colocated, the prefills stretch every decode's TPOT
    assert plan_disaggregated(LLAMA_70B, H100, long, slo)["gpus"] < plan(LLAMA_70B, H100, long, slo).gpus
    assert plan_disaggregated(Model(1e12, 100, 8, 128), H100, long, slo) is None
