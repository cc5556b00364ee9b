"""The book's notebooks under nbval: the learner path's promises, checked by the same run.

CI executes every notebook with nbval (`pytest --nbval-lax`: each code cell a pytest item, the
cells marked `# NBVAL_CHECK_OUTPUT` compared with the output committed with them). A chapter runs
as it is. A learner notebook runs as a copy that this module writes first (`prepare`), with what
the learner's path promises turned into something nbval can check:

- its check cells (those calling `use_if_passed(`), run as generated with the stubs unimplemented,
  must say that the chapter carries on with the package's reference;
- then each exercise cell runs again with the chapter's reference solution pasted in (what a
  learner who came back and got it right has typed), followed by its check cell, which must now say
  that the chapter uses the learner's code: the grader passed.

    python .ci/nbval_inflight.py prepare learner/*.ipynb     write the copies, print their paths
    python .ci/nbval_inflight.py run -- --nbval-current-env chapters/X.ipynb COPY...
                                                             (pytest -p nbval_inflight ...)

The plugin (loaded with `-p nbval_inflight`) checks those cells' outputs, starts a copy's kernel in
the original's folder (a notebook may read `../results`), polls the kernel in one-second slices
(jupyter/nbclient#312: `_ext/nbclient_poll.py`), and prints one line per
notebook with its wall time and writes them to `$NBVAL_REPORT` (JSON) when that is set.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COPIES = ROOT / "_build" / "nbval"
USES_REFERENCE = "uses the package's reference"
USES_YOURS = "uses YOUR"
EXPECT = "inflight_nbval"  # cell metadata: what the check cell must say ("reference" or "yours")
REGRADE = "regrade"


# --- the copies ---------------------------------------------------------------------------------

def learner_copy(nb: dict, chapter: dict) -> tuple[dict, int]:
    """A learner notebook ready for nbval, and its number of exercises. Its text cells lose the
    outputs written in advance (nbval refuses outputs on a cell never run; they are rendered again
    when it runs), its check cells say what they must print, and for each exercise the cell with
    the chapter's solution pasted in and its check cell again are appended."""
    sys.path.insert(0, str(ROOT / "src"))
    from inflight.book import make_learner

    nb = json.loads(json.dumps(nb))
    pasted = make_learner.paste_solutions(nb, chapter)
    extra = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        if cell.get("execution_count") is None and cell.get("outputs"):
            cell["outputs"] = []
        source = "".join(cell["source"])
        if "use_if_passed(" in source:
            cell["metadata"][EXPECT] = "reference"
        if make_learner.STUB in source:
            check = next((c for c in nb["cells"][i + 1:] if c["cell_type"] == "code"
                          and "use_if_passed(" in "".join(c["source"])), None)
            if check is None:
                raise ValueError(f"exercise cell {i} has no check cell (use_if_passed) after it")
            extra += [{"cell_type": "code", "execution_count": None, "outputs": [], "source": pasted["cells"][i]["source"],
                       "metadata": {"inflight": REGRADE}},
                      {"cell_type": "code", "execution_count": None, "outputs": [], "source": check["source"],
                       "metadata": {"inflight": REGRADE, EXPECT: "yours"}}]
    for cell in nb["cells"]:
        cell.pop("id", None)  # cells appended have none; a notebook mixing both is invalid
    nb["cells"].extend(extra)
    return nb, len(extra) // 2


def prepare(paths: list[Path]) -> list[Path]:
    out = []
    for path in paths:
        nb = json.loads(path.read_text(encoding="utf-8"))
        chapter = json.loads((ROOT / "chapters" / path.name).read_text(encoding="utf-8"))
        copy, exercises = learner_copy(nb, chapter)
        copy["metadata"][EXPECT] = {"source": f"learner/{path.name}", "exercises": exercises}
        target = COPIES / "learner" / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(copy, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        out.append(target)
    return out


# --- the pytest plugin --------------------------------------------------------------------------

def _text(outputs) -> str:
    parts = []
    for out in outputs or []:
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return "".join(parts)


def _patch_channels() -> None:
    sys.path.insert(0, str(ROOT / "_ext"))
    import nbclient_poll

    nbclient_poll.patch_blocking()


def _patch_cwd() -> None:
    """A copy's kernel starts in the original notebook's folder."""
    from nbval import plugin

    running = plugin.RunningKernel

    def start(kernel_name, cwd=None, **kwargs):
        if cwd and Path(cwd).resolve().is_relative_to(COPIES.resolve()):
            cwd = str(ROOT / Path(cwd).resolve().relative_to(COPIES.resolve()))
        return running(kernel_name, cwd=cwd, **kwargs)

    plugin.RunningKernel = start


_times: dict[str, list[float]] = {}
_failed: set[str] = set()


def _notebook(item) -> str:
    path = Path(str(item.fspath)).resolve()
    try:
        return str(path.relative_to(COPIES.resolve()))
    except ValueError:
        return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def pytest_configure(config):
    _patch_channels()
    _patch_cwd()


def pytest_collection_modifyitems(items):
    # nbval waits 5 s for each output message after a cell's reply, then stops the kernel: on CI's
    # two busy cores a figure's message can take longer
    for item in items:
        if hasattr(item, "output_timeout"):
            item.output_timeout = 60


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    outcome = yield
    want = getattr(item, "cell", {}).get("metadata", {}).get(EXPECT) if hasattr(item, "cell") else None
    if want is None or outcome.excinfo is not None:
        return
    said = _text(item.test_outputs)
    good, bad = (USES_REFERENCE, USES_YOURS) if want == "reference" else (USES_YOURS, USES_REFERENCE)
    if good not in said or bad in said:
        what = ("run as generated, its stub must fall back to the package's reference" if want == "reference"
                else "with the chapter's solution pasted in, the grader must pass")
        outcome.force_exception(AssertionError(
            f"cell {item.cell_num}: {what}; the check printed: {said.strip()[-400:]!r}"))


def pytest_runtest_logreport(report):
    if ".ipynb::" in report.nodeid:
        name = report.nodeid.split("::")[0]
        row = _times.setdefault(name, [0.0, 0])
        row[0] += report.duration
        if report.when == "call":
            row[1] += 1
        if report.failed:
            _failed.add(name)


def pytest_terminal_summary(terminalreporter):
    if not _times:
        return
    rows = []
    for name, (seconds, cells) in sorted(_times.items()):
        shown = name.replace("_build/nbval/", "")
        ok = name not in _failed
        rows.append({"notebook": shown, "ok": ok, "seconds": round(seconds, 1), "cells": cells})
        terminalreporter.write_line(f"nbval: {'ok  ' if ok else 'FAIL'} {seconds:6.1f} s  {cells:3d} cells  {shown}")
    terminalreporter.write_line(f"nbval: {len(rows)} notebooks, {sum(r['seconds'] for r in rows):.0f} s in all")
    if os.environ.get("NBVAL_REPORT"):
        report = Path(os.environ["NBVAL_REPORT"])
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps({"python": sys.executable, "notebooks": rows}, indent=1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="write the learner notebooks' copies for nbval; print their paths")
    p.add_argument("notebooks", nargs="+", type=Path)
    r = sub.add_parser("run", help="pytest with this plugin: `run -- PYTEST ARGS`")
    r.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        # this folder is sys.path[0] when run as a script: `-p nbval_inflight` imports this file
        return pytest.main(["-p", "nbval_inflight", *[a for a in args.pytest_args if a != "--"]])
    for path in prepare([n.resolve() for n in args.notebooks]):
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
