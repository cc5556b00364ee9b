"""Keep each <script> once per page.

Jupyter Book always loads sphinx-thebe, which registers its configuration as an inline script
(`const THEBE_JS_URL = ...`) from the `env-before-read-docs` event, after the HTML builder has
started. Sphinx 7.4 then holds that script twice: the copy handed straight to the builder has the
filename `None`, the copy the builder later re-reads from the extension registry has `''`. Its
duplicate check compares filenames exactly, so both reach the page, and the browser stops at the
second `const` with "Identifier 'THEBE_JS_URL' has already been declared" (sphinx-togglebutton's
inline `var` is doubled the same way, harmlessly). This extension drops such duplicates, treating
`None` and `''` alike, before each page is written.
"""
from __future__ import annotations


def _dedupe_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        attributes = getattr(script, "attributes", {})
        key = (getattr(script, "filename", script) or "", tuple(sorted(attributes.items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def setup(app):
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
