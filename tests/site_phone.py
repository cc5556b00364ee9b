"""The phone pass of the browser check (tests/site_check.py): every page as a reader on a phone sees
it, Chromium at 390 × 844 CSS px with touch and device scale 3 (issue 32). A page fails when

- its ☰ (site navigation) or "On this page" button does not open its panel;
- it is wider than the screen, or something in it scrolls sideways with no hint that it does;
- a vertical swipe that starts on an explorer's plot does not scroll the page (or moves the plot);
- an explorer's text runs out of its box or over other text, a control covers another, or a tap
  on a slider changes nothing;
- an explorer far below the first screen was drawn while the page loaded (they are drawn as a
  reader scrolls to them);
- a figure's smallest text renders under 8 CSS px, maths stays raw TeX, a request goes to another
  host, the page (scrolled through) weighs more than the budget, or a task holds the main thread
  longer than LONG_TASK_MS while it loads or draws an explorer (budgets: tests/site_probe.py).

Each page's weight and main-thread times are printed, and a screenshot of it saved (CSS px).
"""
from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Error as PlaywrightError

from site_probe import (LONG_TASK_MS, LONG_TASKS_INIT, WEIGHT_BUDGET_KB, Traffic, figure_problems,
                        layout_problems, long_tasks, math_problems, wait_drawn)

PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 3, "is_mobile": True, "has_touch": True}
SWIPE_PX = 240  # one vertical swipe; the page must follow at least half of it

# (a phone zooms a page wider than its screen out: the layout viewport, innerWidth, grows with it)
_WIDTH_JS = """W => {
  const wide = Math.max(document.documentElement.scrollWidth, window.innerWidth);
  if (wide <= W + 1) return {wide, culprits: []};
  const culprits = [];
  const clipped = el => {  // inside a box that scrolls or clips: it does not widen the page
    for (let e = el.parentElement; e && e !== document.body; e = e.parentElement)
      if (getComputedStyle(e).overflowX !== 'visible') return true;
    return false;
  };
  for (const el of document.querySelectorAll('body *')) {
    const r = el.getBoundingClientRect();
    if (r.right <= W + 1 || r.width === 0 || clipped(el)) continue;
    if (Array.from(el.children).some(c => c.getBoundingClientRect().right > W + 1 && !clipped(c))) continue;
    culprits.push(`${el.tagName.toLowerCase()}.${(el.getAttribute('class') || '').split(' ')[0]}`
                  + ` ${Math.round(r.right)} px: ${(el.textContent || '').trim().slice(0, 50)}`);
    if (culprits.length >= 3) break;
  }
  return {wide, culprits};
}"""

# Everything in the article that scrolls sideways must say so: the site's script marks it
# (.inflight-scrolls) and puts a visible hint (.inflight-scroll-hint) right before it.
_HINTS_JS = """() => {
  const out = [];
  for (const el of document.querySelectorAll('article *')) {
    if (el.closest('.inflight-explorer') || el.clientWidth === 0) continue;
    const s = getComputedStyle(el);
    if (!['auto', 'scroll'].includes(s.overflowX) || el.scrollWidth <= el.clientWidth + 1) continue;
    const hint = el.previousElementSibling;
    if (el.classList.contains('inflight-scrolls') && hint && hint.classList.contains('inflight-scroll-hint')
        && hint.getBoundingClientRect().height > 0) continue;
    out.push(`${el.tagName.toLowerCase()} (${el.scrollWidth} px in ${el.clientWidth}): `
             + (el.innerText || '').trim().split('\\n')[0].slice(0, 50));
  }
  return out;
}"""

_OPEN_ALL_JS = """() => {
  const article = document.querySelector('article.bd-article') || document.querySelector('main');
  article.querySelectorAll('details').forEach(d => { d.open = true; });
  article.querySelectorAll('.toggle-hidden').forEach(e => e.classList.remove('toggle-hidden'));
}"""

_RANGES_JS = """box => {
  const L = box.querySelector('.inflight-plot')._fullLayout || {};
  return Object.keys(L).filter(k => /^[xy]axis\\d*$/.test(k)).map(k => String(L[k].range)).join(';');
}"""

_DRAWN_JS = """box => {
  const gd = box.querySelector('.inflight-plot');
  return ['.cartesianlayer', '.infolayer .g-gtitle', '.annotation', '.layer-above']
    .map(sel => Array.from(gd.querySelectorAll(sel)).map(e => e.innerHTML).join('')).join('|');
}"""


