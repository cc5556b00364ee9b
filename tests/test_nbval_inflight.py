"""CI's notebook stage (.ci/nbval_inflight.py under nbval): a learner notebook's copy carries what the
learner path promises, and the plugin fails a check cell that says otherwise."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from inflight.book import make_learner

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("nbval_inflight_under_test", ROOT / ".ci" / "nbval_inflight.py")
plugin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plugin)


def _src(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


@pytest.mark.parametrize("name", [p.name for p in sorted((ROOT / "learner").glob("*.ipynb"))])
def test_learner_copy_regrades_every_exercise(name):
    nb = json.loads((ROOT / "learner" / name).read_text(encoding="utf-8"))
    chapter = json.loads((ROOT / "chapters" / name).read_text(encoding="utf-8"))
    copy, exercises = plugin.learner_copy(nb, chapter)
    stubs = [c for c in nb["cells"] if c["cell_type"] == "code" and make_learner.STUB in _src(c)]
    assert exercises == len(stubs) > 0
    appended = copy["cells"][len(nb["cells"]):]
    assert len(appended) == 2 * exercises
    assert [c["metadata"].get(plugin.EXPECT) for c in appended] == [None, "yours"] * exercises
    assert all(make_learner.STUB not in _src(c) for c in appended)
    checks = [c for c in copy["cells"][:len(nb["cells"])] if "use_if_passed(" in _src(c)]
    assert checks and all(c["metadata"][plugin.EXPECT] == "reference" for c in checks)
    # nbval refuses outputs on a cell never run: only the ones it checks keep theirs
    kept = [c for c in copy["cells"] if c["cell_type"] == "code" and c.get("outputs")]
    assert all(c.get("execution_count") is not None and make_learner.checks_output(c) for c in kept)


def _notebook(path: Path, cells: list[tuple[str, str | None]]) -> None:
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
          "cells": [{"cell_type": "code", "execution_count": None, "outputs": [], "id": f"c{i}", "source": src,
                     "metadata": {plugin.EXPECT: want} if want else {}} for i, (src, want) in enumerate(cells)]}
    path.write_text(json.dumps(nb))


def test_the_plugin_fails_a_check_cell_that_says_otherwise(tmp_path):
    """Run under nbval in this environment's kernel: the expected words pass, the others fail."""
    nb = tmp_path / "promises.ipynb"
    _notebook(nb, [("print(\"▶ The rest of this chapter uses the package's reference step.\")", "reference"),
                   ("print('▶ The rest of this chapter uses YOUR step.')", "yours"),
                   ("print(\"▶ The rest of this chapter uses the package's reference step.\")", "yours")])
    run = subprocess.run([sys.executable, str(ROOT / ".ci" / "nbval_inflight.py"), "run", "--", "-q",
                          "-p", "no:cacheprovider", "--nbval-lax", "--nbval-current-env", str(nb)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "2 passed" in out and "1 failed" in out, out
    assert "with the chapter's solution pasted in, the grader must pass" in out, out
    assert "nbval: FAIL" in out
