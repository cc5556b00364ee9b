"""`python -m inflight.bench.offline.speculative`: one in-process measurement per method gives the plain
engine's tokens, and a contender process writes the result the fair protocol reads."""
import json
import os
import subprocess
import sys
from pathlib import Path

from inflight.bench.offline.speculative import report, run_once, spec_config

ROOT = Path(__file__).resolve().parents[1]


def test_run_once_same_tokens_every_method(tiny):
    model, tok = tiny
    runs = {m: run_once(model, tok, m, 3, 2, max_tokens=12, warmup=False) for m in ("plain", "ngram", "draft")}
    assert runs["ngram"]["tokens"] == runs["plain"]["tokens"] == runs["draft"]["tokens"]
    assert runs["draft"]["steps"] < runs["plain"]["steps"] and runs["draft"]["acceptance_rate"] > 0
    assert runs["plain"]["acceptance_rate"] is None and spec_config("plain", 3) is None


def test_contender_process_writes_its_result(tmp_path):
    out = tmp_path / "r.json"
    env = dict(os.environ, INFLIGHT_RESULT=str(out), PYTHONPATH=str(ROOT / "src"))
    subprocess.run([sys.executable, "-m", "inflight.bench.offline.speculative", "--one", "ngram", "--k", "2",
                    "--batch", "2", "--max-tokens", "8"], cwd=ROOT, env=env, check=True, timeout=300)
    res = json.loads(out.read_text())
    assert res["value"] > 0 and len(res["tokens"]) == 2 and all(len(t) == 8 for t in res["tokens"].values())


def test_report_reads_a_committed_file():
    path = ROOT / "results" / "spec_decode_cpu.json"
    res = json.loads(path.read_text())
    text = report(res)
    assert "all tokens identical to the plain engine's: True" in text and "draft k=4" in text
