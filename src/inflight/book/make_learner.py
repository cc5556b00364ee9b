"""Write the learner versions of the chapters: what "Open in Colab" and a plain Jupyter give a reader.

    python -m inflight.book.make_learner chapters/ -o learner/
    python -m inflight.book.make_learner chapters/ -o learner/ --check   # exit 1 if out of sync

Three changes from the chapter:

- Solutions become stubs. A solution sits between `### BEGIN SOLUTION` and `### END SOLUTION`
  (nbgrader's markers); those lines become `raise NotImplementedError(...)` at the same indentation.
  A `# Hint: ...` comment just above the BEGIN marker stays. The check cell after it then reports
  "not implemented yet" and the chapter carries on with the package's reference.
- MyST becomes plain Markdown (`inflight.book.myst`): exercises read as exercises, solutions and
  dropdowns are collapsed `<details>`, admonitions are blockquotes.
- A paragraph that quotes glued numbers becomes a hidden code cell (`text_cell`) that shows the same
  text with the numbers this notebook measured on the reader's machine (`inflight.book.glue`).

Outputs are stripped, except the text cells' own, written in advance so the prose reads before the
notebook has run. `paste_solutions` does the reverse of the first change, for CI's check that a
correct answer passes its grader in a learner notebook.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

from inflight.book import glue, myst

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
TEXT_CELL = "text"  # metadata["inflight"] of the cells that show glued numbers
TEXT_TITLE = "Text with this notebook's numbers (run it to fill them in)"
HIDDEN_TAGS = {"hide-input", "remove-input", "remove-cell"}
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


def solution_blocks(source: str) -> list[list[str]]:
    """The lines of each BEGIN/END SOLUTION block of a cell's source, markers excluded."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in source.splitlines(keepends=True):
        stripped = line.strip()
        if stripped.startswith(BEGIN):
            current = []
        elif stripped.startswith(END):
            blocks.append(current or [])
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def is_text_cell(cell: dict) -> bool:
    """True for the code cells `make_learner` writes to show a paragraph with glued numbers."""
    return cell.get("cell_type") == "code" and cell.get("metadata", {}).get("inflight") == TEXT_CELL


def text_cell(markdown: str, first: bool = True) -> dict:
    """A code cell that shows `markdown` with this kernel's glued values filled in.

    Colab hides its code behind the `# @title` form, JupyterLab behind `source_hidden`. Its output
    is written in advance (every number still unknown), so the prose reads before anything has run;
    the `first` text cell of a notebook also says what the "…" stand for.
    """
    literal = f'r"""\n{markdown}\n"""' if '"""' not in markdown else repr(f"\n{markdown}\n")
    source = f"# @title {TEXT_TITLE}\nfrom inflight.book.glue import show_markdown\n\nshow_markdown({literal})"
    pieces = glue.render(markdown, {}, note=glue.NOT_RUN_NOTE if first else None)
    shown = "\n\n".join(item if kind == "markdown" else glue.UNKNOWN for kind, item in pieces)
    outputs = [{"output_type": "display_data", "metadata": {},
                "data": {"text/markdown": shown, "text/plain": "<IPython.core.display.Markdown object>"}}]
    metadata = {"cellView": "form", "jupyter": {"source_hidden": True}, "inflight": TEXT_CELL}
    return {"cell_type": "code", "execution_count": None, "metadata": metadata, "outputs": outputs, "source": source}


def learner_markdown(cell: dict, converter: myst.Converter, first_text: bool = True) -> list[dict]:
    """A MyST Markdown cell as plain-Markdown cells, with each run of blocks that quote glued
    numbers moved into a `text_cell` (the rest stays Markdown, so it reads before anything runs)."""
    groups: list[tuple[bool, list[str]]] = []
    for block in myst.split_blocks(_source(cell)):
        text = converter.convert_block(block)
        if not text:
            continue
        dynamic = glue.PLACEHOLDER.search(text) is not None
        if groups and groups[-1][0] == dynamic:
            groups[-1][1].append(text)
        else:
            groups.append((dynamic, [text]))
    cells = []
    for dynamic, texts in groups:
        markdown = "\n\n".join(texts)
        if dynamic:
            cells.append(text_cell(markdown, first=first_text))
            first_text = False
        else:
            cells.append({"cell_type": "markdown", "metadata": copy.deepcopy(cell.get("metadata", {})),
                          "source": markdown})
    return cells


CHECK_OUTPUT = "# NBVAL_CHECK_OUTPUT"


def checks_output(cell: dict) -> bool:
    """A code cell whose output is part of the lesson and deterministic: marked for nbval, which
    compares what it prints with the output committed with it (the only outputs a chapter commits)."""
    return cell.get("cell_type") == "code" and BEGIN not in _source(cell) and any(
        line.strip() == CHECK_OUTPUT for line in _source(cell).splitlines())


def learner_code(cell: dict) -> dict:
    """A code cell with its solutions stubbed and outputs cleared (but those nbval checks); plumbing the book hides
    (`hide-input`, `remove-input`, `remove-cell`) starts collapsed in JupyterLab too."""
    cell = copy.deepcopy(cell)
    text = _source(cell)
    cell["source"] = strip_solutions(text) if BEGIN in text else text
    if not checks_output(cell):  # (the output nbval checks stays, as in the chapter)
        cell["outputs"] = []
        cell["execution_count"] = None
    if HIDDEN_TAGS & set(cell.get("metadata", {}).get("tags", [])):
        cell["metadata"].setdefault("jupyter", {})["source_hidden"] = True
    return cell


def learner_notebook(nb: dict) -> dict:
    """The learner version of a notebook (a new dict; the input is untouched)."""
    converter = myst.Converter(myst.index_exercises(
        [_source(c) for c in nb.get("cells", []) if c.get("cell_type") == "markdown"]))
    cells: list[dict] = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            cells.extend(learner_markdown(cell, converter, first_text=not any(map(is_text_cell, cells))))
        elif cell.get("cell_type") == "code":
            cells.append(learner_code(cell))
        else:
            cells.append(copy.deepcopy(cell))
    out = {k: copy.deepcopy(v) for k, v in nb.items() if k != "cells"}
    out["cells"] = cells
    return out


def paste_solutions(learner: dict, chapter: dict) -> dict:
    """The learner notebook with every stub replaced by the chapter's reference solution: what a
    learner who solves every exercise has in front of them (a new dict)."""
    learner = copy.deepcopy(learner)
    mine = [c for c in learner["cells"] if c["cell_type"] == "code" and not is_text_cell(c)]
    theirs = [c for c in chapter["cells"] if c["cell_type"] == "code"]
    if len(mine) != len(theirs):
        raise ValueError(f"learner notebook has {len(mine)} code cells, the chapter {len(theirs)}: regenerate it")
    for cell, ref in zip(mine, theirs):
        blocks = solution_blocks(_source(ref))
        if not blocks:
            continue
        lines = _source(cell).splitlines(keepends=True)
        stubs = [i for i, line in enumerate(lines) if line.strip() == STUB]
        if len(stubs) != len(blocks):
            raise ValueError(f"{len(stubs)} stubs but {len(blocks)} solutions in a cell: regenerate the learner notebook")
        for i, block in zip(reversed(stubs), reversed(blocks)):
            lines[i:i + 1] = [b if b.endswith("\n") else b + "\n" for b in block]
        cell["source"] = "".join(lines).rstrip("\n") if not _source(cell).endswith("\n") else "".join(lines)
    return learner


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
