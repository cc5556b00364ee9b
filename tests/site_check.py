"""Open every page of the built site in headless Chromium (Debian's, driven by Playwright), as a
reader at 1280 px and as one on a phone (tests/site_phone.py: 390 × 844, touch, device scale 3).

At 1280 px it fails on a JavaScript error, an image that did not load, a chapter page without an
"Open in Colab" link or with one (the header's launch button included) that does not open the
learner version at the release tag, a code cell or output cut off at the right edge of the text
column (counted per page, collapsed cells opened first: a block that scrolls sideways with the
site's hint is counted apart, not as cut off), code wrapped inside a word, a ☰ button that does not
collapse the sidebar, and on what both passes check (tests/site_probe.py): a request to another
host, maths left as raw TeX, a figure whose smallest text renders under 8 CSS px, an explorer's text
out of its box or over other text, a task that holds the main thread too long while the page loads.
It saves a full-page screenshot of each page for a person to look at.

The explorers (`inflight.book.interactive`): on every page that has one, each is scrolled to (they
are drawn when they come near the screen) and moved — every slider to another position, every
play button pressed — and what is drawn must change each time; explorer.js must come from the
site, once per page that has an explorer and on no other page, and plotly.js from the site when
the first explorer is drawn. A chapter in EXPLORER_CHAPTERS without an explorer fails. Each
explorer's screenshot is saved beside the pages', and each page's weight (everything it loaded,
raw and compressed) and its main thread's longest task are printed, at both sizes.

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
sys.path.insert(0, str(ROOT / "tests"))
from inflight.book.notebook import colab_link, read_repository  # noqa: E402
from site_phone import phone_pass  # noqa: E402
from site_probe import (LONG_TASK_MS, LONG_TASKS_INIT, Traffic, figure_problems, layout_problems,  # noqa: E402
                        long_tasks, math_problems, wait_drawn)

CHROMIUM = "/usr/bin/chromium"
# The chapters that must have an explorer (issue 21: every chapter).
EXPLORER_CHAPTERS = ("01_why_batching", "02_static_batching", "03_continuous_batching", "04_memory_aware_admission",
                     "05_paged_kv_cache", "06_scheduler_loop", "07_serving", "08_sharing_and_fairness",
                     "09_serving_over_the_network", "10_tensor_parallelism", "11_many_servers",
                     "12_speculative_decoding")
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
# solutions) opened first. An element is cut off when its content reaches past the right edge of
# the text column, or when it is wider than its box (it scrolls or clips) with no hint that it does
# (the site's script marks what scrolls: .inflight-scrolls, with its hint above it). Code wrapped
# inside a word (overflow-wrap: anywhere, word-break: break-all) is a problem of its own.
_CUT_OFF_JS = """() => {
  const article = document.querySelector('article.bd-article') || document.querySelector('main');
  if (!article) return [];
  article.querySelectorAll('details').forEach(d => { d.open = true; });
  article.querySelectorAll('.toggle-hidden').forEach(e => e.classList.remove('toggle-hidden'));
  article.querySelectorAll('.cell.tag_hide-input > .cell_input, .hide-input .cell_input')
    .forEach(e => { e.style.display = 'block'; });
  window.dispatchEvent(new Event('resize'));
  return new Promise(done => setTimeout(() => {
    const right = article.getBoundingClientRect().right;
    const seen = new Set(), found = [];
    const kinds = [['code', '.cell_input pre, div.highlight pre'],
                   ['output', '.cell_output pre, .cell_output .output, .cell_output table, .cell_output img,'
                              + ' .cell_output .jupyter-widgets, .cell_output > div']];
    for (const [kind, selector] of kinds) {
      for (const el of article.querySelectorAll(selector)) {
        if (seen.has(el) || (kind === 'code' && el.closest('.cell_output')) || el.closest('.inflight-explorer')) continue;
        seen.add(el);
        const box = el.getBoundingClientRect();
        if (box.width === 0) continue;  // not displayed
        const scroller = [el, ...el.querySelectorAll('*')].find(e => e.scrollWidth > e.clientWidth + 1
                                                                     && e.clientWidth > 0 && !e.closest('.inflight-explorer'));
        const hinted = scroller && scroller.classList.contains('inflight-scrolls');
        const past = box.right > right + 1;
        const s = getComputedStyle(el);
        const midword = el.tagName === 'PRE' && (s.overflowWrap === 'anywhere' || s.wordBreak === 'break-all');
        if (scroller || past || midword) {
          const text = (el.innerText || el.alt || el.tagName).trim().split('\\n')[0].slice(0, 60);
          found.push({kind, text, scroll: scroller ? scroller.scrollWidth : 0, client: scroller ? scroller.clientWidth : 0,
                      past: Math.round(box.right - right), cut: past || (scroller && !hinted), hinted, midword});
        }
      }
    }
    done(found);
  }, 400));
}"""


def cut_off(page) -> tuple[dict, list[str]]:
    """Count the code blocks and outputs cut off at the column's right edge on an open page.

    Returns the counts ({"code": n, "output": n, "scrolls": n}) and one line per problem;
    "scrolls" counts blocks that scroll sideways with the site's hint (not a failure)."""
    found = page.evaluate(_CUT_OFF_JS)
    cut = [f for f in found if f["cut"]]
    lines = [f"{f['kind']} cut off ({f['scroll']} px of content in {f['client']} px"
             + (f", {f['past']} px past the column" if f["past"] > 1 else "") + f"): {f['text']!r}"
             for f in cut]
    lines += [f"{f['kind']} wrapped inside words (overflow-wrap: anywhere): {f['text']!r}" for f in found if f["midword"]]
    counts = {"code": sum(f["kind"] == "code" for f in cut), "output": sum(f["kind"] == "output" for f in cut),
              "scrolls": sum(1 for f in found if f["hinted"] and not f["cut"])}
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


