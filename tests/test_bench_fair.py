"""`inflight.bench.protocol.fair`: the comparison protocol's logic (settings search, alternation, token check,
medians and ranges) on fake measurements, and one real process of each kind. No speed is asserted."""
from __future__ import annotations

import json

import pytest

from inflight.bench.protocol import fair


def _fake_run(values, tokens=None, calls=None):
    """A `run` whose value for (contender, setting) comes from `values`: a number, or a list consumed in turn."""
    def run(c, s):
        name = c.name.split(" at ")[0]  # (`search_in_rounds` runs each setting as "name at setting")
        v = values[(name, s.label)]
        v = v.pop(0) if isinstance(v, list) else v
        if calls is not None:
            calls.append((name, s.label))
        return {"value": v, "tokens": (tokens or {}).get((name, s.label), {"a": [1, 2], "b": [3]})}
    return run


def _ref(tmp_path):
    return fair.TokenReference.save(tmp_path / "ref.json", {"a": [1, 2], "b": [3]}, "test")


S1, S2 = fair.Setting("one"), fair.Setting("two")


def test_openmp_settings_cover_every_thread_count_and_policy():
    got = fair.openmp_settings(2)
    assert len(got) == 8
    envs = [dict(s.env) for s in got]
    assert {e["OMP_NUM_THREADS"] for e in envs} == {"1", "2"}
    assert {(e["OMP_WAIT_POLICY"], e["GOMP_SPINCOUNT"]) for e in envs} == {
        (None, None), ("PASSIVE", None), ("ACTIVE", None), ("PASSIVE", "10000")}
    # the library's default policy means torch loads before inflight could set one
    assert all(s.torch_first == (dict(s.env)["OMP_WAIT_POLICY"] is None) for s in got)
    assert {dict(s.env)["OMP_NUM_THREADS"] for s in fair.openmp_settings(16)} == {"1", "8", "16"}


def test_search_keeps_the_best_median_and_records_every_setting(tmp_path):
    a = fair.Contender("a", ("x",), (S1, S2))
    b = fair.Contender("b", ("y",), (S1,))  # one setting: nothing to search
    calls = []
    run = _fake_run({("a", "one"): [10, 30, 20], ("a", "two"): [25, 26, 1]}, calls=calls)
    found = fair.search([a, b], 3, run, _ref(tmp_path), log=lambda s: None)
    assert found["a"]["best"] == S2  # median 25 beats median 20, though "one" had the single best run
    assert [r["median"] for r in found["a"]["tried"]] == [20, 25]
    assert found["b"]["best"] == S1 and not any(name == "b" for name, _ in calls)
    assert calls[:2] == [("a", "one"), ("a", "two")]  # settings take turns within a round


def test_a_setting_whose_tokens_differ_is_never_chosen(tmp_path):
    a = fair.Contender("a", ("x",), (S1, S2))
    run = _fake_run({("a", "one"): 10, ("a", "two"): 99}, tokens={("a", "two"): {"a": [1, 9], "b": [3]}})
    found = fair.search([a], 2, run, _ref(tmp_path), log=lambda s: None)
    assert found["a"]["best"] == S1 and found["a"]["tried"][1]["values"] == [None, None]


def test_alternate_rotates_the_order_and_refuses_wrong_tokens(tmp_path):
    cs = [fair.Contender(n, (n,)) for n in "abc"]
    calls = []
    run = _fake_run({(n, "as is"): 1.0 for n in "abc"}, tokens={("b", "as is"): {"a": [1, 2]}}, calls=calls)
    rows = fair.alternate(cs, {n: fair.Setting("as is") for n in "abc"}, 3, run, _ref(tmp_path), log=lambda s: None)
    assert [name for name, _ in calls] == list("abc" "bca" "cab")
    assert [list(r) for r in rows] == [list("abc")] * 3  # rows keep the contenders' order
    b = rows[0]["b"]
    assert b["value"] is None and b["refused_value"] == 1.0
    assert b["token_check"] == {"identical": 1, "of": 2, "ok": False,
                                "first_difference": {"request": "b", "position": 0, "missing": True}}
    assert rows[0]["a"]["token_check"]["ok"] and "tokens" not in rows[0]["a"]


def test_summary_gives_median_and_range_and_ratios_only_where_both_measured():
    rows = [{"a": {"value": 10.0}, "b": {"value": 5.0}}, {"a": {"value": 12.0}, "b": {"value": None}},
            {"a": {"value": 9.0}, "b": {"value": 3.0}}]
    s = fair.summarize(rows, [("a", "b")])
    assert s["contenders"]["a"] == {"median": 10.0, "min": 9.0, "max": 12.0, "n": 3}
    assert s["contenders"]["b"]["n"] == 2
    assert s["ratios"]["a/b"]["per_round"] == [2.0, 3.0] and s["ratios"]["a/b"]["median"] == 2.5


