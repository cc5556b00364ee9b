"""Open every page of the built site in headless Chromium (Debian's, driven by Playwright).

Fails on a JavaScript error, an image that did not load, a chapter page without an
"Open in Colab" link or with one (the header's launch button included) that does not open the
learner version at the release tag, or a code cell or output cut off at the right edge of the text
column (counted per page, collapsed cells opened first); saves a full-page screenshot of each page
for a person to look at.

The explorers (`inflight.book.interactive`): on every page that has one, each is moved — every
slider to another position, every play button pressed — and what is drawn must change each time;
plotly.js must come from the site, once per page that has an explorer and on no other page. A
chapter in EXPLORER_CHAPTERS without an explorer fails. Each explorer's screenshot is saved beside
the pages', and each chapter page's weight is printed (its HTML with the explorers' data, its
images), with the size of the JavaScript it loads for them.

    python tests/site_check.py _build/html --screenshots _build/screenshots
"""
from __future__ import annotations

import argparse
import functools
import http.server
import sys
import threading
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from inflight.book.notebook import colab_link, read_repository  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
# The chapters that must have an explorer (issue 21: every chapter). Add a chapter here when its
# explorer lands: chapters 5-9 are next.
EXPLORER_CHAPTERS = ("01_why_batching", "02_static_batching", "03_continuous_batching", "04_memory_aware_admission")
EXPLORER_JS = ("plotly.min.js", "inflight_explorer.js")  # served by _ext/plotly_explorers.py
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]


def serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # keep CI's log to the findings
            pass

    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


# Every code block and every cell output of the article, with collapsed cells (hide-input, dropdown
# solutions) opened first. An element is cut off when its content is wider than its box (it scrolls
# or clips: scrollWidth > clientWidth) or when it reaches past the right edge of the text column.
_CUT_OFF_JS = """() => {
  const article = document.querySelector('article.bd-article') || document.querySelector('main');
  if (!article) return [];
  article.querySelectorAll('details').forEach(d => { d.open = true; });
  article.querySelectorAll('.toggle-hidden').forEach(e => e.classList.remove('toggle-hidden'));
  article.querySelectorAll('.cell.tag_hide-input > .cell_input, .hide-input .cell_input')
    .forEach(e => { e.style.display = 'block'; });
  const right = article.getBoundingClientRect().right;
  const seen = new Set(), found = [];
  const kinds = [['code', '.cell_input pre, div.highlight pre'],
                 ['output', '.cell_output pre, .cell_output .output, .cell_output table, .cell_output img,'
                            + ' .cell_output .jupyter-widgets, .cell_output > div']];
  for (const [kind, selector] of kinds) {
    for (const el of article.querySelectorAll(selector)) {
      if (seen.has(el) || (kind === 'code' && el.closest('.cell_output'))) continue;
      seen.add(el);
      const box = el.getBoundingClientRect();
      if (box.width === 0) continue;  // not displayed
      const scrolls = el.scrollWidth > el.clientWidth + 1;
      const past = box.right > right + 1;
      // Wrapped lines are not cut off, but a reader sees a table break: count them for the editors.
      let wraps = false;
      if (!scrolls && el.tagName === 'PRE') {
        const ws = el.style.whiteSpace;
        el.style.whiteSpace = 'pre';
        wraps = el.scrollWidth > el.clientWidth + 1;
        el.style.whiteSpace = ws;
      }
      if (scrolls || past || wraps) {
        const text = (el.innerText || el.alt || el.tagName).trim().split('\\n')[0].slice(0, 60);
        found.push({kind, text, scroll: el.scrollWidth, client: el.clientWidth,
                    past: Math.round(box.right - right), cut: scrolls || past});
      }
    }
  }
  return found;
}"""


def cut_off(page) -> tuple[dict, list[str]]:
    """Count the code blocks and outputs cut off at the column's right edge on an open page.

    Returns the counts ({"code": n, "output": n, "wrapped": n}) and one line per cut-off element;
    "wrapped" counts blocks whose long lines wrap inside the column (not a failure)."""
    found = page.evaluate(_CUT_OFF_JS)
    cut = [f for f in found if f["cut"]]
    lines = [f"{f['kind']} cut off ({f['scroll']} px of content in {f['client']} px"
             + (f", {f['past']} px past the column" if f["past"] > 1 else "") + f"): {f['text']!r}"
             for f in cut]
    counts = {"code": sum(f["kind"] == "code" for f in cut), "output": sum(f["kind"] == "output" for f in cut),
              "wrapped": len(found) - len(cut)}
    return counts, lines


