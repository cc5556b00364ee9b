"""What the browser check (tests/site_check.py) measures on a page at any viewport: requests to other
hosts, the page's weight, the main thread's long tasks, maths left as raw TeX, an explorer's text
outside its box or over other text (or a control over a control), and figures whose smallest
text renders under 8 CSS px.

Budgets (issue 32), for a reader on a phone or a slow laptop:
- WEIGHT_BUDGET_KB: everything a page loads once a reader has scrolled through it (explorers
  drawn), compressed as the site's host sends text (gzip). 1,200 kB is about 6 s on a slow 4G link
  (1.6 Mbit/s, the figure Lighthouse throttles to); before issue 32 a chapter weighed 2.6 MB
  compressed, of which 1.5 MB was the full plotly.js and 0.45 MB fontawesome.js.
- LONG_TASK_MS: no task may hold the main thread longer than this while the page loads or draws
  an explorer; the reader's taps and scrolls wait for it (plotly.js took one 2.7-3.0 s task).
"""
from __future__ import annotations

import gzip
from pathlib import Path
from urllib.parse import unquote, urlsplit

WEIGHT_BUDGET_KB = 1200
LONG_TASK_MS = 1000
MIN_TEXT_PX = 8.0  # the smallest legible text, in CSS px
COMPRESSED = {".html", ".js", ".css", ".json", ".svg", ".txt", ".map", ".ttf", ".inv"}  # what the host gzips

# Recorded from the first script on: every long task (> 50 ms) of the main thread, [start, ms].
LONG_TASKS_INIT = """
window.__inflightLongTasks = [];
try {
  new PerformanceObserver(list => {
    for (const e of list.getEntries()) window.__inflightLongTasks.push([e.startTime, e.duration]);
  }).observe({type: 'longtask', buffered: true});
} catch (e) {}
"""


class Traffic:
    """Every request a page makes: those to another host are problems; the site's own are weighed
    by the files they read (each once), raw and as the host would compress them."""

    def __init__(self, page, base: str, site: Path):
        self.base, self.site = base, site
        self.remote: list[str] = []
        self.missing: list[str] = []  # the site's own URLs that answered 4xx/5xx
        self.files: dict[str, Path | None] = {}
        page.on("request", self._request)
        page.on("response", lambda r: self.missing.append(f"{r.status} {r.url}")
                if r.status >= 400 and r.url.startswith(base) else None)

    def _request(self, request) -> None:
        url = request.url
        if url.startswith(("data:", "blob:", "about:")):
            return
        if not url.startswith(self.base):
            self.remote.append(url)
            return
        path = unquote(urlsplit(url).path).lstrip("/")
        file = self.site / path
        self.files[url.split("#")[0]] = (file / "index.html" if file.is_dir() else file) if file.exists() else None

    def weight(self) -> tuple[float, float]:
        """(raw kB, compressed kB) of the site's files requested so far."""
        raw = packed = 0
        for file in {f for f in self.files.values() if f is not None}:
            size, small = _sizes(file)
            raw += size
            packed += small
        return raw / 1024, packed / 1024


_SIZES: dict[Path, tuple[int, int]] = {}


def _sizes(file: Path) -> tuple[int, int]:
    if file not in _SIZES:
        data = file.read_bytes()
        small = len(gzip.compress(data, 6)) if file.suffix in COMPRESSED else len(data)
        _SIZES[file] = (len(data), min(small, len(data)))
    return _SIZES[file]


def long_tasks(page, since: float = 0.0) -> tuple[float, float, float]:
    """(longest task, total blocking time (each task's time over 50 ms), now) in ms, for the tasks
    that started after `since` (a previous call's `now`)."""
    tasks, now = page.evaluate("() => [window.__inflightLongTasks || [], performance.now()]")
    mine = [d for start, d in tasks if start >= since]
    return max(mine, default=0.0), sum(max(0.0, d - 50) for d in mine), now


def wait_drawn(box, timeout_ms: int = 15000) -> bool:
    """Whether the explorer was drawn and made ready (explorer.js sets data-ready once its frames
    are in and its controls answer; a redraw, for a new width, clears it meanwhile)."""
    try:
        box.locator(".inflight-plot .main-svg").first.wait_for(timeout=timeout_ms)
        box.page.wait_for_function("b => b.hasAttribute('data-ready')", arg=box.element_handle(), timeout=timeout_ms)
        return True
    except Exception:
        return False


def math_problems(page, rel: str) -> list[str]:
    """Every maths element rendered (KaTeX), none as an error; else the reader sees raw TeX."""
    found = page.evaluate("""() => {
      const all = Array.from(document.querySelectorAll('article .math'));
      const raw = all.filter(e => !e.querySelector('.katex')).map(e => e.textContent.trim().slice(0, 50));
      const bad = Array.from(document.querySelectorAll('article .katex-error')).map(e => e.textContent.slice(0, 50));
      return {n: all.length, raw, bad};
    }""")
    out = [f"{rel}: maths not typeset (raw TeX): {t!r}" for t in found["raw"][:5]]
    if len(found["raw"]) > 5:
        out.append(f"{rel}: ... and {len(found['raw']) - 5} more maths elements not typeset")
    return out + [f"{rel}: maths that KaTeX could not read: {t!r}" for t in found["bad"]]


