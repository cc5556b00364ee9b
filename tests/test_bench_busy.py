"""`python -m inflight.bench.protocol.busy`: every variant in fresh processes, quiet and beside competitors, the
variants taking turns; the targets on the medians (no timing is asserted: that is the benchmark's job)."""
from __future__ import annotations

import pytest

from inflight.bench.protocol import busy


def test_unknown_variant_is_named():
    with pytest.raises(ValueError, match="unknown variant"):
        busy.matrix(["fast"], n=2, rounds=1)


def test_bad_request_count_is_refused(capsys):
    with pytest.raises(SystemExit):
        busy.main(["-n", "0"])
    assert "--num-requests and --rounds must be >= 1" in capsys.readouterr().err


def test_matrix_takes_turns_and_judges_the_medians(monkeypatch):
    calls = []
    quiet = {"inflight first": [100.0, 110.0, 90.0], "torch first": [120.0, 60.0, 130.0]}

    def fake_run(contender, setting):
        name = next(k for k, v in busy.VARIANTS.items() if v == setting)
        calls.append(name)
        n = sum(c == name for c in calls)  # the n-th run of this variant: odd quiet, even busy
        value = quiet[name][(n - 1) // 2] * (1 if n % 2 else 0.5)
        return {"value": value, "kernels": {"on": "pool"}, "load": {"other_cores_during": 0.0}}

    monkeypatch.setattr(busy, "competitors_running", _no_competitors)
    res = busy.matrix(["inflight first", "torch first"], n=8, rounds=3, run=fake_run, log=lambda s: None)
    assert calls[:4] == ["inflight first"] * 2 + ["torch first"] * 2  # quiet then busy, variant by variant
    assert calls[4:6] == ["torch first"] * 2  # round 2 starts with the other variant
    cells = res["variants"]
    assert cells["torch first"]["quiet"] == {"median": 120.0, "min": 60.0, "max": 130.0, "per_round": [120.0, 60.0, 130.0]}
    assert cells["inflight first"]["kept"]["median"] == pytest.approx(0.5)
    t = res["targets"]
    assert t["quiet_of_best"] == {"inflight first": pytest.approx(100 / 120), "torch first": 1.0}
    assert t["quiet_met"] and t["kept_met"] and t["met"]


def _no_competitors(count):
    from contextlib import nullcontext

    return nullcontext()


def test_targets_fail_when_a_variant_is_slow_or_collapses():
    cells = {"a": {"quiet": {"median": 100.0}, "kept": {"median": 0.5}},
             "b": {"quiet": {"median": 70.0}, "kept": {"median": 0.1}}}
    t = busy.targets(cells, ["a", "b"])
    assert not t["quiet_met"] and not t["kept_met"] and not t["met"]
    assert busy.targets(cells, ["a"])["met"]


def test_torch_first_variant_really_loads_torch_first():
    # the tricky one: `import inflight` would ask for a short spin, so the child must load torch first,
    # and neither must inherit what this process's own `import inflight` set
    res = busy.matrix(["torch first", "inflight first"], n=2, rounds=1, competitors=1, log=lambda s: None)
    row = res["rounds"][0]
    assert row["torch first"]["quiet"]["idle_wait"] == "spin" and row["inflight first"]["quiet"]["idle_wait"] == "short spin"
    assert row["torch first"]["quiet"]["value"] > 0 and row["torch first"]["busy"]["value"] > 0


def test_measure_here_runs_this_process_alone_and_beside_competitors():
    from inflight.model.loading import load_tiny

    res = busy.measure_here(load_tiny()[0], n=2, competitors=1)
    assert res["competitors"] == 1 and res["quiet"]["tokens_per_s"] > 0 and res["busy"]["tokens_per_s"] > 0
    assert res["kept"] == pytest.approx(res["busy"]["tokens_per_s"] / res["quiet"]["tokens_per_s"])
