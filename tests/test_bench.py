"""The benchmark's plumbing on a tiny random model: every mode produces the reference's tokens, a
mode whose tokens differ gets no speed, a peer that can't run is reported (not fatal), and the
results JSON has the fields the chapter and README read. No timed assertions."""
import json

import pytest
import torch

from inflight import bench
from inflight.bench.__main__ import parse_modes
from inflight.model.llama import LlamaConfig, LlamaModel


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaModel(cfg).eval()


def small_workload(vocab=96, n=7, seed=1, rate=None):
    return bench.make_workload("long_tailed", n, seed, vocab, prompt_range=(3, 12), output_mean=5, output_cap=12,
                               rate=rate)


def setup_for(model, with_hf=True):
    s = bench.BenchSetup(model, batch_size=3, max_len=24, paged_block_size=4)
    if with_hf:
        s.hf = bench.to_transformers(model)
    return s


def test_workload_is_seeded_and_shaped():
    a, b = small_workload(), small_workload()
    assert [(r.prompt, r.output_len) for r in a.requests] == [(r.prompt, r.output_len) for r in b.requests]
    assert all(3 <= len(r.prompt) <= 12 and 1 <= r.output_len <= 12 for r in a.requests)
    assert small_workload(seed=2).requests[0].prompt != a.requests[0].prompt
    online = small_workload(rate=5.0)
    # same requests, now with Poisson arrival times starting at 0
    assert [r.prompt for r in online.requests] == [r.prompt for r in a.requests]
    arr = [r.arrival for r in online.requests]
    assert arr[0] == 0 and arr == sorted(arr) and arr[-1] > 0
    with pytest.raises(ValueError, match="unknown workload"):
        bench.make_workload("zipf", 3, 0, 96)
    with pytest.raises(ValueError, match="rate"):
        bench.make_workload("uniform", 3, 0, 96, rate=0)


def test_outputs_fit_the_context():
    w = bench.make_workload("long_tailed", 50, 0, 96, max_context=40, prompt_range=(16, 32), output_cap=256)
    assert w.max_len <= 40


def test_every_mode_agrees_with_the_sequential_reference(tiny):
    w = small_workload()
    s = setup_for(tiny)
    ref = bench.run_mode("sequential", s, w)
    assert {r.id: len(ref.tokens[r.id]) for r in w.requests} == {r.id: r.output_len for r in w.requests}
    for mode in bench.MODES[1:]:
        rec = bench.run_mode(mode, s, w)
        assert bench.check_outputs(w, ref.tokens, rec.tokens) is None, mode
        summary = bench.summarize(rec, w)
        assert summary["status"] == "ok" and summary["tokens_per_s"] > 0, mode
        assert summary["useful_tokens"] == w.useful_tokens
        assert len(summary["ttft_s"]) == len(w.requests), mode
    # the reference itself agrees with a plain greedy loop over the same model
    from inflight.model.generate import generate

    r0 = w.requests[0]
    assert generate(tiny, [r0.prompt], r0.output_len, stop_at_eos=False)[0] == ref.tokens[r0.id]


def test_static_holds_the_batch_until_its_longest_request_ends(tiny):
    w = small_workload()
    rec = bench.run_mode("static", setup_for(tiny, with_hf=False), w)
    # the first batch's rows all stay until the longest of them is done: every step has 3 rows
    longest = max(r.output_len for r in w.requests[:3])
    assert rec.step_batch[:longest] == [3] * longest
    assert len(rec.step_batch) == sum(max(r.output_len for r in w.requests[i:i + 3]) for i in range(0, 7, 3))


def test_check_outputs_names_the_first_difference():
    w = small_workload()
    ref = {r.id: list(range(r.output_len)) for r in w.requests}
    assert bench.check_outputs(w, ref, ref) is None
    longer = {k: v + [99, 98] for k, v in ref.items()}  # padding past output_len is ignored
    assert bench.check_outputs(w, ref, longer) is None
    bad = dict(ref)
    rid = next(r.id for r in w.requests if r.output_len >= 3)
    bad[rid] = ref[rid][:2] + [777] + ref[rid][3:]
    msg = bench.check_outputs(w, ref, bad)
    assert msg is not None and rid in msg and "token 2" in msg and "777" in msg and msg.startswith("1 of 7")
    missing = {k: v for k, v in ref.items() if k != rid}
    assert "no output" in bench.check_outputs(w, ref, missing)


