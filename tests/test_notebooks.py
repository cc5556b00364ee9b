"""The chapters follow the book's conventions: committed without outputs, the shared setup cell
(installing the release the page was written for), one Colab destination (the learner version at
that release), listed in the table of contents, nothing from the book tooling at run time, and
learner versions in sync and free of raw MyST."""
import ast
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

import inflight
from inflight.book import make_learner, myst
from inflight.book.glue import PLACEHOLDER
from inflight.book.notebook import COLAB_LINK, chapter_extras, colab_link, read_repository, release_tag, setup_cell

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
LEARNER = sorted((ROOT / "learner").glob("*.ipynb"))

# What Colab preinstalls (the runtime .ci/colab rebuilds), by import name.
COLAB_SET = {"torch", "numpy", "matplotlib", "ipywidgets", "ipykernel", "IPython", "tqdm", "pandas",
             "transformers", "safetensors", "huggingface_hub", "yaml", "nbformat", "requests"}
# Imported only where present, each behind its own guard.
OPTIONAL = {"triton": "the [triton] extra: the GPU kernel, imported on CUDA only",
            "myst_nb": "the book build: inflight.book.glue works without it",
            "google": "Colab's own module, imported only on Colab",
            "tokenizers": "builds the tiny model's Hugging Face tokenizer files (train_tiny; transformers brings it)"}
IMPORT_NAMES = {"pyyaml": "yaml", "huggingface-hub": "huggingface_hub", "pillow": "PIL"}


def _cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _src(cell):
    s = cell["source"]
    return "".join(s) if isinstance(s, list) else s


def test_there_are_chapters():
    assert CHAPTERS, "no notebooks in chapters/"
    assert [p.name for p in LEARNER] == [p.name for p in CHAPTERS]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    """Only the cells marked `# NBVAL_CHECK_OUTPUT` carry an output: the one nbval must see again
    (with an execution count, or nbval refuses it as the output of a cell never run)."""
    for i, cell in enumerate(_cells(path)):
        if cell["cell_type"] == "code" and make_learner.checks_output(cell):
            assert cell.get("outputs") and cell.get("execution_count") is not None, \
                f"{path.name} cell {i} is marked NBVAL_CHECK_OUTPUT: commit the output it must give"
            assert all(o["output_type"] == "stream" for o in cell["outputs"]), f"{path.name} cell {i}: text only"
        elif cell["cell_type"] == "code":
            assert not cell.get("outputs"), f"{path.name} cell {i} has outputs: strip them before committing"
            assert cell.get("execution_count") is None, f"{path.name} cell {i} has an execution count"


def test_the_lessons_deterministic_outputs_are_checked():
    """The seed's worked examples (A, B, C on two slots; A and B under a memory budget) print what
    the page says they print: nbval compares them (`# NBVAL_CHECK_OUTPUT`) in every run."""
    marked = {p.name: [c for c in _cells(p) if make_learner.checks_output(c)] for p in CHAPTERS}
    seed = "".join(t for c in marked["03_continuous_batching.ipynb"] for o in c["outputs"] for t in o["text"])
    assert "processed ['A', 'B']" in seed and "processed ['A', 'C']" in seed
    assert marked["04_memory_aware_admission.ipynb"], "chapter 4's memory-budget example is checked"
    for path in LEARNER:  # the learner copy keeps them, so nbval checks them there too
        kept = [c for c in _cells(path) if make_learner.checks_output(c)]
        assert [c["outputs"] for c in kept] == [c["outputs"] for c in marked[path.name]], path.name


def test_release_tag_is_the_package_version():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    version = re.search(r'(?m)^version = "([^"]+)"', pyproject).group(1)
    assert inflight.__version__ == version, "inflight.__version__ and pyproject.toml's version differ"
    assert release_tag() == f"v{version}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_setup_cell_and_colab_link(path):
    url, _branch = read_repository(ROOT / "_config.yml")
    cells = _cells(path)
    fix = "run: python -m inflight.book.notebook chapters/"
    extras = chapter_extras(json.loads(path.read_text(encoding="utf-8")))
    assert _src(cells[0]) == setup_cell(url, extras=extras), f"{path.name}: first cell must be setup_cell() ({fix})"
    assert f'"{release_tag()}"' in _src(cells[0])
    link = colab_link(url, path.name)
    links = [m for c in cells if c["cell_type"] == "markdown" for m in COLAB_LINK.findall(_src(c))]
    assert link in links, f"{path.name}: no 'Open in Colab' link {link} ({fix})"
    assert set(links) == {link}, f"{path.name}: every Colab link must open {link}, found {sorted(set(links))}"


def test_repository_url_lives_in_config_only():
    url, _branch = read_repository(ROOT / "_config.yml")
    allowed = {ROOT / "_config.yml", *CHAPTERS, *LEARNER}  # the notebooks' copies are generated and checked
    places = [p for folder in ("src", "tests", ".ci", ".github", "_ext") for p in (ROOT / folder).rglob("*")
              if p.is_file() and p.suffix in {".py", ".yml", ".yaml", ".md", ""} and p not in allowed]
    places += [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / "intro.md"]
    assert not [str(p.relative_to(ROOT)) for p in places if p.exists() and url in p.read_text(errors="ignore")]


