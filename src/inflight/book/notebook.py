"""Conventions shared by every chapter notebook: the setup cell and the "Open in Colab" link.

The repository address is read from `_config.yml` (its one home) when the book's tree is at hand;
`tests/test_notebooks.py` checks that every chapter's setup cell and Colab link agree with it.
"""
from __future__ import annotations

from pathlib import Path

SETUP_TEMPLATE = '''\
# Setup: on Colab, install the book's package from its repository (Colab keeps its own torch)
# and turn on widgets; anywhere else, just import it.
import sys
REPO = "{repo}"
if "google.colab" in sys.modules:
    import subprocess
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"git+{{REPO}}@{branch}"], check=True)
    from google.colab import output
    output.enable_custom_widget_manager()
import inflight
print(f"inflight {{inflight.__version__}} on {{inflight.describe_device()}}")'''


def read_repository(config_path: str | Path = "_config.yml") -> tuple[str, str]:
    """(url, branch) of the repository, from the book's `_config.yml`."""
    import yaml

    cfg = yaml.safe_load(Path(config_path).read_text(encoding="utf-8"))
    repo = cfg["repository"]
    return repo["url"].rstrip("/"), repo.get("branch", "main")


def setup_cell(repo: str, branch: str = "main") -> str:
    """The exact source of every chapter's first cell."""
    return SETUP_TEMPLATE.format(repo=repo, branch=branch)


def colab_link(repo: str, notebook_name: str, branch: str = "main") -> str:
    """Colab URL of a chapter's *learner* version (solutions replaced by stubs)."""
    path = repo.split("github.com/", 1)[1]
    return f"https://colab.research.google.com/github/{path}/blob/{branch}/learner/{notebook_name}"


def write_chapter(path: str | Path, cells: list[tuple], config_path: str | Path = "_config.yml") -> None:
    """Author a chapter notebook from (kind, source[, tags]) tuples, kind in {"md", "code"}.

    The setup cell (hidden input) is prepended and outputs are left empty, as the book expects.
    A convenience for writing chapters from a script; the .ipynb it writes is the source of truth.
    """
    import nbformat

    url, branch = read_repository(config_path)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    setup = nbformat.v4.new_code_cell(setup_cell(url, branch))
    setup.metadata["tags"] = ["hide-input"]
    nb.cells.append(setup)
    for cell in cells:
        kind, source, *rest = cell
        tags = list(rest[0]) if rest else []
        source = source.replace("{{COLAB}}", colab_link(url, Path(path).name, branch))
        new = nbformat.v4.new_markdown_cell(source) if kind == "md" else nbformat.v4.new_code_cell(source)
        if tags:
            new.metadata["tags"] = tags
        nb.cells.append(new)
    for cell in nb.cells:  # stable ids keep diffs small
        cell.pop("id", None)
    nb.nbformat, nb.nbformat_minor = 4, 4
    nbformat.write(nb, str(path))