def menu_problems(page, rel: str) -> list[str]:
    """☰ and "On this page": each visible one must open its panel, with links in it."""
    problems = []
    for kind, dialog, label in (("primary", "#pst-primary-sidebar-modal", "☰ (site navigation)"),
                                ("secondary", "#pst-secondary-sidebar-modal", '"On this page"')):
        buttons = page.locator(f".{kind}-toggle")
        visible = [buttons.nth(i) for i in range(buttons.count()) if buttons.nth(i).is_visible()]
        if kind == "primary" and not visible:
            problems.append(f"{rel}: no visible {label} button on a phone")
        for button in visible:
            button.tap()
            try:
                page.wait_for_function(
                    f"() => {{ const d = document.querySelector('{dialog}'); return d && d.open &&"
                    " Array.from(d.querySelectorAll('a')).some(a => a.getBoundingClientRect().width > 0); }",
                    timeout=2500)
            except Exception:
                problems.append(f"{rel}: tapping {label} opened nothing")
                continue
            page.keyboard.press("Escape")
            page.wait_for_function(f"() => !document.querySelector('{dialog}').open", timeout=2500)
    return problems


def width_problems(page, rel: str) -> list[str]:
    found = page.evaluate(_WIDTH_JS, PHONE["viewport"]["width"])
    if not found["culprits"]:
        return []
    return [f"{rel}: the page is {found['wide']} px wide on a {PHONE['viewport']['width']} px screen; "
            f"past the edge: {'; '.join(found['culprits'])}"]


def hint_problems(page, rel: str) -> list[str]:
    """Sideways scrolling with no hint, as loaded and with every collapsed cell opened."""
    found = page.evaluate(_HINTS_JS)
    page.evaluate(_OPEN_ALL_JS)
    page.wait_for_timeout(300)  # (the site's script re-marks what scrolls when it changes size)
    found += [f for f in page.evaluate(_HINTS_JS) if f not in found]
    return [f"{rel}: scrolls sideways with no hint: {f}" for f in found]


def lazy_problems(page, rel: str) -> list[str]:
    """At load, an explorer more than two screens below was drawn: it cost the load for nothing."""
    drawn = page.eval_on_selector_all(
        ".inflight-explorer", "els => els.map(e => [e.getBoundingClientRect().top + window.scrollY,"
        " e.querySelector('.main-svg') !== null])")
    far = 2 * PHONE["viewport"]["height"]
    return [f"{rel}: explorer {k + 1} ({top:.0f} px down) was drawn while the page loaded"
            for k, (top, is_drawn) in enumerate(drawn) if is_drawn and top > far]


