"""The book reads the table of contents and nothing else: a virtual environment (`.venv`, where the
README makes one) or any other tool's folder inside the checkout is never read as a source.

Jupyter Book's `only_build_toc_files` excludes files outside `_toc.yml`, but it walks the folders with
`glob`, which skips hidden ones: `.venv`, `.tox` and `.mypy_cache` were read as sources (182 files of
a venv, and a `huggingface_hub` template broke the build). `_config.yml`'s `exclude_patterns` now
names them. The test asks Sphinx itself, configured by Jupyter Book from the real `_config.yml`
and `_toc.yml`, which documents it would read from a copy of the book's layout with such folders
beside it: the decision the build makes, without executing a notebook.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

# sphinx_external_toc's collector lookup walks module globals and touches torch.distributed's deprecated alias
pytestmark = pytest.mark.filterwarnings("ignore:.*reduce_op.*:FutureWarning")

ROOT = Path(__file__).resolve().parent.parent
#: folders other tools make inside a checkout
TOOL_FOLDERS = [".venv", "venv", "env", ".tox", ".mypy_cache", ".pytest_cache", "node_modules", "_build",
                ".ipynb_checkpoints", "chapters/.ipynb_checkpoints", ".git", "src/inflight.egg-info"]
#: what broke the README's build: a Markdown template whose front matter is not valid YAML for Sphinx
BREAKING_MD = "---\n{{ card_data }}\n---\n\n# {{ model_id }}\n\n```{not-a-directive}\n```\n"


def _toc_docnames(toc: dict) -> set[str]:
    names = {toc["root"]}
    for part in toc.get("parts", []):
        for ch in part.get("chapters", []):
            names.add(ch["file"])
    return names


def _found_docs(srcdir: Path, scratch: Path) -> set[str]:
    """The documents Sphinx would read, with the configuration Jupyter Book derives from `_config.yml`."""
    from jupyter_book.config import get_final_config
    from sphinx.application import Sphinx
    from sphinx.util.docutils import docutils_namespace, patch_docutils

    sphinx_config, _ = get_final_config(user_yaml=srcdir / "_config.yml", cli_config={"latex_individualpages": False},
                                         sourcedir=srcdir)
    with patch_docutils(srcdir), docutils_namespace():
        app = Sphinx(srcdir=str(srcdir), confdir=None, outdir=str(scratch / "out"), doctreedir=str(scratch / "doctrees"),
                     buildername="dummy", confoverrides=sphinx_config, status=None, warning=None)
        app.env.find_files(app.config, app.builder)
        return set(app.env.found_docs)


@pytest.fixture()
def book_with_tool_folders(tmp_path: Path) -> tuple[Path, set[str]]:
    for name in ("_config.yml", "_toc.yml", "references.bib"):
        shutil.copy(ROOT / name, tmp_path / name)
    for name in ("_ext", "_static"):
        if (ROOT / name).exists():
            shutil.copytree(ROOT / name, tmp_path / name)
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    wanted = _toc_docnames(toc)
    for doc in wanted:  # a stub per page of the table of contents (nothing is executed)
        path = tmp_path / f"{doc}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {doc}\n")
    for folder in TOOL_FOLDERS:
        deep = tmp_path / folder / "lib/python3.11/site-packages/huggingface_hub/templates"
        deep.mkdir(parents=True)
        for suffix in (".md", ".ipynb", ".rst"):
            (deep / f"modelcard_template{suffix}").write_text(BREAKING_MD)
        (tmp_path / folder / "README.md").write_text(BREAKING_MD)
    return tmp_path, wanted


def test_only_the_table_of_contents_is_read(book_with_tool_folders):
    srcdir, wanted = book_with_tool_folders
    found = _found_docs(srcdir, srcdir / "_build")
    strays = sorted(d for d in found if d not in wanted)
    assert not strays, f"the book would read files outside _toc.yml as sources: {strays[:10]}"
    assert wanted <= found, f"pages of _toc.yml the book would not read: {sorted(wanted - found)}"


def test_the_real_checkout_reads_only_its_table_of_contents(tmp_path):
    """The same decision on this checkout as it is (with whatever venv a reader made in it)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    found = _found_docs(ROOT, tmp_path)
    assert found == _toc_docnames(toc), sorted(found ^ _toc_docnames(toc))
