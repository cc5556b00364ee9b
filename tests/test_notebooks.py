"""The chapters follow the book's conventions: committed without outputs, the shared setup cell,
an "Open in Colab" link to the learner version, listed in the table of contents, and learner
versions in sync."""
import json
from pathlib import Path

import pytest
import yaml

from inflight.book.notebook import colab_link, read_repository, setup_cell
from inflight.book import make_learner

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))


def _cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _src(cell):
    s = cell["source"]
    return "".join(s) if isinstance(s, list) else s


def test_there_are_chapters():
    assert CHAPTERS, "no notebooks in chapters/"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    for i, cell in enumerate(_cells(path)):
        if cell["cell_type"] == "code":
            assert not cell.get("outputs"), f"{path.name} cell {i} has outputs: strip them before committing"
            assert cell.get("execution_count") is None, f"{path.name} cell {i} has an execution count"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_setup_cell_and_colab_link(path):
    url, branch = read_repository(ROOT / "_config.yml")
    cells = _cells(path)
    assert _src(cells[0]) == setup_cell(url, branch), f"{path.name}: first cell must be inflight.book.notebook.setup_cell()"
    link = colab_link(url, path.name, branch)
    assert any(link in _src(c) for c in cells if c["cell_type"] == "markdown"), f"{path.name}: no 'Open in Colab' link {link}"


def test_every_chapter_in_toc():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = {c["file"] for part in toc["parts"] for c in part["chapters"] if c["file"].startswith("chapters/")}
    names = {f"chapters/{p.stem}" for p in CHAPTERS}
    chapter_files = {f for f in files if f.startswith("chapters/")}
    assert names == chapter_files, (f"in toc but missing: {sorted(chapter_files - names)}; "
                                    f"not in toc: {sorted(names - chapter_files)}")
    pages = files - chapter_files  # other pages (the references): Markdown files that exist
    assert all((ROOT / f"{f}.md").is_file() for f in pages), sorted(pages)


def test_learner_notebooks_in_sync():
    assert make_learner.main([str(ROOT / "chapters"), "-o", str(ROOT / "learner"), "--check"]) == 0


def test_learner_versions_have_no_solutions():
    for path in sorted((ROOT / "learner").glob("*.ipynb")):
        text = path.read_text(encoding="utf-8")
        assert "### BEGIN SOLUTION" not in text, path.name


def test_make_learner_replaces_solution_with_stub():
    src = "def f(x):\n    # Hint: double it\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION\n"
    out = make_learner.strip_solutions(src)
    assert "return 2 * x" not in out and "# Hint: double it" in out
    assert "    raise NotImplementedError(" in out
