"""The workload matrix (bench.protocol.cells, bench.protocol.matrix) and the time split
(bench.offline.time_split): the cells are the shapes they claim, the matrix computes each cell's
figures from the protocol's rounds, and the split accounts for a real run's time. No timing is
asserted: the processes here are stand-ins that report fixed figures."""
from __future__ import annotations

import json

import pytest

from inflight.bench.protocol import cells, fair, matrix, side_by_side


def test_the_matrix_is_three_ratios_by_two_contexts_by_two_batch_limits():
    names = [c.name for c in cells.CELLS]
    assert len(names) == 12 == len(set(names))
    assert {(c.ratio, c.context, c.batch_size) for c in cells.CELLS} == {
        (r, x, b) for r in ("decode-heavy", "balanced", "prefill-heavy") for x in ("short", "long") for b in (16, 64)}
    for c in cells.ALL:
        assert c.prompt_range[1] + c.output_cap <= 512  # the tiny model's positions
        assert c.num_requests >= c.batch_size  # static batching fills at least one batch
    for context in ("short", "long"):  # more prompt per generated token from left to right
        ratio = [sum(c.prompt_range) / 2 / c.output_mean for c in cells.CELLS if c.context == context and c.batch_size == 16]
        assert ratio == sorted(ratio) and ratio[0] <= 0.5 and ratio[-1] > 5
    assert cells.cell("benchmark/long-tailed/B64") is cells.BENCHMARK and cells.BENCHMARK not in cells.CELLS
    with pytest.raises(ValueError, match="unknown cell"):
        cells.cell("balanced/medium/B16")


def test_the_ideal_with_prompts_counts_every_padded_row():
    from inflight.bench.offline.prompts import BenchRequest, Workload
    from inflight.bench.protocol.contender import _ideal_with_prompts

    w = Workload("w", [BenchRequest("a", [1] * 4, 2), BenchRequest("b", [1] * 2, 6), BenchRequest("c", [1] * 3, 1)])
    # batches of 2: (a, b) pads prompts to 4 and outputs to 6 -> 2 x 10; (c) alone -> 4; useful 6 + 8 + 4
    assert _ideal_with_prompts(w, 2) == pytest.approx((20 + 4) / 18)


def _fake_process(cell_calls: list):
    """fair.run_process for stand-in contenders: the reference, the engine at 900 tokens/s and the
    peer at 100, every process's tokens the reference's; the floor process reports a floor."""
    tokens = {"0": [5, 6], "1": [7]}

    def run(contender: fair.Contender, setting: fair.Setting, timeout=None, extra_env=None):
        cmd = list(contender.command)
        mode = cmd[cmd.index("--mode") + 1]
        cell_calls.append((mode, "--floor" in cmd, "--split" in cmd))
        out = {"value": {"sequential": 50.0, "paged": 900.0, "hf_static": 100.0}[mode], "tokens": dict(tokens),
               "wall_s": 3.0 / {"sequential": 50.0, "paged": 900.0, "hf_static": 100.0}[mode] * 100,
               "useful_tokens": 3, "work_bound_ideal": 3.0, "prompt_tokens": 10, "work_bound_ideal_with_prompts": 1.5}
        if "--floor" in cmd:
            out["floor"] = {"floor_s": 0.2, "linear_layers_s": 0.15, "kv_read_s": 0.03, "prefill_attention_s": 0.02,
                            "max_tokens_per_s_floor": 1500.0}
        if "--split" in cmd:
            out["time_split"] = {"wall_s": 0.34, "shares": {"linear layers": 0.5, "scheduling": 0.1}}
        return out

    return run


def test_a_cell_reports_its_ratio_as_a_multiple_of_its_ideal_and_its_floor(monkeypatch, tmp_path):
    calls: list = []
    monkeypatch.setattr(fair, "run_process", _fake_process(calls))
    c = cells.cell("balanced/short/B16")
    best = {m: matrix._settings_default(m) for m in ("paged", "hf_static")}
    res = matrix.run_cell(c, best, ("hf_static",), rounds=3, tmp=tmp_path, log=lambda s: None)
    # one reference, three rounds of both, then one engine process with the floor and the split
    assert calls[0][0] == "sequential" and calls.count(("paged", False, False)) == 3
    assert calls.count(("hf_static", False, False)) == 3 and calls[-1] == ("paged", True, True)
    t = res["target"]
    assert t["work_bound_ideal"] == 3.0 and t["median_of_ideal"] == pytest.approx(3.0) and t["met"]
    assert t["of_ideal_per_round"] == [pytest.approx(3.0)] * 3
    f = res["floor"]
    assert f["bound_over_hf_static"] == pytest.approx(15.0) and f["bound_of_ideal"] == pytest.approx(5.0)
    wall = 3.0 / 900 * 100
    assert f["wall_over_floor"]["median"] == pytest.approx(wall / 0.2)
    assert res["time_split"]["shares"]["linear layers"] == 0.5 and res["fair"]["all_tokens_identical"]
    assert res["work_bound_ideal_with_prompts"] == 1.5