def test_compare_runs_the_search_then_the_rounds_at_the_best_settings(tmp_path):
    a = fair.Contender("a", ("x",), (S1, S2))
    b = fair.Contender("b", ("y",), (S1, S2))
    values = {("a", "one"): 1, ("a", "two"): 2, ("b", "one"): 4, ("b", "two"): 3}
    calls = []
    res = fair.compare([a, b], rounds=2, search_rounds=1, pairs=[("a", "b")], ref=_ref(tmp_path),
                       run=_fake_run(values, calls=calls), log=lambda s: None)
    assert res["settings"]["a"]["best"]["label"] == "two" and res["settings"]["b"]["best"]["label"] == "one"
    assert calls[4:] == [("a", "two"), ("b", "one"), ("b", "one"), ("a", "two")]
    assert res["summary"]["ratios"]["a/b"]["median"] == 0.5 and res["all_tokens_identical"]
    json.dumps(res)  # the record is plain JSON
    with pytest.raises(ValueError, match="rounds"):
        fair.compare([a], rounds=0)


def test_the_reference_round_trips_through_its_file(tmp_path):
    ref = _ref(tmp_path)
    again = fair.TokenReference.load(ref.path)
    assert again.tokens == ref.tokens and again.source == "test"
    assert again.check({"a": [1, 2], "b": [3]})["ok"]
    assert again.check({"a": [1, 2], "b": [3, 4]})["first_difference"] == {"request": "b", "position": 1,
                                                                             "missing": False}


def test_run_process_applies_the_setting_and_reads_the_result():
    code = ("import json, os, sys; json.dump({'value': 1.5, 'tokens': {}, 'threads': os.environ.get('OMP_NUM_THREADS'),"
            " 'policy': os.environ.get('OMP_WAIT_POLICY'), 'torch': 'torch' in sys.modules}, "
            "open(os.environ['INFLIGHT_RESULT'], 'w'))")
    c = fair.Contender("py", ("{python}", "-c", code))
    s = fair.Setting("x", (("OMP_NUM_THREADS", "3"), ("OMP_WAIT_POLICY", None)))
    res = fair.run_process(c, s)
    assert res["value"] == 1.5 and res["threads"] == "3" and res["policy"] is None and res["process_wall_s"] > 0


def test_torch_first_imports_torch_before_the_module(tmp_path):
    mod = tmp_path / "probe_mod.py"
    mod.write_text("import json, os, sys\njson.dump({'value': 1, 'torch_first': 'torch' in sys.modules, 'argv': sys.argv},"
                   " open(os.environ['INFLIGHT_RESULT'], 'w'))\n")
    c = fair.Contender("m", ("{python}", "-m", "probe_mod", "--flag"))
    res = fair.run_process(c, fair.Setting("t", (("PYTHONPATH", str(tmp_path)),), torch_first=True))
    assert res["torch_first"] is True and res["argv"][1:] == ["--flag"]
    with pytest.raises(ValueError, match="torch_first"):
        fair.run_process(fair.Contender("c", ("echo",)), fair.Setting("t", torch_first=True))


def test_a_failing_or_silent_process_is_an_error_that_says_which():
    with pytest.raises(RuntimeError, match=r"bad \(x\) failed with exit status 3"):
        fair.run_process(fair.Contender("bad", ("{python}", "-c", "import sys; sys.exit(3)")), fair.Setting("x"))
    with pytest.raises(RuntimeError, match="no numeric 'value'"):
        fair.run_process(fair.Contender("odd", ("{python}", "-c",
                                                "import json, os; json.dump({}, open(os.environ['INFLIGHT_RESULT'], 'w'))")),
                         fair.Setting("x"))


def test_search_in_rounds_runs_every_setting_each_round_and_keeps_the_best_ones_figures(tmp_path):
    a = fair.Contender("a", ("x",), (S1, S2))
    b = fair.Contender("b", ("y",), (S1,))
    values = {("a", "one"): [5, 6], ("a", "two"): [8, 2], ("b", "one"): [2, 3]}
    calls = []
    res = fair.compare([a, b], rounds=2, pairs=[("a", "b")], ref=_ref(tmp_path), run=_fake_run(values, calls=calls),
                       search_in_rounds=True, log=lambda s: None)
    assert len(calls) == 6 and calls[3] == ("a", "two")  # round 2 starts with the second (contender, setting)
    assert res["settings"]["a"]["best"]["label"] == "one"  # median 5.5 beats median 5
    assert [r["a"]["value"] for r in res["rounds"]] == [5, 6] and list(res["rounds"][0]) == ["a", "b"]
    assert res["summary"]["ratios"]["a/b"]["per_round"] == [2.5, 2.0]
