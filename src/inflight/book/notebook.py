"""Conventions shared by every chapter notebook: the setup cell and the "Open in Colab" link.

One Colab destination, and a reproducible one. Every Colab entry point (the link at the top of each
chapter and the site's launch button) opens the *learner* version at the release tag
`v<package version>`, and that notebook's setup cell installs the package from the same tag. The
notebook a reader opens and the code it installs are therefore the ones the page was written
for, whatever the default branch holds later. The deploy workflow creates the tag when it
publishes a version for the first time, and refuses to publish changed chapters or package code
under a version that is already tagged (bump `version` in pyproject.toml and `inflight.__version__`).

The repository's address has one home, `_config.yml`; after changing it or the version, run

    python -m inflight.book.notebook chapters/     # rewrite every setup cell and Colab link

`tests/test_notebooks.py` checks that every chapter agrees.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

SETUP_TEMPLATE = '''\
# Setup: on Colab, install the release of the book's package this page was written for (Colab
# keeps its own torch) and turn on widgets; anywhere else, just import it.
import sys
REPO, RELEASE = "{repo}", "{tag}"
if "google.colab" in sys.modules:
    import subprocess
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"{package}git+{{REPO}}@{{RELEASE}}"], check=True)
    from google.colab import output
    output.enable_custom_widget_manager()
import inflight
print(f"inflight {{inflight.__version__}} on {{inflight.describe_device()}}")'''

COLAB_LINK = re.compile(r"https://colab\.research\.google\.com/github/[^\s)\"']+")


def read_repository(config_path: str | Path = "_config.yml") -> tuple[str, str]:
    """(url, branch) of the repository, from the book's `_config.yml`."""
    import yaml

    cfg = yaml.safe_load(Path(config_path).read_text(encoding="utf-8"))
    repo = cfg["repository"]
    return repo["url"].rstrip("/"), repo.get("branch", "main")


def release_tag(version: str | None = None) -> str:
    """The git tag of a package version (default: this package's): `v0.1.0`."""
    if version is None:
        from inflight import __version__ as version
    return f"v{version}"


def setup_cell(repo: str, tag: str | None = None, extras: tuple[str, ...] | list[str] = ()) -> str:
    """The exact source of every chapter's first cell; `extras` (a chapter's `inflight.extras`
    metadata, e.g. ["serve"]) are installed with the package on Colab."""
    package = f"inflight[{','.join(extras)}] @ " if extras else ""
    return SETUP_TEMPLATE.format(repo=repo, tag=tag or release_tag(), package=package)


def chapter_extras(nb: Any) -> list[str]:
    """The package extras a chapter needs (its notebook metadata `inflight.extras`)."""
    return list(nb.get("metadata", {}).get("inflight", {}).get("extras", []))


def colab_link(repo: str, notebook_name: str, tag: str | None = None) -> str:
    """Colab URL of a chapter's *learner* version (solutions replaced by stubs), at the release tag."""
    if "github.com/" not in repo:
        raise ValueError(f"Colab opens notebooks from GitHub; {repo!r} is not a GitHub repository URL")
    path = repo.split("github.com/", 1)[1]
    return f"https://colab.research.google.com/github/{path}/blob/{tag or release_tag()}/learner/{notebook_name}"


def sync_chapter(path: str | Path, repo: str, tag: str | None = None) -> bool:
    """Rewrite a chapter's setup cell and Colab links for `repo` and `tag`; True if it changed."""
    import nbformat

    path = Path(path)
    text = path.read_text(encoding="utf-8")
    nb = nbformat.reads(text, as_version=4)
    if not nb.cells or nb.cells[0].cell_type != "code":
        raise ValueError(f"{path}: the first cell must be the setup (code) cell")
    nb.cells[0].source = setup_cell(repo, tag, chapter_extras(nb))
    link = colab_link(repo, path.name, tag)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = COLAB_LINK.sub(link, cell.source)
    new = nbformat.writes(nb) + "\n"
    if new != text:
        path.write_text(new, encoding="utf-8")
        return True
    return False


def write_chapter(path: str | Path, cells: list[tuple], config_path: str | Path = "_config.yml") -> None:
    """Author a chapter notebook from (kind, source[, tags]) tuples, kind in {"md", "code"}.

    The setup cell (hidden input) is prepended and outputs are left empty, as the book expects.
    A convenience for writing chapters from a script; the .ipynb it writes is the source of truth.
    """
    import nbformat

    url, _branch = read_repository(config_path)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    setup = nbformat.v4.new_code_cell(setup_cell(url))
    setup.metadata["tags"] = ["hide-input"]
    nb.cells.append(setup)
    for cell in cells:
        kind, source, *rest = cell
        tags = list(rest[0]) if rest else []
        source = source.replace("{{COLAB}}", colab_link(url, Path(path).name))
        new = nbformat.v4.new_markdown_cell(source) if kind == "md" else nbformat.v4.new_code_cell(source)
        if tags:
            new.metadata["tags"] = tags
        nb.cells.append(new)
    for cell in nb.cells:  # stable ids keep diffs small
        cell.pop("id", None)
    nb.nbformat, nb.nbformat_minor = 4, 4
    nbformat.write(nb, str(path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Rewrite the chapters' setup cells and Colab links "
                                     "from _config.yml and the package version.")
    parser.add_argument("chapters", type=Path, help="folder of chapter notebooks")
    parser.add_argument("--config", type=Path, default=Path("_config.yml"))
    args = parser.parse_args(argv)
    repo, _branch = read_repository(args.config)
    changed = [p.name for p in sorted(args.chapters.glob("*.ipynb")) if sync_chapter(p, repo)]
    print(f"{len(changed)} chapter(s) rewritten for {repo} @ {release_tag()}: {', '.join(changed) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