def test_every_chapter_in_toc():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = {c["file"] for part in toc["parts"] for c in part["chapters"] if c["file"].startswith("chapters/")}
    names = {f"chapters/{p.stem}" for p in CHAPTERS}
    chapter_files = {f for f in files if f.startswith("chapters/")}
    assert names == chapter_files, (f"in toc but missing: {sorted(chapter_files - names)}; "
                                    f"not in toc: {sorted(names - chapter_files)}")
    pages = files - chapter_files  # other pages (the references): Markdown files that exist
    assert all((ROOT / f"{f}.md").is_file() for f in pages), sorted(pages)


def _imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "inflight"}


def test_run_time_imports_are_dependencies():
    """What chapters and the package import at run time is in pyproject's dependencies or
    Colab's preinstalled set; book tooling (myst_nb) is not needed at run time at all."""
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    deps_block = re.search(r"(?ms)^dependencies = \[(.*?)^\]", pyproject).group(1)
    deps = {re.split(r"[<>=!~\[ ;]", d.strip().strip('",'))[0] for d in deps_block.splitlines() if d.strip().strip('",')}
    allowed = {IMPORT_NAMES.get(d, d) for d in deps} | COLAB_SET | set(OPTIONAL)
    serve = _extra(pyproject, "serve")  # the server's extra: for the server, its load generator, and the
    used = {}                           # chapters whose setup cell installs it
    for path in CHAPTERS:
        mine = allowed | (serve if "serve" in chapter_extras(json.loads(path.read_text(encoding="utf-8"))) else set())
        for cell in _cells(path):
            if cell["cell_type"] == "code":
                for name in _imports(_src(cell)):
                    if name not in mine:
                        used.setdefault(name, path.name)
    for path in (ROOT / "src" / "inflight").rglob("*.py"):
        rel = path.relative_to(ROOT / "src" / "inflight").as_posix()
        mine = allowed | (serve if rel.startswith(("serve/", "bench/serve")) else set())
        for name in _imports(path.read_text(encoding="utf-8")):
            if name not in mine:
                used.setdefault(name, str(path.relative_to(ROOT)))
    assert not used
    assert "myst_nb" not in {n for p in CHAPTERS for c in _cells(p) if c["cell_type"] == "code" for n in _imports(_src(c))}


def _extra(pyproject: str, name: str) -> set[str]:
    """Import names of a pyproject extra's packages."""
    block = re.search(rf'(?m)^{name} = \[(.*?)\]', pyproject).group(1)
    return {IMPORT_NAMES.get(p, p) for p in re.findall(r'"([^"<>=!~\[ ;]+)', block)}


def test_learner_notebooks_in_sync():
    assert make_learner.main([str(ROOT / "chapters"), "-o", str(ROOT / "learner"), "--check"]) == 0


def test_learner_versions_have_no_solutions():
    for path in LEARNER:
        text = path.read_text(encoding="utf-8")
        assert "### BEGIN SOLUTION" not in text, path.name


@pytest.mark.parametrize("path", LEARNER, ids=lambda p: p.name)
def test_learner_markdown_holds_no_raw_myst(path):
    cells = _cells(path)
    markdown = [_src(c) for c in cells if c["cell_type"] == "markdown"]
    shown = [o["data"]["text/markdown"] for c in cells if make_learner.is_text_cell(c) for o in c["outputs"]]
    raw = {i: myst.count_raw_myst(t) for i, t in enumerate(markdown + shown) if myst.count_raw_myst(t)}
    assert not raw, f"{path.name}: raw MyST left in {sum(raw.values())} places"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_every_glued_number_reaches_the_learner(path):
    """Each {glue:*} role of the chapter is one placeholder in a learner text cell, and the chapter's
    exercises, solutions and admonitions all made it across."""
    chapter_md = "\n".join(_src(c) for c in _cells(path) if c["cell_type"] == "markdown")
    roles = re.findall(r"\{glue(?::\w*)?\}`([^`]+)`", chapter_md)
    learner = _cells(ROOT / "learner" / path.name)
    refs = [m["ref"] for c in learner if make_learner.is_text_cell(c) for m in PLACEHOLDER.finditer(_src(c))]
    assert sorted(refs) == sorted(roles)
    learner_text = "\n".join(_src(c) for c in learner if c["cell_type"] == "markdown" or make_learner.is_text_cell(c))
    n_exercises = len(re.findall(r"(?m)^[`:]{3,}\{exercise\}", chapter_md))
    assert len(re.findall(r"\*\*Exercise \d+ \(", learner_text)) == n_exercises
    assert learner_text.count("<summary>Solution to Exercise") == len(re.findall(r"(?m)^[`:]{3,}\{solution\}", chapter_md))


def test_make_learner_replaces_solution_with_stub():
    src = "def f(x):\n    # Hint: double it\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION\n"
    out = make_learner.strip_solutions(src)
    assert "return 2 * x" not in out and "# Hint: double it" in out
    assert "    raise NotImplementedError(" in out


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_pasting_the_solutions_gives_the_chapters_code_back(path):
    chapter = json.loads(path.read_text(encoding="utf-8"))
    learner = json.loads((ROOT / "learner" / path.name).read_text(encoding="utf-8"))
    pasted = make_learner.paste_solutions(learner, chapter)
    mine = [_src(c) for c in pasted["cells"] if c["cell_type"] == "code" and not make_learner.is_text_cell(c)]
    theirs = ["".join(l for l in _src(c).splitlines(keepends=True) if "### BEGIN SOLUTION" not in l
                      and "### END SOLUTION" not in l) for c in chapter["cells"] if c["cell_type"] == "code"]
    assert [m.rstrip("\n") for m in mine] == [t.rstrip("\n") for t in theirs]
