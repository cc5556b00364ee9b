"""`python -m inflight.bench.busy`: each variant runs in its own process with the thread setting it
names, and the report holds quiet and busy figures (no timing is asserted: that is the benchmark's job)."""
from __future__ import annotations

import pytest

from inflight.bench import busy


def test_unknown_variant_is_named():
    with pytest.raises(ValueError, match="unknown variant 'fast'"):
        busy.run_variant("fast", 2, 0)


def test_bad_request_count_is_refused(capsys):
    with pytest.raises(SystemExit):
        busy.main(["-n", "0"])
    assert "--num-requests must be >= 1" in capsys.readouterr().err


def test_spin_variant_loads_torch_before_inflight():
    # the tricky one: `import inflight` would set PASSIVE, so the child must load torch first
    out = busy.run_variant("spin", 2, 0)
    assert out["passive_wait"] is False and out["tokens_per_s"] > 0 and out["wall_s"] > 0


def test_report_has_both_runs_and_the_target_on_the_default():
    res = busy.run_busy_benchmark(2, ["inflight"], competitors=1, log=lambda s: None)
    v = res["variants"]["inflight"]
    assert v["kept"] == pytest.approx(v["busy"]["tokens_per_s"] / v["quiet"]["tokens_per_s"])
    assert v["quiet"]["passive_wait"] is True and v["busy"]["passive_wait"] is True
    assert res["target"]["keep_at_least"] == busy.KEEP_TARGET and res["competitors"] == 1
    assert v["kept_min"] == v["kept_max"] == v["kept"] and v["quiet"]["adaptive_threads"] is True


def test_rounds_report_the_median_round_and_the_spread():
    res = busy.run_busy_benchmark(2, ["fixed"], competitors=1, log=lambda s: None, rounds=3)
    v = res["variants"]["fixed"]
    assert len(v["kept_per_round"]) == 3 and v["kept_min"] <= v["kept"] <= v["kept_max"]
    assert sorted(v["kept_per_round"])[1] == v["kept"] and v["quiet"]["adaptive_threads"] is False
    assert "target" not in res  # the target is on the default only


def test_measure_here_runs_this_process_alone_and_beside_competitors():
    from inflight.model.loading import load_tiny

    res = busy.measure_here(load_tiny()[0], n=2, competitors=1)
    assert res["competitors"] == 1 and res["quiet"]["tokens_per_s"] > 0 and res["busy"]["tokens_per_s"] > 0
    assert res["kept"] == pytest.approx(res["busy"]["tokens_per_s"] / res["quiet"]["tokens_per_s"])