def _changed(page, box, before: str, wait_ms: int) -> bool:
    """Whether what the explorer draws differs from `before` within `wait_ms`."""
    for _ in range(max(1, wait_ms // 100)):
        page.wait_for_timeout(100)
        if box.evaluate(_DRAWN_JS) != before:
            return True
    return False


def explorer_problems(page, rel: str, shots: Path) -> tuple[int, list[str]]:
    """Scroll to every explorer of the page (it is drawn then), check its layout, move every slider
    and press every play button; what is drawn must change each time (and the layout still hold
    after a slider moved). Saves a screenshot of each explorer (as first drawn)."""
    problems: list[str] = []
    boxes = page.locator(".inflight-explorer")
    for i in range(boxes.count()):
        box = boxes.nth(i)
        name = f"{rel}: explorer {i + 1}"
        box.scroll_into_view_if_needed()
        if not wait_drawn(box):
            problems.append(f"{name} was not drawn when scrolled into view")
            continue
        page.wait_for_timeout(300)
        box.screenshot(path=str(shots / (rel.replace("/", "__").removesuffix(".html") + f"__explorer{i + 1}.png")))
        problems += layout_problems(page, box, name)
        rails = box.locator(".slider-rail-touch-rect")
        for k in range(rails.count()):
            before = box.evaluate(_DRAWN_JS)
            for where in (0.92, 0.08):  # the far end, or the near one if the slider stood there
                rect = rails.nth(k).bounding_box()
                page.mouse.click(rect["x"] + rect["width"] * where, rect["y"] + rect["height"] / 2)
                if _changed(page, box, before, 600):
                    break
            else:
                problems.append(f"{name}: moving slider {k + 1} changed nothing that is drawn")
            problems += [p for p in layout_problems(page, box, f"{name} (slider {k + 1} moved)") if p not in problems]
        buttons = box.locator(".updatemenu-button")
        for k in range(buttons.count()):
            before = box.evaluate(_DRAWN_JS)
            buttons.nth(k).click()
            page.wait_for_timeout(150)
            if "pause" not in (buttons.nth(k).text_content() or ""):
                problems.append(f"{name}: the play button does not read pause while it plays")
            if not _changed(page, box, before, 2000):
                problems.append(f"{name}: pressing play changed nothing that is drawn")
    if boxes.count():
        page.mouse.move(0, 0)  # no hover label left over the page when its width is measured
        page.wait_for_timeout(300)
    return boxes.count(), problems


def script_problems(page, rel: str, traffic: Traffic) -> list[str]:
    """explorer.js from the site, once, on pages with an explorer only; plotly.js from the site
    (fetched once its first explorer was drawn), and on no other page."""
    srcs = page.eval_on_selector_all("script[src]", "els => els.map(e => e.src)")
    has = page.locator(".inflight-explorer").count() > 0
    problems = []
    local = [s for s in srcs if s.split("?")[0].endswith("/_static/" + EXPLORER_JS[1])]
    if has and len(local) != 1:
        problems.append(f"{rel}: {EXPLORER_JS[1]} loaded {len(local)} times (once from the site's _static expected)")
    if not has and local:
        problems.append(f"{rel}: {EXPLORER_JS[1]} loaded by a page without an explorer")
    plotly = [u for u in traffic.files if u.split("?")[0].endswith("/_static/" + EXPLORER_JS[0])]
    if has != bool(plotly):
        problems.append(f"{rel}: plotly.js fetched {len(plotly)} times on a page with{'out' * (not has)} an explorer")
    return problems


def menu_problems(page, rel: str) -> list[str]:
    """At 1280 px the visible ☰ hides the site's navigation, and shows it again."""
    buttons = page.locator(".primary-toggle")
    visible = [buttons.nth(i) for i in range(buttons.count()) if buttons.nth(i).is_visible()]
    sidebar = page.locator("#pst-primary-sidebar")
    if not visible or sidebar.count() == 0:
        return []
    shown = sidebar.is_visible()
    visible[0].click()
    page.wait_for_timeout(400)
    if sidebar.is_visible() == shown:
        return [f"{rel}: the ☰ button does not collapse the sidebar at 1280 px"]
    visible[0].click()
    page.wait_for_timeout(400)
    return [] if sidebar.is_visible() == shown else [f"{rel}: the ☰ button does not bring the sidebar back"]


def _open(browser, base: str, site: Path, rel: str):
    """A fresh 1280 px page of the site, its errors and requests recorded, loaded."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(LONG_TASKS_INIT)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    page.on("console", lambda msg: errors.append(f"console error: {msg.text}")
            if msg.type == "error" and "Failed to load resource" not in msg.text else None)
    failed_local: list[str] = []
    page.on("requestfailed", lambda req: failed_local.append(req.url) if req.url.startswith(base) else None)
    traffic = Traffic(page, base, site)
    page.goto(f"{base}/{rel}", wait_until="load")
    page.wait_for_timeout(500)
    return page, errors, failed_local, traffic


def check_page(browser, base: str, site: Path, page_path: Path, shots: Path, repo: str) -> list[str]:
    """Everything checked on one page at 1280 px; prints its findings and returns its problems."""
    rel = page_path.relative_to(site).as_posix()
    page, errors, failed_local, traffic = _open(browser, base, site, rel)
    load_task, load_blocking, loaded_at = long_tasks(page)
    load_kb = traffic.weight()
    problems: list[str] = []
    broken = page.evaluate(
        "() => Array.from(document.images).filter(i => i.offsetParent !== null || i.closest('article'))"
        ".filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.currentSrc || i.src)")
    problems += [f"{rel}: image did not load: {src}" for src in broken]
    if rel.startswith("chapters/"):
        problems += colab_problems(page, rel, repo)
        if page.locator("article img").count() == 0:  # every chapter plots (e.g. MPLBACKEND=Agg drew none)
            problems.append(f"{rel}: no figure on the page")
    problems += figure_problems(site, page, rel) + math_problems(page, rel) + menu_problems(page, rel)
    shot = shots / (rel.replace("/", "__").removesuffix(".html") + ".png")
    page.screenshot(path=str(shot), full_page=True)
    explorers, moved = explorer_problems(page, rel, shots)
    problems += moved + script_problems(page, rel, traffic)
    if Path(rel).stem in EXPLORER_CHAPTERS and not explorers:
        problems.append(f"{rel}: no explorer (every chapter in EXPLORER_CHAPTERS has one)")
    if explorers:
        print(f"  {rel}: {explorers} explorer(s), every slider moved and play pressed: "
              f"{'what is drawn changed each time' if not moved else 'FAILED'}")
    counts, cut = cut_off(page)  # after the screenshot: it opens collapsed cells
    problems += [f"{rel}: {line}" for line in cut]
    print(f"  {rel}: {counts['code']} code cells and {counts['output']} outputs cut off at 1280 px; "
          f"{counts['scrolls']} blocks scroll sideways, with a hint")
    raw_kb, packed_kb = traffic.weight()
    print(f"  {rel} (1280 px): {load_kb[0]:.0f} kB ({load_kb[1]:.0f} kB compressed) at load, {raw_kb:.0f} kB "
          f"({packed_kb:.0f} kB compressed) with its explorers; main thread: longest task {load_task:.0f} ms "
          f"at load (blocking {load_blocking:.0f} ms)")
    if load_task > LONG_TASK_MS:
        problems.append(f"{rel}: a task held the main thread {load_task:.0f} ms while the page loaded "
                        f"(over {LONG_TASK_MS} ms)")
    problems += [f"{rel}: request to another host: {url}" for url in traffic.remote]
    problems += [f"{rel}: not found on the site: {url}" for url in traffic.missing]
    # errors last: those raised while the explorers were moved count too
    problems += [f"{rel}: {e}" for e in errors] + [f"{rel}: request failed: {url}" for url in failed_local]
    print(f"checked {rel} ({len(errors)} errors, {len(broken)} broken images) -> {shot}")
    page.context.close()
    return problems


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("site", type=Path)
    ap.add_argument("--screenshots", type=Path, default=Path("_build/screenshots"))
    ap.add_argument("--only", choices=("desktop", "phone"), help="run one of the two passes (both by default)")
    ap.add_argument("--pages", default="", help="only the pages whose path contains this (default: every page)")
    args = ap.parse_args()
    pages = sorted(p for p in args.site.rglob("*.html")
                   if not {"_static", "_sources", "_sphinx_design_static"} & set(p.relative_to(args.site).parts)
                   and p.name not in {"genindex.html", "search.html"} and args.pages in p.as_posix())
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
        if args.only != "phone":
            for page_path in pages:
                problems += check_page(browser, base, args.site, page_path, args.screenshots, repo)
        if args.only != "desktop":
            print("\non a phone (390 x 844 CSS px, touch, device scale 3):")
            problems += phone_pass(browser, base, args.site, pages, args.screenshots)
        browser.close()
    server.shutdown()
    if problems:
        print("\nSITE CHECK FAILED:", *problems, sep="\n  ")
        return 1
    print(f"\nsite check passed: {len(pages)} pages at 1280 px and on a phone, screenshots in {args.screenshots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
