"""Write the learner versions of the chapters: every reference solution replaced by a stub.

    python -m inflight.book.make_learner chapters/ -o learner/
    python -m inflight.book.make_learner chapters/ -o learner/ --check   # exit 1 if out of sync

A solution sits between `### BEGIN SOLUTION` and `### END SOLUTION` (nbgrader's markers). The lines
between them are replaced by `raise NotImplementedError(...)` at the same indentation; a comment
line `# Hint: ...` placed just above the BEGIN marker stays, so the learner keeps the hint.
Outputs are stripped. The learner notebooks are what "Open in Colab" gives a reader.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
STUB = 'raise NotImplementedError("Your turn: replace this line with your code (see the hint above).")'


def strip_solutions(source: str) -> str:
    """Replace each BEGIN/END SOLUTION block of a cell's source by a stub at the same indentation."""
    out: list[str] = []
    inside = False
    for line in source.splitlines(keepends=True):
        stripped = line.strip()
        if stripped.startswith(BEGIN):
            if inside:
                raise ValueError("nested '### BEGIN SOLUTION'")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            out.append(indent + STUB + "\n")
            continue
        if stripped.startswith(END):
            if not inside:
                raise ValueError("'### END SOLUTION' without a BEGIN")
            inside = False
            continue
        if not inside:
            out.append(line)
    if inside:
        raise ValueError("'### BEGIN SOLUTION' without an END")
    text = "".join(out)
    return text.rstrip("\n") if not source.endswith("\n") else text


def learner_notebook(nb: dict) -> dict:
    """The learner version of a notebook (a new dict; the input is untouched)."""
    nb = copy.deepcopy(nb)
    for cell in nb.get("cells", []):
        src = cell.get("source", "")
        text = "".join(src) if isinstance(src, list) else src
        if cell.get("cell_type") == "code":
            if BEGIN in text:
                text = strip_solutions(text)
            cell["outputs"] = []
            cell["execution_count"] = None
        cell["source"] = text
    return nb


def render(nb: dict) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chapters", type=Path, help="folder of chapter notebooks (with solutions)")
    parser.add_argument("-o", "--out", type=Path, required=True, help="folder for the learner notebooks")
    parser.add_argument("--check", action="store_true", help="only check that --out is in sync; exit 1 if not")
    args = parser.parse_args(argv)

    stale = []
    wanted = set()
    for path in sorted(args.chapters.glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        text = render(learner_notebook(nb))
        target = args.out / path.name
        wanted.add(target.name)
        if args.check:
            if not target.exists() or target.read_text(encoding="utf-8") != text:
                stale.append(str(target))
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    extra = sorted(p.name for p in args.out.glob("*.ipynb") if p.name not in wanted) if args.out.exists() else []
    if args.check:
        if stale or extra:
            print("learner notebooks out of sync:", *stale, *(f"{args.out / e} (no chapter)" for e in extra), sep="\n  ")
            print(f"run: python -m inflight.book.make_learner {args.chapters} -o {args.out}")
            return 1
        print("learner notebooks in sync")
        return 0
    for name in extra:
        (args.out / name).unlink()
    print(f"wrote {len(wanted)} learner notebooks to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