# An explorer's visible text (plotly's SVG <text>) and its controls, as boxes in CSS px. Hover
# labels and transparent text (a slider whose value labels are hidden) are left out.
_BOXES_JS = """box => {
  const gd = box.querySelector('.inflight-plot');
  const frame = gd.getBoundingClientRect();
  const shown = el => {
    for (let e = el; e && e !== gd; e = e.parentElement) {
      const s = getComputedStyle(e);
      if (s.display === 'none' || s.visibility === 'hidden' || Number(s.opacity) === 0) return false;
    }
    const fill = el.style.fill || getComputedStyle(el).fill || '';
    return !/rgba\\([^)]*,\\s*0\\)/.test(fill) && Number(el.style.fillOpacity || getComputedStyle(el).fillOpacity) !== 0;
  };
  const kindOf = el => {
    const g = el.closest('.g-gtitle, .annotation, .legend, .xtick, .ytick, .g-xtitle, .g-ytitle, .g-x2title,'
      + ' .slider-container, .updatemenu-container, .textpoint, .g-y2title, .g-x3title, .g-y3title');
    if (!g) return 'text';
    const c = g.getAttribute('class') || '';
    return c.split(' ')[0];
  };
  const items = [];
  for (const t of gd.querySelectorAll('.main-svg text')) {
    if (t.closest('.hoverlayer') || !t.textContent.trim() || !shown(t)) continue;
    const r = t.getBoundingClientRect();
    if (r.width < 1 || r.height < 1) continue;
    const own = t.closest('.updatemenu-button');  // a button's own label
    items.push({what: 'text', kind: kindOf(t), label: t.textContent.trim().slice(0, 40), slider: -1,
                owner: own ? Array.from(gd.querySelectorAll('.updatemenu-button')).indexOf(own) : -1,
                x0: r.left, x1: r.right, y0: r.top, y1: r.bottom});
  }
  const sliders = Array.from(gd.querySelectorAll('.slider-group'));
  for (const [sel, name] of [['.updatemenu-button', 'button'], ['.slider-rail-rect', 'slider rail'],
                             ['.slider-grip-rect', 'slider handle']]) {
    for (const el of gd.querySelectorAll(sel)) {
      const r = el.getBoundingClientRect();
      if (r.width < 1 || r.height < 1) continue;
      const g = el.closest('.slider-group');
      items.push({what: 'control', kind: name, label: name, slider: g ? sliders.indexOf(g) : -1,
                  owner: name === 'button' ? Array.from(gd.querySelectorAll(sel)).indexOf(el) : -2,
                  x0: r.left, x1: r.right, y0: r.top, y1: r.bottom});
    }
  }
  return {frame: {x0: frame.left, x1: frame.right, y0: frame.top, y1: frame.bottom}, items};
}"""

def _overlap(a: dict, b: dict, slack: float = 1.5) -> bool:
    return (min(a["x1"], b["x1"]) - max(a["x0"], b["x0"]) > slack
            and min(a["y1"], b["y1"]) - max(a["y0"], b["y0"]) > slack)


def _related(a: dict, b: dict) -> bool:
    """Parts of one control that are meant to touch: a slider's rail and handle, a button and its label."""
    if a["what"] != b["what"]:
        return a["owner"] >= 0 and a["owner"] == b["owner"]
    return a["what"] == "control" and "button" not in (a["kind"], b["kind"]) and a["slider"] == b["slider"]


def layout_problems(page, box, name: str) -> list[str]:
    """An explorer's text must lie inside its box and not on other text; a control (button, slider
    rail or handle) must not cover text or another control."""
    found = box.evaluate(_BOXES_JS)
    frame, items = found["frame"], found["items"]
    problems = []
    for it in items:
        if it["what"] == "text" and (it["x0"] < frame["x0"] - 1 or it["x1"] > frame["x1"] + 1
                                     or it["y0"] < frame["y0"] - 1 or it["y1"] > frame["y1"] + 1):
            side = "right" if it["x1"] > frame["x1"] + 1 else "left" if it["x0"] < frame["x0"] - 1 else "top/bottom"
            problems.append(f"{name}: {it['kind']} text {it['label']!r} runs out of the explorer's box ({side})")
    for i, a in enumerate(items):
        for b in items[i + 1:]:
            if not _related(a, b) and _overlap(a, b):
                problems.append(f"{name}: {a['kind']} {a['label']!r} overlaps {b['kind']} {b['label']!r}")
    return problems


def figure_text_px(site: Path, page) -> list[tuple[str, float | None, float]]:
    """(image, its smallest text in CSS px as shown now (None: unknown), shown width) for every
    figure of the article that is displayed. The smallest text is recorded by the build in the
    PNG (inflight.book.site_figures: "inflight:min-text-pt", and its dpi)."""
    from PIL import Image

    shown = page.eval_on_selector_all(
        "article img", "els => els.filter(e => e.getBoundingClientRect().width > 0 && !e.closest('.inflight-explorer'))"
        ".map(e => [e.currentSrc || e.src, e.naturalWidth, e.getBoundingClientRect().width])")
    out = []
    for src, natural, width in shown:
        path = site / unquote(urlsplit(src).path).lstrip("/")
        if not path.is_file() or not natural:
            continue
        with Image.open(path) as im:
            info = dict(im.info)
        pt = info.get("inflight:min-text-pt")
        dpi = info.get("dpi", (72, 72))[0]
        px = None if pt in (None, "") else float(pt) * float(dpi) / 72 * width / natural
        out.append((path.name, px, width))
    return out


def figure_problems(site: Path, page, rel: str) -> list[str]:
    problems = []
    for name, px, width in figure_text_px(site, page):
        if px is None:
            problems.append(f"{rel}: figure {name[:16]}… carries no record of its smallest text "
                            "(inflight:min-text-pt): it was not drawn by the site's figure convention")
        elif px < MIN_TEXT_PX - 0.05:
            problems.append(f"{rel}: figure {name[:16]}…'s smallest text renders at {px:.1f} CSS px "
                            f"(shown {width:.0f} px wide), under {MIN_TEXT_PX:g}")
    return problems