def colab_problems(page, rel: str, repo: str) -> list[str]:
    """Every Colab link on a chapter page (its own and the header's launch button) must open the
    learner version at the release tag; and there must be at least one."""
    want = colab_link(repo, Path(rel).with_suffix(".ipynb").name)
    hrefs = page.eval_on_selector_all("a[href*='colab.research.google.com']", "els => els.map(e => e.href)")
    if not hrefs:
        return [f"{rel}: no 'Open in Colab' link"]
    return [f"{rel}: Colab link {h} should open {want}" for h in sorted(set(hrefs)) if h != want]


# What an explorer shows now: its plot area, titles and annotations (the sliders excluded).
_DRAWN_JS = """box => {
  const gd = box.querySelector('.inflight-plot');
  return ['.cartesianlayer', '.infolayer .g-gtitle', '.annotation', '.layer-above']
    .map(sel => Array.from(gd.querySelectorAll(sel)).map(e => e.innerHTML).join('')).join('|');
}"""


def explorer_problems(page, rel: str, shots: Path) -> tuple[int, list[str]]:
    """Move every slider and press every play button of every explorer on the page; what is drawn
    must change each time. Saves a screenshot of each explorer (as first drawn)."""
    problems: list[str] = []
    boxes = page.locator(".inflight-explorer")
    for i in range(boxes.count()):
        box = boxes.nth(i)
        name = f"{rel}: explorer {i + 1}"
        if box.locator(".inflight-plot .main-svg").count() == 0:
            continue  # not drawn: check_page said so
        box.scroll_into_view_if_needed()
        box.screenshot(path=str(shots / (rel.replace("/", "__").removesuffix(".html") + f"__explorer{i + 1}.png")))
        rails = box.locator(".slider-rail-touch-rect")
        for k in range(rails.count()):
            before = box.evaluate(_DRAWN_JS)
            changed = False
            for where in (0.92, 0.08):  # the far end, or the near one if the slider stood there
                rect = rails.nth(k).bounding_box()
                page.mouse.click(rect["x"] + rect["width"] * where, rect["y"] + rect["height"] / 2)
                page.wait_for_timeout(400)
                if box.evaluate(_DRAWN_JS) != before:
                    changed = True
                    break
            if not changed:
                problems.append(f"{name}: moving slider {k + 1} changed nothing that is drawn")
        buttons = box.locator(".updatemenu-button")
        for k in range(buttons.count()):
            before = box.evaluate(_DRAWN_JS)
            buttons.nth(k).click()
            page.wait_for_timeout(1500)
            if box.evaluate(_DRAWN_JS) == before:
                problems.append(f"{name}: pressing play changed nothing that is drawn")
    if boxes.count():
        page.mouse.move(0, 0)  # no hover label left over the page when its width is measured
        page.wait_for_timeout(300)
    return boxes.count(), problems


def script_problems(page, rel: str) -> list[str]:
    """plotly.js and the explorers' script: from the site, once each, on pages with an explorer only."""
    srcs = page.eval_on_selector_all("script[src]", "els => els.map(e => e.src)")
    has = page.locator(".inflight-explorer").count() > 0
    problems = []
    for name in EXPLORER_JS:
        local = [s for s in srcs if s.split("?")[0].endswith("/_static/" + name)]
        if has and len(local) != 1:
            problems.append(f"{rel}: {name} loaded {len(local)} times (once from the site's _static expected)")
        if not has and local:
            problems.append(f"{rel}: {name} loaded by a page without an explorer")
    problems += [f"{rel}: plotly.js from outside the site: {s}" for s in srcs
                 if "plot" in s.rsplit("/", 1)[-1].lower() and not s.startswith("http://127.0.0.1")]
    return problems


def page_weight(site: Path, page_path: Path, page) -> str:
    """One line: the page's HTML (explorers' data included) and images, in kB."""
    html_kb = page_path.stat().st_size / 1024
    data_kb = sum(page.eval_on_selector_all("script.inflight-figure", "els => els.map(e => e.textContent.length)")) / 1024
    # images from files of the site (an inline data: image is counted in the HTML already)
    srcs = page.eval_on_selector_all("article img", "els => els.map(e => e.src)")
    files = {site / src.split("?")[0].split("/", 3)[-1] for src in srcs if src.startswith("http")}
    img_kb = sum(f.stat().st_size for f in files if f.is_file()) / 1024
    return (f"{html_kb:.0f} kB of HTML (of which {data_kb:.0f} kB explorer data) + {img_kb:.0f} kB of images "
            f"= {html_kb + img_kb:.0f} kB")


