"""Serve the explorers' JavaScript from the site itself, on the pages that have an explorer.

The chapters' kernel-free explorers (`inflight.book.interactive`) are plotly figures whose outputs
carry only their JSON. This extension
- tells the kernels myst-nb starts that the page will load the scripts (INFLIGHT_EXPLORER_JS=page,
  inherited by every kernel the build starts), so no output embeds plotly.js or points at a CDN;
- copies the site's plotly.js (`_vendor/plotly`: a bundle of only the trace types the explorers
  draw, a quarter of plotly's full one; see _vendor/README.md) and `explorer.js` into `_static`;
- adds `explorer.js`, deferred, to the pages whose body holds an explorer, and to no other page;
  it loads plotly.js (named by its data-plotly attribute) when the first explorer comes near the
  screen, so a page is read before plotly.js is fetched or run.
It also drops the widget state myst-nb saves with a page that ran a live (ipywidgets) explorer:
no widget manager reads it here (`nb_ipywidgets_js` is empty in _config.yml: its loaders come
from CDNs), a live explorer needs a kernel anyway, and the site shows its precomputed twin.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from inflight.book.interactive import ENV, explorer_js

MARKER = 'class="inflight-explorer"'
PLOTLY, SCRIPT = "plotly.min.js", "inflight_explorer.js"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _static_files(app) -> None:
    if app.builder.format != "html":
        return
    bundle = Path(app.srcdir) / "_vendor" / "plotly" / PLOTLY
    if not bundle.is_file():
        raise FileNotFoundError(f"the site's plotly.js is missing: {bundle} (see _vendor/README.md)")
    folder = Path(app.outdir).parent / "explorer_static"
    folder.mkdir(parents=True, exist_ok=True)
    data = bundle.read_bytes()
    (folder / PLOTLY).write_bytes(data)
    (folder / SCRIPT).write_text(explorer_js(), encoding="utf-8")
    app.config.html_static_path.append(str(folder))
    app.inflight_plotly = f"{PLOTLY}?v={hashlib.sha256(data).hexdigest()[:8]}"


def _page_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files") or []
    # the widget state myst-nb saved with the page: no widget manager reads it on this site
    scripts[:] = [s for s in scripts if getattr(s, "attributes", {}).get("type") != WIDGET_STATE]
    if MARKER in context.get("body", ""):
        app.add_js_file(SCRIPT, loading_method="defer", **{"data-plotly": app.inflight_plotly})


def setup(app):
    os.environ[ENV] = "page"
    app.connect("builder-inited", _static_files)
    # after myst-nb adds the page's scripts (500), before single_thebe_config rebuilds the list (900)
    app.connect("html-page-context", _page_scripts, priority=850)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
