"""Point the header's Colab launch button at the same notebook as the chapter's own link.

sphinx-book-theme builds its "launch on Colab" URL from the page's source path and the repository
branch: `chapters/NN.ipynb` on `main`, the version with the solutions printed, at whatever `main`
holds later. Every Colab entry point of this book must open the *learner* version at the release
tag the page was written for (see `inflight.book.notebook`), so this extension rewrites that one
URL after the theme has built it.
"""
from __future__ import annotations

from pathlib import PurePosixPath

from inflight.book.notebook import colab_link


def _learner_launch_button(app, pagename, templatename, context, doctree):
    if not pagename.startswith("chapters/"):
        return
    repo = app.config.html_theme_options.get("repository_url", "").rstrip("/")
    url = colab_link(repo, PurePosixPath(pagename).name + ".ipynb")
    for group in context.get("header_buttons", []):
        for button in group.get("buttons", []) if group.get("label") == "launch-buttons" else []:
            if button.get("text") == "Colab":
                button["url"] = url
                button["tooltip"] = "Open the learner version on Colab"


def setup(app):
    # after sphinx-book-theme's add_launch_buttons (priority 501)
    app.connect("html-page-context", _learner_launch_button, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