def check_page(browser, base: str, site: Path, page_path: Path, shots: Path, repo: str) -> list[str]:
    """Everything checked on one page; prints its findings and returns its problems."""
    rel = page_path.relative_to(site).as_posix()
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    page.on("console", lambda msg: errors.append(f"console error: {msg.text}")
            if msg.type == "error" and "Failed to load resource" not in msg.text else None)
    failed_local: list[str] = []
    page.on("requestfailed", lambda req: failed_local.append(req.url) if req.url.startswith(base) else None)
    page.goto(f"{base}/{rel}", wait_until="load")
    page.wait_for_timeout(300)
    problems: list[str] = []
    for k in range(page.locator(".inflight-explorer").count()):  # plotly.js is deferred: let them draw
        try:
            page.locator(".inflight-explorer").nth(k).locator(".main-svg").first.wait_for(timeout=15000)
        except Exception:
            problems.append(f"{rel}: explorer {k + 1} was not drawn")
    if page.locator(".inflight-explorer").count():
        page.wait_for_timeout(500)  # and settle to the column's width
    broken = page.evaluate(
        "() => Array.from(document.images).filter(i => i.offsetParent !== null || i.closest('article'))"
        ".filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.currentSrc || i.src)")
    problems += [f"{rel}: image did not load: {src}" for src in broken]
    if rel.startswith("chapters/"):
        problems += colab_problems(page, rel, repo)
        if page.locator("article img").count() == 0:  # every chapter plots (e.g. MPLBACKEND=Agg drew none)
            problems.append(f"{rel}: no figure on the page")
        print(f"  {rel}: {page_weight(site, page_path, page)}")
    problems += script_problems(page, rel)
    shot = shots / (rel.replace("/", "__").removesuffix(".html") + ".png")
    page.screenshot(path=str(shot), full_page=True)
    explorers, moved = explorer_problems(page, rel, shots)
    problems += moved
    if Path(rel).stem in EXPLORER_CHAPTERS and not explorers:
        problems.append(f"{rel}: no explorer (every chapter in EXPLORER_CHAPTERS has one)")
    if explorers:
        print(f"  {rel}: {explorers} explorer(s), every slider moved and play pressed: "
              f"{'what is drawn changed each time' if not moved else 'FAILED'}")
    counts, cut = cut_off(page)  # after the screenshot: it opens collapsed cells
    problems += [f"{rel}: {line}" for line in cut]
    print(f"  {rel}: {counts['code']} code cells and {counts['output']} outputs cut off at 1280 px; "
          f"{counts['wrapped']} blocks wrap a long line")
    # errors last: those raised while the explorers were moved count too
    problems += [f"{rel}: {e}" for e in errors] + [f"{rel}: request failed: {url}" for url in failed_local]
    print(f"checked {rel} ({len(errors)} errors, {len(broken)} broken images) -> {shot}")
    page.close()
    return problems


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("site", type=Path)
    ap.add_argument("--screenshots", type=Path, default=Path("_build/screenshots"))
    args = ap.parse_args()
    pages = sorted(p for p in args.site.rglob("*.html")
                   if not {"_static", "_sources", "_sphinx_design_static"} & set(p.relative_to(args.site).parts)
                   and p.name not in {"genindex.html", "search.html"})
    if not pages:
        print(f"no pages under {args.site}")
        return 1
    args.screenshots.mkdir(parents=True, exist_ok=True)
    server, base = serve(args.site)
    repo, _branch = read_repository(ROOT / "_config.yml")
    problems: list[str] = []
    for name in EXPLORER_JS:
        path = args.site / "_static" / name
        print(f"explorer script {name}: " + (f"{path.stat().st_size / 1024:.0f} kB, served by the site" if path.is_file()
                                              else "missing from _static"))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        for page_path in pages:
            problems += check_page(browser, base, args.site, page_path, args.screenshots, repo)
        browser.close()
    server.shutdown()
    if problems:
        print("\nSITE CHECK FAILED:", *problems, sep="\n  ")
        return 1
    print(f"\nsite check passed: {len(pages)} pages, screenshots in {args.screenshots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
