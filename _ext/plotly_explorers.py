"""Serve the explorers' JavaScript from the site itself, once per page that has an explorer.

The chapters' kernel-free explorers (`inflight.book.interactive`) are plotly figures whose outputs
carry only their JSON. This extension
- tells the kernels myst-nb starts that the page will load the scripts (INFLIGHT_EXPLORER_JS=page,
  inherited by every kernel the build starts), so no output embeds plotly.js or points at a CDN;
- copies plotly.js (the copy inside the `plotly` package) and `explorer.js` into the site's `_static`;
- adds both, deferred, to the pages whose body holds an explorer, and to no other page.
It also drops the widget state myst-nb saves with a page that ran a live (ipywidgets) explorer:
no widget manager reads it here (`nb_ipywidgets_js` is empty in _config.yml: its loaders come
from CDNs), a live explorer needs a kernel anyway, and the site shows its precomputed twin.
"""
from __future__ import annotations

import os
from pathlib import Path

from inflight.book.interactive import ENV, explorer_js

MARKER = 'class="inflight-explorer"'
SCRIPTS = ("plotly.min.js", "inflight_explorer.js")
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _static_files(app) -> None:
    import plotly

    folder = Path(app.outdir).parent / "explorer_static"
    folder.mkdir(parents=True, exist_ok=True)
    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    (folder / SCRIPTS[0]).write_bytes(plotly_js.read_bytes())
    (folder / SCRIPTS[1]).write_text(explorer_js(), encoding="utf-8")
    app.config.html_static_path.append(str(folder))


def _page_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files") or []
    # the widget state myst-nb saved with the page: no widget manager reads it on this site
    scripts[:] = [s for s in scripts if getattr(s, "attributes", {}).get("type") != WIDGET_STATE]
    if MARKER in context.get("body", ""):
        for name in SCRIPTS:  # plotly.js first: deferred scripts run in order
            app.add_js_file(name, loading_method="defer")


def setup(app):
    os.environ[ENV] = "page"
    app.connect("builder-inited", _static_files)
    # after myst-nb adds the page's scripts (500), before single_thebe_config rebuilds the list (900)
    app.connect("html-page-context", _page_scripts, priority=850)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