def test_a_mode_whose_outputs_differ_gets_no_speed(tiny):
    w = small_workload()
    s = setup_for(tiny, with_hf=False)
    refs = {}
    bench.run_checked("sequential", s, w, refs, log=lambda m: None)
    refs[w.name] = {k: [t + 1 for t in v] for k, v in refs[w.name].items()}  # sabotage the reference
    logged = []
    entry = bench.run_checked("static", s, w, refs, log=logged.append)
    assert entry["status"] == "outputs differ" and "differ" in entry["reason"]
    for key in ("tokens_per_s", "requests_per_s", "ttft_p50_s", "tpot_p99_s"):
        assert entry[key] is None
    assert entry["ttft_s"] == [] and any("NOT reporting a speed" in m for m in logged)
    assert "REFUSED" in bench.format_table({"static": entry})


def test_a_peer_that_cannot_run_is_reported_not_fatal(tiny):
    w = small_workload()
    s = setup_for(tiny, with_hf=False)
    s.hf_error = "ImportError: pretend transformers is missing"
    entry = bench.run_checked("hf_static", s, w, {}, log=lambda m: None)
    assert entry["status"] == "unavailable" and "pretend transformers is missing" in entry["error"]
    assert "unavailable" in bench.format_table({"hf_static": entry})


