"""`python -m inflight.bench.side_by_side`: modes alternate, every round has its own ratios and token check
(no speed is asserted: that is the benchmark's job)."""
import pytest

from inflight.bench import side_by_side


def test_rounds_alternate_the_modes_and_check_every_runs_tokens():
    pytest.importorskip("transformers")
    res = side_by_side.run(n=4, rounds=2, log=lambda s: None, prompt_range=(3, 10), output_mean=4, output_cap=8)
    assert res["status"] == "ok" and len(res["rounds"]) == 2
    for row in res["rounds"]:
        assert set(row["tokens_per_s"]) == {"paged", "hf_static", "hf_continuous"}
        assert all(v == 4 for v in row["identical_requests"].values())  # float32: the peers' tokens are ours
        assert row["of_ideal"] == pytest.approx(row["over_hf_static"] / res["target"]["work_bound_ideal"])
    t = res["target"]
    assert t["rounds_measured"] == 2 and t["min_of_ideal"] <= t["median_of_ideal"] <= t["max_of_ideal"]
    assert t["met"] == (t["median_of_ideal"] >= side_by_side.TARGET_OF_IDEAL)
    assert "rounds" in side_by_side.report(res)


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        side_by_side.main(["--rounds", "0"])
    assert "must be >= 1" in capsys.readouterr().err
