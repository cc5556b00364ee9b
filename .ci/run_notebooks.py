"""Execute notebooks top to bottom in a given Jupyter kernel; fail on any error; time each one.

(CI's notebook stage is nbval, in the Colab-like runtime: .ci/colab and .ci/nbval_inflight.py. This
nbclient driver is what `.ci/gpu` runs the notebooks on CUDA with, on a device image that has
nbclient and no nbval.)

    python .ci/run_notebooks.py --python VENV/bin/python chapters/*.ipynb learner/*.ipynb

`--python` registers a throwaway kernelspec for that interpreter, so the notebooks run in *its*
environment (CI's Colab-like venv) while nbclient itself comes from the environment running this
script. A learner notebook is also checked for what the learner's path promises:

- run as generated (stubs unimplemented), every check cell must report that the chapter carries on
  with the package's reference;
- then, in the same kernel, each exercise cell runs again with the chapter's reference solution
  pasted into it (what a learner who came back and got it right has typed), followed by its check
  cell, which must now report that the chapter uses the learner's code: the grader passed.

(The rest of a chapter running on a correct answer is what the chapter notebook itself does: its
code cells are the learner's with the solutions pasted in, which tests/test_notebooks.py checks.)
Writes a JSON report (`--report`) and prints one line per notebook with its time.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # make_learner's paste_solutions (book tooling, not the runtime)
sys.path.insert(0, str(ROOT / "_ext"))

import nbclient_poll  # noqa: E402
from inflight.book import make_learner  # noqa: E402

nbclient_poll.patch()  # cells with widgets end on time (see _ext/nbclient_poll.py)

LONGEST = {"07_serving", "01_why_batching"}  # started first when notebooks run side by side
USES_REFERENCE = "uses the package's reference"
USES_YOURS = "uses YOUR"


def register_kernel(python: str, folder: Path) -> str:
    """A kernelspec named `inflight-under-test` that starts `python -m ipykernel_launcher`."""
    spec = folder / "kernels" / "inflight-under-test"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"inflight under test ({python})", "language": "python",
    }))
    os.environ["JUPYTER_PATH"] = str(folder) + os.pathsep + os.environ.get("JUPYTER_PATH", "")
    return "inflight-under-test"


def _text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return "".join(parts)


def check_cells(nb) -> list[tuple[int, object]]:
    return [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code" and "use_if_passed(" in c.source]


REGRADE = "regrade"  # metadata["inflight"] of the cells appended by append_regrades


def append_regrades(nb, chapter) -> int:
    """Append to a learner notebook, for each exercise, its cell with the chapter's reference
    solution pasted in and then its check cell again; return how many exercises there are."""
    pasted = make_learner.paste_solutions(nb, chapter)
    extra = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and make_learner.STUB in cell.source:
            check = next((c for c in nb.cells[i + 1:] if c.cell_type == "code" and "use_if_passed(" in c.source), None)
            if check is None:
                raise ValueError(f"exercise cell {i} has no check cell (use_if_passed) after it")
            extra += [nbformat.v4.new_code_cell(pasted["cells"][i]["source"]), nbformat.v4.new_code_cell(check.source)]
    for cell in extra:
        cell.pop("id", None)  # nbformat 4.4 notebooks have no cell ids
        cell.metadata["inflight"] = REGRADE
    nb.cells.extend(extra)
    return len(extra) // 2


def learner_problems(nb) -> list[str]:
    """What an executed learner notebook's check cells say that they should not."""
    problems = []
    checks = check_cells(nb)
    first = [(i, c) for i, c in checks if c.metadata.get("inflight") != REGRADE]
    again = [(i, c) for i, c in checks if c.metadata.get("inflight") == REGRADE]
    if not first or len(first) != len(again):
        problems.append(f"{len(first)} check cells but {len(again)} exercises graded again with their solution")
    for cells, want, other in ((first, USES_REFERENCE, USES_YOURS), (again, USES_YOURS, USES_REFERENCE)):
        for i, cell in cells:
            said = _text(cell)
            if want not in said or other in said:
                problems.append(f"cell {i}: expected '{want}', the check printed: {said.strip()[-300:]!r}")
    return problems