def test_a_process_whose_tokens_differ_gets_no_figure(monkeypatch, tmp_path):
    calls: list = []
    honest = _fake_process(calls)

    def wrong_peer(contender, setting, timeout=None, extra_env=None):
        out = honest(contender, setting)
        if "hf_static" in contender.command:
            out["tokens"] = {"0": [5, 9], "1": [7]}
        return out

    monkeypatch.setattr(fair, "run_process", wrong_peer)
    best = {m: matrix._settings_default(m) for m in ("paged", "hf_static")}
    res = matrix.run_cell(cells.cell("decode-heavy/long/B64"), best, ("hf_static",), 2, tmp_path, split=False,
                          log=lambda s: None)
    assert not res["fair"]["all_tokens_identical"]
    assert res["target"]["median_of_ideal"] is None and not res["target"]["met"] and "floor" not in res


def test_the_matrix_searches_once_per_batch_limit_and_summarizes(monkeypatch, tmp_path):
    calls: list = []
    monkeypatch.setattr(fair, "run_process", _fake_process(calls))
    picked = [cells.cell("balanced/short/B16"), cells.cell("prefill-heavy/long/B64"), cells.BENCHMARK]
    res = matrix.run(picked, rounds=1, search_rounds=1, log=lambda s: None)
    assert sorted(res["searches"]) == ["16", "64"]
    assert res["searches"]["16"]["cell"] == "balanced/short/B16" and res["searches"]["64"]["cell"] == "balanced/short/B64"
    s = res["summary"]
    assert s["cells_met"] == ["balanced/short/B16", "prefill-heavy/long/B64"]  # the benchmark's row is apart
    assert s["benchmark_workload"]["met"] and s["all_tokens_identical"]
    text = matrix.report(res)
    assert "met in 2 of 2 cells of the matrix" in text and "benchmark/long-tailed/B64" in text
    table = matrix.markdown(json.loads(json.dumps(res, default=str)))  # as saved, then read back
    assert table.count("\n") == 4 and "| balanced/short/B16 | 32 | 3.00 | 1.50 | 9.00× (9.00–9.00) | 3.00" in table


def test_the_command_lines_refuse_what_they_cannot_run(capsys):
    with pytest.raises(SystemExit):
        matrix.main(["--cells", "balanced/medium/B16"])
    assert "unknown cell" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        matrix.main(["--peers", "hf_continuous"])
    from inflight.bench import __main__ as bench_main

    with pytest.raises(SystemExit):
        bench_main.main(["--cells", "balanced/short/B16"])
    assert "--cells goes with --matrix" in capsys.readouterr().err
    from inflight.bench.protocol import contender

    with pytest.raises(SystemExit):
        contender.main(["--mode", "hf_static", "--split"])
    assert "--split is for the engine modes" in capsys.readouterr().err


def test_the_time_split_accounts_for_a_real_run_and_puts_every_seam_back():
    from inflight.bench.offline.config import BenchConfig
    from inflight.bench.offline.suite import _plan, _setup, run_mode
    from inflight.bench.offline.time_split import CATEGORIES, TimeSplit, split_of_run
    from inflight.model import attention, fused_ops, llama
    from inflight.model.loading import load_tiny

    model = load_tiny()[0]
    before = (llama._linear, attention.AttentionBackend.__call__, fused_ops.rms_norm, type(model).forward)
    cfg = BenchConfig(n=6, batch_size=4, modes=["paged"], prompt_range=(8, 24), output_mean=6, output_cap=12)
    setup = _setup(cfg, model)
    w = _plan(cfg, model.config.vocab_size, setup.max_len, with_sequential=False)[0]
    plain = run_mode("paged", setup, w)
    with TimeSplit(model) as ts:
        rec = run_mode("paged", setup, w)
    assert rec.tokens == plain.tokens  # the timers change nothing the engine computes
    assert (llama._linear, attention.AttentionBackend.__call__, fused_ops.rms_norm, type(model).forward) == before
    split = split_of_run(ts, rec.step_stats, rec.wall)
    assert list(split["seconds"]) == list(CATEGORIES)
    assert all(v >= 0 for v in split["seconds"].values())
    # every step's prompt and decode attention went through the seam; the parts make up the run
    assert ts.calls["attention, steps with prompt tokens"] > 0 and ts.calls["attention, decode-only steps"] > 0
    assert ts.calls["linear layers"] == ts.calls["forward pass"] * (4 * model.config.num_hidden_layers + 1)
    assert sum(split["seconds"].values()) == pytest.approx(rec.wall, rel=0.05)
    with pytest.raises(RuntimeError), TimeSplit(model):
        raise RuntimeError("a run that fails")
    assert llama._linear is before[0] and type(model).forward is before[3]


def test_the_before_and_after_comparison_needs_another_checkout(tmp_path, capsys):
    from inflight.bench.protocol import versions

    with pytest.raises(ValueError, match="holds no inflight package"):
        versions.run(str(tmp_path), ["balanced/short/B16"])
    with pytest.raises(SystemExit):
        versions.main(["--before", str(tmp_path), "--cells", "balanced/short/B16"])
    assert "holds no inflight package" in capsys.readouterr().err


def test_the_before_and_after_comparison_takes_a_named_setting(capsys):
    from inflight.bench.protocol import versions

    labels = versions.setting_labels()
    assert any("ACTIVE" in label for label in labels)
    assert versions._setting(labels[0]).label == labels[0]
    here = versions.__file__.rsplit("/inflight/", 1)[0]  # (this tree's src: a package that exists)
    with pytest.raises(SystemExit):
        versions.main(["--before", here, "--cells", "balanced/short/B16", "--setting", "no such wait"])
    err = capsys.readouterr().err
    assert "unknown setting 'no such wait'" in err and labels[-1] in err
