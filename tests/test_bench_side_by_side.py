"""`python -m inflight.bench.protocol.side_by_side`: the fair protocol on the engine and the transformers peers —
every system in its own process, its settings searched, the rounds alternating, every process's tokens
checked against a saved reference (no speed is asserted: that is the benchmark's job)."""
import json

import pytest

from inflight.bench.protocol import fair, side_by_side

SHAPE = dict(prompt_range=(3, 10), output_mean=4, output_cap=8)


def test_the_whole_protocol_on_a_tiny_workload(tmp_path):
    pytest.importorskip("transformers")
    settings = fair.openmp_settings(2, policies=("default", "PASSIVE"))[:2]  # two settings keep it short
    # one round (each contender process costs seconds of imports; the rounds' alternation is the same
    # loop whatever its count, and test_bench_fair covers the rotation)
    res = side_by_side.run(n=4, rounds=1, search_rounds=1, search_n=3, floor=True, reference_path=tmp_path / "ref.json",
                           settings=settings, log=lambda s: None, **SHAPE)
    assert res["status"] == "ok" and len(res["rounds"]) == 1 and res["all_tokens_identical"]
    for row in res["rounds"]:
        assert set(row) == {"paged", "hf_static", "hf_continuous"}
        assert all(m["token_check"] == {"identical": 4, "of": 4, "ok": True} for m in row.values())
        assert row["paged"]["floor"]["wall_over_floor"] > 0  # each paged run measured its floor
    for name, found in res["settings"].items():  # every setting tried on the search workload, the best kept
        assert [t["setting"]["label"] for t in found["tried"]] == [s.label for s in settings]
        assert found["best"]["label"] in {s.label for s in settings}
    ref = json.loads((tmp_path / "ref.json").read_text())
    assert len(ref["tokens"]) == 4 and "sequential" in ref["source"]
    assert (tmp_path / "ref_search3.json").exists()
    t = res["target"]
    assert t["rounds_measured"] == 1 and t["min_of_ideal"] <= t["median_of_ideal"] <= t["max_of_ideal"]
    assert t["met"] == (t["median_of_ideal"] >= side_by_side.TARGET_OF_IDEAL)
    assert t["floor"]["n"] == 1 and t["floor"]["met"] == (t["floor"]["median"] <= side_by_side.TARGET_FLOOR)
    text = side_by_side.report(res)
    assert "work-bound ideal" in text and "over its floor" in text and "identical to the reference: yes" in text


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        side_by_side.main(["--rounds", "0"])
    assert "must be >= 1" in capsys.readouterr().err
