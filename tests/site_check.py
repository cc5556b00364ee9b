"""Open every page of the built site in headless Chromium (Debian's, driven by Playwright).

Fails on a JavaScript error, an image that did not load, a chapter page without an
"Open in Colab" link or with one (the header's launch button included) that does not open the
learner version at the release tag, or a code cell or output cut off at the right edge of the text
column (counted per page, collapsed cells opened first); saves a full-page screenshot of each page
for a person to look at.

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
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        for page_path in pages:
            rel = page_path.relative_to(args.site).as_posix()
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc, errors=errors: errors.append(f"page error: {exc}"))
            page.on("console", lambda msg, errors=errors: errors.append(f"console error: {msg.text}")
                    if msg.type == "error" and "Failed to load resource" not in msg.text else None)
            failed_local: list[str] = []
            page.on("requestfailed", lambda req, f=failed_local: f.append(req.url) if req.url.startswith(base) else None)
            page.goto(f"{base}/{rel}", wait_until="load")
            page.wait_for_timeout(300)
            broken = page.evaluate(
                "() => Array.from(document.images).filter(i => i.offsetParent !== null || i.closest('article'))"
                ".filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.currentSrc || i.src)")
            for e in errors:
                problems.append(f"{rel}: {e}")
            for src in broken:
                problems.append(f"{rel}: image did not load: {src}")
            for url in failed_local:
                problems.append(f"{rel}: request failed: {url}")
            if rel.startswith("chapters/"):
                problems += colab_problems(page, rel, repo)
                if page.locator("article img").count() == 0:  # every chapter plots (e.g. MPLBACKEND=Agg drew none)
                    problems.append(f"{rel}: no figure on the page")
            shot = args.screenshots / (rel.replace("/", "__").removesuffix(".html") + ".png")
            page.screenshot(path=str(shot), full_page=True)
            counts, cut = cut_off(page)  # after the screenshot: it opens collapsed cells
            problems += [f"{rel}: {line}" for line in cut]
            print(f"  {rel}: {counts['code']} code cells and {counts['output']} outputs cut off at 1280 px; "
                  f"{counts['wrapped']} blocks wrap a long line")
            print(f"checked {rel} ({len(errors)} errors, {len(broken)} broken images) -> {shot}")
            page.close()
        browser.close()
    server.shutdown()
    if problems:
        print("\nSITE CHECK FAILED:", *problems, sep="\n  ")
        return 1
    print(f"\nsite check passed: {len(pages)} pages, screenshots in {args.screenshots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