def unknown_numbers(nb) -> int:
    """Text cells that still show a number the notebook had not measured when they ran."""
    from inflight.book.glue import UNKNOWN_NOTE, UNKNOWN

    note = UNKNOWN_NOTE.format(mark=UNKNOWN)
    return sum(1 for c in nb.cells if make_learner.is_text_cell(c)
               and any(note in o.get("data", {}).get("text/markdown", "") for o in c.get("outputs", [])))


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's children that have exited."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_one(path: Path, kernel: str, timeout: int) -> dict:
    nb = nbformat.read(path, as_version=4)
    learner = path.parent.name == "learner"
    exercises = append_regrades(nb, nbformat.read(ROOT / "chapters" / path.name, as_version=4)) if learner else 0
    client = NotebookClient(nb, kernel_name=kernel, timeout=timeout, allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}})
    start, cpu0, load0 = time.perf_counter(), _children_cpu(), os.getloadavg()[0]
    row = {"notebook": f"{path.parent.name}/{path.name}", "ok": True, "problems": []}
    if learner:
        row["exercises_regraded"] = exercises
    kernel_log = tempfile.TemporaryFile(mode="w+")  # the kernel's own stderr: shown only on failure
    try:
        client.execute(stderr=kernel_log)
    except CellExecutionError as exc:
        row["ok"] = False
        row["problems"].append(str(exc).strip().splitlines()[-1][:500])
    except Exception as exc:  # a dead kernel or a timeout: report it like a failed cell
        row["ok"] = False
        row["problems"].append(f"{type(exc).__name__}: {str(exc)[:500]}")
    row["seconds"] = round(time.perf_counter() - start, 1)
    # the kernel's CPU time (it has exited and been waited for): what the notebook cost, however busy
    # the machine was; and the load average (1 min) before and after
    row["cpu_seconds"] = round(_children_cpu() - cpu0, 1)
    row["load"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    if not row["ok"]:
        kernel_log.seek(0)
        row["kernel_log"] = kernel_log.read()[-3000:]
    kernel_log.close()
    if row["ok"] and learner:
        row["problems"] += learner_problems(nb)
        row["text_cells_with_unknown_numbers"] = unknown_numbers(nb)
        row["ok"] = not row["problems"]
    return row


def print_row(row: dict, label: str) -> None:
    status = "ok  " if row["ok"] else "FAIL"
    extra = (f"  ({row['exercises_regraded']} exercise(s) graded again with the solution pasted in: passed)"
             if row["ok"] and row.get("exercises_regraded") else "")
    print(f"{label}{status} {row['seconds']:6.1f} s wall {row['cpu_seconds']:5.1f} s CPU  load {row['load'][0]:4.1f}"
          f"->{row['load'][1]:4.1f}  {row['notebook']}{extra}", flush=True)
    for problem in row["problems"]:
        print(f"       {problem}", flush=True)
    if row.get("kernel_log"):
        print("       kernel's stderr:\n" + row["kernel_log"], flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--python", help="interpreter whose environment runs the notebooks (default: this one)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    ap.add_argument("--report", type=Path, help="write the per-notebook results here (JSON)")
    ap.add_argument("--label", default="", help="a word printed before each line (e.g. colab, cuda)")
    ap.add_argument("--jobs", type=int, default=1, help="notebooks executed at the same time")
    args = ap.parse_args(argv)

    # --jobs 2: two kernels at a time keep both cores busy (those that use torch pin it to one thread);
    # the longest notebooks start first so that the two workers finish together.
    paths = sorted((p.resolve() for p in args.notebooks), key=lambda p: p.stem not in LONGEST)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        kernel = register_kernel(args.python or sys.executable, Path(tmp))
        rows = []
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(run_one, path, kernel, args.timeout) for path in paths]
            for future in as_completed(futures):
                row = future.result()
                rows.append(row)
                print_row(row, args.label)
    rows.sort(key=lambda r: r["notebook"])
    print(f"{args.label}wall time {time.perf_counter() - start:.0f} s with {args.jobs} notebook(s) at a time")
    total, cpu = sum(r["seconds"] for r in rows), sum(r["cpu_seconds"] for r in rows)
    failed = [r["notebook"] for r in rows if not r["ok"]]
    print(f"{args.label}{len(rows) - len(failed)} passed, {len(failed)} failed, {total:.0f} s in all, {cpu:.0f} s CPU")
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps({"python": args.python or sys.executable, "notebooks": rows}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
