"""The serving measurements run end to end in their --quick modes (each starts its own servers on
free loopback ports): the figures are not checked — only that each program completes, says what it
measured, and that the chaos run's guarantees hold on its small run too."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("fastapi")

from serve_helpers import ROOT  # noqa: E402


def _run(module: str, out, *args: str) -> dict:
    run = subprocess.run([sys.executable, "-m", module, "--quick", "--output", str(out), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    return json.loads(out.read_text())


def test_serve_cost_quick(tmp_path):
    r = _run("inflight.bench.serve.cost", tmp_path / "cost.json")
    row = r["rounds"][0]
    assert row["offline_tok_s"] > 0 and row["thread_tok_s"] > 0 and row["task_tok_s"] > 0
    assert r["command"].startswith("python -m inflight.bench.serve.cost") and "loadavg" in json.dumps(r["load"])
    # the offline engine ran in a process of its own (fair protocol), the three taking turns
    assert "--offline" in r["offline_command"] and r["orders"] == [["offline", "thread", "task"]]


def test_serve_cost_rotates_who_goes_first():
    from inflight.bench.serve.cost import turn_order

    orders = [turn_order(["offline", "thread", "task"], i) for i in range(4)]
    assert [o[0] for o in orders] == ["offline", "thread", "task", "offline"]
    assert all(sorted(o) == ["offline", "task", "thread"] for o in orders)


def test_serve_chaos_quick_keeps_its_guarantees(tmp_path):
    r = _run("inflight.bench.serve.chaos", tmp_path / "chaos.json")
    assert r["passed"] and r["hung"] == 0 and r["completed_streams_differing_from_alone"] == 0
    assert r["pool_at_end"] == {"num_requests_running": 0.0, "num_requests_waiting": 0.0, "kv_cache_usage_perc": 0.0}


def test_serve_compare_quick_runs_transformers_serve_beside_ours(tmp_path):
    r = _run("inflight.bench.serve.compare", tmp_path / "compare.json")
    for name in ("inflight", "transformers"):
        assert r["summary"][name]["2.0"]["completed"] > 0 and r["summary"][name]["2.0"]["failed"] == 0
