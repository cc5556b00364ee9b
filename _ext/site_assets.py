"""What every page of the site loads, and nothing from another host (issue 32).

- Maths is typeset by KaTeX served by the site (`_vendor/katex`, see _vendor/README.md): a math
  renderer for Sphinx (`html_math_renderer: inflight_katex` in _config.yml) that writes the same
  markup as Sphinx's MathJax one and adds KaTeX (about 90 kB compressed, fonts fetched as used)
  only to the pages with maths, where `inflight-math.js` typesets it. Sphinx's default fetched
  MathJax from a CDN, on every page.
- The theme's fontawesome.js (1.5 MB, the SVG version of Font Awesome, for icons a site adds by
  itself) is left out: the theme's stylesheet already draws every icon this site shows from its
  web fonts (`templates/layout.html` filters the theme's own tag out of the page). Those fonts
  (270 kB for the two a page fetches) are cut down to the icons the site's pages and the theme's
  scripts name, once the site is written (fontTools, which matplotlib brings, with brotli).
- `static/inflight-site.js` on every page: the sidebar buttons' fix (the theme bug it works
  around is described there), hints on what scrolls sideways, code lines that keep their shape.
- Figures stay legible on a narrow screen: a figure drawn by the site's convention records the
  size of its smallest text (`inflight.book.site_figures`); its <img> gets the minimum width at
  which that text is 8 CSS px, inside a box that scrolls when the column is narrower.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from markupsafe import Markup
from sphinx.ext.mathjax import html_visit_displaymath, html_visit_math

HERE = Path(__file__).parent
MIN_TEXT_PX = 8.0
_IMG = re.compile(r'<img\b[^>]*?\bsrc="([^"]*?_images/([^"/]+\.png))"[^>]*>')
_FONTAWESOME = re.compile(r'\s*<!-- So that users can add custom icons -->|\s*<script[^>]*/fontawesome\.js[^>]*></script>')


def _static(app) -> None:
    if app.builder.format != "html":
        return
    katex = Path(app.srcdir) / "_vendor" / "katex"
    if not (katex / "katex.min.js").is_file():
        raise FileNotFoundError(f"the site's KaTeX is missing: {katex} (see _vendor/README.md)")
    folder = Path(app.outdir).parent / "site_static"
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(katex, folder / "katex", ignore=shutil.ignore_patterns("LICENSE"))
    for name in ("inflight-site.js", "inflight-math.js"):
        shutil.copy(HERE / "static" / name, folder / name)
    app.config.html_static_path.append(str(folder))
    app.builder.templates.environment.filters["without_fontawesome"] = lambda html: Markup(_FONTAWESOME.sub("", str(html)))


def legible_width(png: Path) -> float | None:
    """The width in CSS px under which the figure's smallest text would render under 8 CSS px,
    from what the figure recorded (None: nothing recorded)."""
    from PIL import Image

    from inflight.book.site_figures import MIN_TEXT_KEY, SCALE

    with Image.open(png) as im:
        pt, dpi, natural = im.info.get(MIN_TEXT_KEY), im.info.get("dpi", (0,))[0], im.width
    if not pt or not dpi:
        return None
    return MIN_TEXT_PX * natural * 72 / (float(pt) * float(dpi)) if natural else None


def _figures(app, body: str) -> str:
    sources = {Path(out).name: Path(app.srcdir) / src for src, out in app.builder.images.items()}

    def wrap(m: re.Match) -> str:
        src = sources.get(m.group(2))
        width = legible_width(src) if src is not None and src.is_file() else None
        if width is None:
            return m.group(0)
        img = m.group(0)
        # its width as drawn (height follows: a fixed one would stretch it in a narrow column), never
        # narrower than its text allows
        shown = re.search(r'style="[^"]*?width:\s*([\d.]+px)', img)
        img = re.sub(r'\s*style="[^"]*"', "", img)
        style = (f"width: {shown.group(1)}; " if shown else "") + f"min-width: {width:.0f}px"
        img = img.replace("<img ", f'<img style="{style}" ', 1)
        return f'<span class="inflight-figure">{img}</span>'

    return _IMG.sub(wrap, body)


def _page(app, pagename, templatename, context, doctree):
    if app.builder.format != "html":
        return
    app.add_js_file("inflight-site.js", loading_method="defer")
    if "body" in context:
        context["body"] = _figures(app, context["body"])
    if app.env.get_domain("math").has_equations(pagename):
        app.add_css_file("katex/katex.min.css")
        app.add_js_file("katex/katex.min.js", loading_method="defer")
        app.add_js_file("inflight-math.js", loading_method="defer")


_ICON = re.compile(r'((?:\.fa-[a-z0-9-]+:before,?)+)\{content:"\\([0-9a-f]+)"\}')


def subset_icon_fonts(site: Path) -> dict[str, tuple[int, int]]:
    """Cut the theme's Font Awesome fonts down to the icons that a page or a theme script names.
    Returns each font's bytes before and after."""
    from fontTools import subset
    from fontTools.ttLib import TTFont

    css = (site / "_static" / "styles" / "pydata-sphinx-theme.css").read_text(encoding="utf-8")
    code = {name: int(hexcode, 16) for names, hexcode in _ICON.findall(css) for name in re.findall(r"fa-[a-z0-9-]+", names)}
    named: set[str] = set()
    for file in [*site.rglob("*.html"), *(site / "_static" / "scripts").glob("*.js")]:
        named |= set(re.findall(r"fa-[a-z0-9-]+", file.read_text(encoding="utf-8", errors="ignore")))
    wanted = {code[n] for n in named if n in code}
    sizes = {}
    for path in sorted((site / "_static" / "vendor" / "fontawesome" / "webfonts").glob("*.woff2")):
        before = path.stat().st_size
        font = TTFont(path)
        options = subset.Options()
        options.flavor = "woff2"
        cutter = subset.Subsetter(options)
        cutter.populate(unicodes=wanted)
        cutter.subset(font)
        font.flavor = "woff2"
        font.save(path)
        sizes[path.name] = (before, path.stat().st_size)
    return sizes


def _finished(app, exc) -> None:
    if exc is None and app.builder.format == "html":
        subset_icon_fonts(Path(app.outdir))


def _templates(app, config) -> None:
    config.templates_path = [str(HERE / "templates"), *config.templates_path]


def setup(app):
    app.add_html_math_renderer("inflight_katex", (html_visit_math, None), (html_visit_displaymath, None))
    app.connect("config-inited", _templates)
    app.connect("builder-inited", _static)
    app.connect("html-page-context", _page, priority=800)
    app.connect("build-finished", _finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