def swipe_problems(page, cdp, box, name: str) -> list[str]:
    """A vertical swipe from the middle of the explorer's first plot must scroll the page."""
    where = "box => { const d = box.querySelector('.draglayer .nsewdrag') || box.querySelector('.cartesianlayer');" \
            " const r = d.getBoundingClientRect(); return [r.left + r.width / 2, r.top + Math.min(r.height / 2, 80)]; }"
    x, y = box.evaluate(where)
    page.evaluate(f"window.scrollBy(0, {y - 0.55 * PHONE['viewport']['height']:.0f})")
    page.wait_for_timeout(150)
    x, y = box.evaluate(where)
    before, ranges = page.evaluate("() => window.scrollY"), box.evaluate(_RANGES_JS)
    # a finger: down, up the screen in 12 moves of one frame each, lifted (real touch events)
    cdp.send("Input.dispatchTouchEvent", {"type": "touchStart", "touchPoints": [{"x": x, "y": y}]})
    for i in range(1, 13):
        cdp.send("Input.dispatchTouchEvent", {"type": "touchMove", "touchPoints": [{"x": x, "y": y - SWIPE_PX * i / 12}]})
        page.wait_for_timeout(16)
    cdp.send("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []})
    page.wait_for_timeout(300)
    moved = page.evaluate("() => window.scrollY") - before
    problems = []
    if moved < SWIPE_PX / 2:
        problems.append(f"{name}: a vertical swipe on the plot scrolled the page {moved:.0f} px of {SWIPE_PX}")
    if box.evaluate(_RANGES_JS) != ranges:
        problems.append(f"{name}: a vertical swipe on the plot zoomed or panned it")
    return problems


def rail_rect(page, rails):
    """The first slider rail's box, scrolled into view. Plotly redraws a slider (a new rail element)
    when a frame lands, so the element found may be gone by the time it is scrolled to: look again."""
    for _ in range(30):
        try:
            rails.first.scroll_into_view_if_needed(timeout=2000)
            rect = rails.first.bounding_box(timeout=2000)
            if rect:
                return rect
        except PlaywrightError:
            pass
        page.wait_for_timeout(100)
    return None


def tap_problems(page, box, name: str) -> list[str]:
    """A tap at the far end of the first slider must change what is drawn."""
    rails = box.locator(".slider-rail-touch-rect")
    if rails.count() == 0:
        return []
    before = box.evaluate(_DRAWN_JS)
    for where in (0.95, 0.05):
        wait_drawn(box)
        rect = rail_rect(page, rails)
        if rect is None:
            return [f"{name}: the slider's rail never stayed on the page long enough to be tapped"]
        page.touchscreen.tap(rect["x"] + rect["width"] * where, rect["y"] + rect["height"] / 2)
        for _ in range(10):
            page.wait_for_timeout(100)
            if box.evaluate(_DRAWN_JS) != before:
                return []
    return [f"{name}: tapping the slider changed nothing that is drawn"]


def explorer_problems(page, cdp, rel: str, shots: Path, tasks: dict, since: float) -> list[str]:
    """Each explorer scrolled to (drawn), checked, swiped over and tapped; `tasks` gets the longest
    main-thread task of each (ms)."""
    problems = []
    boxes = page.locator(".inflight-explorer")
    for k in range(boxes.count()):
        box, name = boxes.nth(k), f"{rel} (phone): explorer {k + 1}"
        box.scroll_into_view_if_needed()
        if not wait_drawn(box):
            problems.append(f"{name} was not drawn when scrolled into view")
            continue
        page.wait_for_timeout(300)
        problems += layout_problems(page, box, name)
        problems += swipe_problems(page, cdp, box, name)
        # (an element's own screenshot comes out shifted under a phone's emulation: the page's, clipped)
        rect = box.evaluate("b => { const r = b.getBoundingClientRect();"
                            " return {x: r.left + scrollX, y: r.top + scrollY, width: r.width, height: r.height}; }")
        page.screenshot(path=str(shots / (rel.replace("/", "__").removesuffix(".html") + f"__phone_explorer{k + 1}.png")),
                        clip=rect, full_page=True, scale="css")
        problems += tap_problems(page, box, name)
        tasks[f"drawing and moving explorer {k + 1}"], _, since = long_tasks(page, since)
    return problems


def check_phone_page(context, base: str, site: Path, rel: str, shots: Path) -> list[str]:
    """Everything checked on one page at the phone's size; prints its weight and main-thread times."""
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    traffic = Traffic(page, base, site)
    page.goto(f"{base}/{rel}", wait_until="load")
    page.wait_for_timeout(1000)
    load_task, load_blocking, loaded_at = long_tasks(page)
    load_kb = traffic.weight()
    problems = width_problems(page, rel) + lazy_problems(page, rel) + figure_problems(site, page, rel)
    problems += math_problems(page, rel) + menu_problems(page, rel)
    tasks: dict[str, float] = {}
    tasks["opening the menus"], _, since = long_tasks(page, since=loaded_at)
    cdp = page.context.new_cdp_session(page)
    problems += explorer_problems(page, cdp, rel, shots, tasks, since)
    page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")  # what a reader reaches
    page.wait_for_timeout(500)
    tasks["scrolling to the end"], _, _ = long_tasks(page, since=page.evaluate("performance.now()") - 600)
    draw_task, _, _ = long_tasks(page, since=loaded_at)
    raw_kb, packed_kb = traffic.weight()
    problems += width_problems(page, rel) + hint_problems(page, rel)
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(shots / (rel.replace("/", "__").removesuffix(".html") + "__phone.png")),
                    full_page=True, scale="css")
    print(f"  {rel} (phone): {load_kb[0]:.0f} kB ({load_kb[1]:.0f} kB compressed) at load, {raw_kb:.0f} kB "
          f"({packed_kb:.0f} kB compressed) scrolled through; main thread: longest task {load_task:.0f} ms at load "
          f"(blocking {load_blocking:.0f} ms), {draw_task:.0f} ms after it"
          + (f" ({max(tasks, key=tasks.get)})" if draw_task else ""))
    if packed_kb > WEIGHT_BUDGET_KB:
        problems.append(f"{rel}: weighs {packed_kb:.0f} kB compressed, over the budget of {WEIGHT_BUDGET_KB} kB")
    for what, ms in (("while the page loaded", load_task), *((f"while {k}", v) for k, v in tasks.items())):
        if ms > LONG_TASK_MS:
            problems.append(f"{rel} (phone): a task held the main thread {ms:.0f} ms {what} (over {LONG_TASK_MS} ms)")
    problems += [f"{rel} (phone): request to another host: {url}" for url in traffic.remote]
    problems += [f"{rel} (phone): not found on the site: {url}" for url in traffic.missing]
    problems += [f"{rel} (phone): {e}" for e in errors]
    page.close()
    return problems


def phone_pass(browser, base: str, site: Path, pages: list[Path], shots: Path) -> list[str]:
    context = browser.new_context(**PHONE)
    context.add_init_script(LONG_TASKS_INIT)
    problems: list[str] = []
    for page_path in pages:
        problems += check_phone_page(context, base, site, page_path.relative_to(site).as_posix(), shots)
    context.close()
    return problems