def test_ideal_speedup_matches_the_simulator():
    w = bench.make_workload("long_tailed", 40, 0, 96, output_mean=20, output_cap=100)
    ideal = bench.ideal_speedup(w, 8)
    assert ideal["static_steps"] >= ideal["continuous_steps"] >= -(-w.useful_tokens // 8)
    assert ideal["ideal_speedup"] == pytest.approx(ideal["static_steps"] / ideal["continuous_steps"])


def test_parse_modes():
    assert parse_modes("1,4") == ["sequential", "paged"]
    assert parse_modes("5") == ["hf_static", "hf_continuous"]
    assert parse_modes("static, hf_continuous") == ["static", "hf_continuous"]
    with pytest.raises(Exception, match="unknown mode"):
        parse_modes("warp")


def test_run_benchmark_json_has_the_fields(tiny, tmp_path):
    cfg = bench.quick_config(n=6, batch_size=3, output_mean=4, output_cap=8, prompt_range=(3, 10), online_n=4,
                             rate_fractions=[1.0], attention_bench=False)
    res = bench.run_benchmark(cfg, model=tiny, progress=False, log=lambda m: None)
    path = tmp_path / "r.json"
    bench.save_results(res, path)
    data = json.loads(path.read_text())
    for key in ("created", "machine", "versions", "seed", "device", "model", "kv_memory", "workloads",
                "device_limits", "targets", "config"):
        assert key in data, key
    assert {"torch", "transformers", "python"} <= set(data["versions"])
    assert "loadavg_start" in data["machine"]
    lt = data["workloads"]["long_tailed"]
    assert set(lt["modes"]) == set(bench.MODES)
    for mode, v in lt["modes"].items():
        assert v["status"] in ("ok", "unavailable"), (mode, v.get("reason"), v.get("error"))
        if v["status"] == "ok":
            for k in ("tokens_per_s", "requests_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
                      "kv_allocated_bytes", "peak_memory_bytes", "outside_forward_share"):
                assert k in v, (mode, k)
    for mode in ("static", "contiguous", "paged", "hf_static"):
        assert lt["modes"][mode]["status"] == "ok", mode
    assert lt["modes"]["paged"]["sched_prep_share"] is not None
    assert "sched_prep_under_10pct_at_batch" in data["targets"]
    assert {"ideal_speedup", "static_steps", "continuous_steps", "realized_fraction"} <= set(lt["ideal"])
    assert data["workloads"]["online"]["rates"]["1"]["modes"]["paged"]["status"] == "ok"
    assert data["device_limits"]["matmul_flops_per_s"] > 0
    work = lt["modes"]["paged"]["work_per_step"]
    assert len(work["tokens"]) == lt["modes"]["paged"]["forward_calls"] > 0  # one entry per forward pass
    assert sum(work["tokens"]) == lt["modes"]["paged"]["forward_tokens"]
    floor = data["time_floor"]
    assert floor["status"] == "ok", floor
    assert 0 < floor["linear_layers_s"] < floor["wall_s"]
    assert floor["rest_share"] == pytest.approx(1 - floor["linear_share"] - floor["kv_share"], abs=1e-5)
    assert set(floor["ratio_bounds"]) == {"hf_static", "hf_continuous", "static"}
    assert "bound_linear_layers_alone" in data["targets"]["paged_50pct_of_compute_roof"]
    report = bench.format_report(res)
    assert "long_tailed" in report and "targets" in report and "where the paged run's time went" in report
    # the peers are compared by the fair protocol: own processes, this very model, checked tokens
    fair = data["fair"]
    assert fair["status"] == "ok" and fair["all_tokens_identical"], fair
    assert set(fair["summary"]["contenders"]) == {"paged", "hf_static", "hf_continuous"}
    entry = data["targets"]["paged_1.5x_work_bound_ideal_over_hf_static"]
    assert entry["measured"].startswith("fair") and entry["ratio"] == pytest.approx(
        fair["summary"]["ratios"]["paged/hf_static"]["median"], rel=1e-5)
    assert "fair comparison" in report


def test_token_ids_share_a_prefix_and_online_arrivals_keep_the_requests():
    from inflight.bench.offline.prompts import with_poisson_arrivals, with_token_ids
    from inflight.sim import workloads

    lengths = workloads.from_lengths([4] * 5, prompt_len=20)
    w = with_token_ids("shared", lengths, 257, seed=0, shared_prefix=12)
    assert len({tuple(r.prompt[:12]) for r in w.requests}) == 1
    assert len({tuple(r.prompt[12:]) for r in w.requests}) == 5
    assert all(32 <= t < 127 for r in w.requests for t in r.prompt)  # byte vocabulary: printable ASCII
    with pytest.raises(ValueError, match="shared_prefix"):
        with_token_ids("x", lengths, 257, seed=0, shared_prefix=21)
    online = with_poisson_arrivals(small_workload(), 3.0, seed=0)
    assert online.name.startswith("long_tailed@") and online.rate == 3.0
    assert [(r.id, r.prompt) for r in online.requests] == [(r.id, r.prompt) for r in small_workload().requests]


def test_cli_flags_become_the_config():
    from inflight.bench.__main__ import _parser, config_from_args

    p = _parser()
    cfg = config_from_args(p, p.parse_args(["--quick", "--modes", "1,2", "-n", "5", "--no-prefix-bench"]))
    assert (cfg.n, cfg.batch_size, cfg.quick, cfg.prefix_bench) == (5, 8, True, False)
    assert cfg.modes == ["sequential", "static"] and cfg.online_modes == ["static"]
    with pytest.raises(SystemExit):
        config_from_args(p, p.parse_args(["--workload", "zipf"]))
    with pytest.raises(TypeError):
        bench.quick_config(no_such_field=1)

def test_profile_ops_adds_up_and_keeps_the_profiler_off_stderr(capfd):
    import torch

    from inflight.bench.profiling import profile_ops

    a, b = torch.randn(64, 64), torch.randn(64, 64)
    ops = profile_ops(lambda: a @ b, repeats=3)
    names = [name for name, _, _ in ops]
    assert "aten::mm" in names
    assert all(t > 0 for _, t, _ in ops) and [t for _, t, _ in ops] == sorted((t for _, t, _ in ops), reverse=True)
    assert "profiler" not in capfd.readouterr().err  # the C++ profiler's start/stop lines stay off the page


def test_transformers_cb_is_told_its_own_default_token_budget():
    """Given our pool but no budget, transformers 5.15 (Colab's) sizes its attention mask for the
    largest budget memory allows (22 GB here: the process is killed); the peer is told transformers'
    own default budget instead, with our pool in pages of our block size."""
    pytest.importorskip("transformers")
    from inflight.bench.offline.peers import _cb_config, _cb_default_budget

    cfg = _cb_config(4096, 16)
    if cfg is None:
        pytest.skip("this transformers' ContinuousBatchingConfig takes no page size")
    assert cfg.num_blocks == 256 and cfg.max_batch_tokens == _cb_default_budget() >= 256
