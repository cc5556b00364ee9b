"""How a chapter's notebook cells read on the site, where no kernel runs (issue 32).

- The setup cell (the first cell: on Colab it installs the package, elsewhere it imports it, and
  prints the machine) is plumbing for the notebook's reader. On the site its code and its toggle
  are left out, and the machine it printed becomes a line under the chapter's title saying what it
  is: the machine that built the page, whose numbers these are.
- A live explorer's cell (its code calls an `*_live(...)` explorer of `inflight.book` and its
  output is removed: an ipywidgets explorer needs a kernel) shows only code on the site; a note
  after it says so, and where the explorer moves (Jupyter, or the chapter on Colab).
- The build's kernels draw their figures by the site's convention (`inflight.book.site_figures`,
  twice their size, their smallest text recorded): an IPython startup file, in an IPython
  directory of the build's own (IPYTHONDIR), installs it in every kernel myst-nb starts.
"""
from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from docutils import nodes

SETUP_MARK = "# Setup:"  # how inflight.book.notebook's setup cell begins
LIVE_CALL = re.compile(r"\b\w+_live\(")
STARTUP = "from inflight.book.site_figures import install\ninstall()\n"


def _kernels(app) -> None:
    if app.builder.format != "html":
        return
    folder = Path(app.outdir).parent / "ipython"
    startup = folder / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    (startup / "00-inflight-site-figures.py").write_text(STARTUP, encoding="utf-8")
    os.environ["IPYTHONDIR"] = str(folder)


def _cells(doctree) -> list:
    return [n for n in doctree.findall(nodes.container) if "cell" in n.get("classes", [])]


def _source(cell) -> str:
    for part in cell.findall(nodes.container):
        if "cell_input" in part.get("classes", []):
            return part.astext()
    return ""


def _built_on(doctree, cell) -> None:
    """Replace the setup cell by a line under the title: the machine the page was built on."""
    printed = " ".join(b.astext().strip() for b in cell.findall(nodes.literal_block)
                       if not any("cell_input" in p.get("classes", []) for p in _parents(b)))
    cell.parent.remove(cell)
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None or not printed:
        return
    note = nodes.paragraph(classes=["inflight-built-on"])
    note += nodes.Text(f"The numbers on this page were measured when the site was built, on its build machine: "
                       f"{printed}. Run the chapter as a notebook to measure them on yours.")
    title = next((i for i, child in enumerate(section.children) if isinstance(child, nodes.title)), -1)
    section.insert(title + 1, note)


def _parents(node):
    while node.parent is not None:
        node = node.parent
        yield node


def _live_note(app, docname: str, cell) -> None:
    from inflight.book.notebook import colab_link

    repo = app.config.html_theme_options.get("repository_url", "").rstrip("/")
    note = nodes.container(classes=["inflight-live-note"])
    para = nodes.paragraph()
    para += nodes.Text("Here on the site, the cell above is only code: its live explorer needs a running "
                       "kernel. It moves in Jupyter, or ")
    if "github.com/" in repo:
        para += nodes.reference(text="on Colab", refuri=colab_link(repo, PurePosixPath(docname).name + ".ipynb"))
    else:
        para += nodes.Text("on Colab")
    para += nodes.Text(" (the explorer before it is its precomputed twin).")
    note += para
    cell.parent.insert(cell.parent.index(cell) + 1, note)


def _doctree(app, doctree) -> None:
    docname = app.env.docname
    if not docname.startswith("chapters/"):
        return
    cells = _cells(doctree)
    if cells and _source(cells[0]).lstrip().startswith(SETUP_MARK):
        _built_on(doctree, cells[0])
        cells = cells[1:]
    for cell in cells:
        if "tag_remove-output" in cell.get("classes", []) and LIVE_CALL.search(_source(cell)):
            _live_note(app, docname, cell)


def setup(app):
    app.connect("builder-inited", _kernels)
    app.connect("doctree-read", _doctree)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
