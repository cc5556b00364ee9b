"""The explorers' machinery: a grid of knob values becomes one figure whose frames are the views
`draw` made, named by the knobs' positions, trimmed to what moves and small; its HTML carries no
library in the book's pages and the library where a notebook needs it; the live explorers log
every redraw and `check_redraw` turns a failed one into an error. The browser test drives the
real explorer.js with plotly.js: two sliders combine, play steps, nothing errs."""
from __future__ import annotations

import base64
import functools
import http.server
import json
import re
import threading
from pathlib import Path

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from inflight.book import interactive  # noqa: E402
from inflight.book.interactive import Knob, View, explorer, panels, typed  # noqa: E402
from inflight.book.widgets import check_redraw, live_explorer  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[1]


def _title(a, b):
    return f"a={a} b={b}"


def _draw(a, b):
    x = np.arange(5)
    return View([{"type": "scatter", "x": x, "y": x * a + b, "name": "line", "line": {"color": "red", "width": 2}}],
                {"title": {"text": _title(a, b)}})


def _two_knobs(**kw):
    knobs = [Knob("a", "slope", (1, 2, 3), start=2), Knob("b", "offset", (0.0, 0.5), fmt="{:.1f}", play=True)]
    return explorer(knobs, _draw, panels(1, 1, titles=("panel",)), **kw)


def test_one_frame_per_grid_point_named_by_positions():
    ex = _two_knobs()
    names = [f["name"] for f in ex.figure["frames"]]
    assert names == ["0,0", "0,1", "1,0", "1,1", "2,0", "2,1"]
    titles = {f["name"]: f["layout"]["title"]["text"] for f in ex.figure["frames"]}
    assert titles["2,1"] == _title(3, 0.5) and titles["0,0"] == _title(1, 0.0)
    # the first view is the knobs' start: a=2 (index 1), b=0.0 (index 0)
    assert ex.figure["layout"]["title"]["text"] == _title(2, 0.0)
    assert [s["active"] for s in ex.figure["layout"]["sliders"]] == [1, 0]
    assert [st["label"] for st in ex.figure["layout"]["sliders"][1]["steps"]] == ["0.0", "0.5"]


def test_frames_carry_only_what_moves():
    ex = _two_knobs()
    trace = ex.figure["frames"][0]["data"][0]
    assert set(trace) == {"y"}, "type, x, name and line never change: the first view has them"
    first = ex.figure["data"][0]
    assert first["type"] == "scatter" and first["line"] == {"color": "red", "width": 2}
    assert "annotations" not in ex.figure["frames"][0]["layout"]  # the panel title never changes
    assert ex.figure["layout"]["annotations"][0]["text"] == "panel"


def test_typed_arrays_round_trip():
    for values in (np.array([0, 5, -3]), np.array([0, 40000]), np.array([1.5, -2.25]), np.array([], dtype=int)):
        spec = typed(values)
        kind = np.dtype(spec["dtype"]).newbyteorder("<")
        back = np.frombuffer(base64.b64decode(spec["bdata"]), dtype=kind)
        assert np.allclose(back, values) and back.size == values.size
    assert typed(np.array([1, 2]))["dtype"] == "i1" and typed(np.array([300]))["dtype"] == "i2"
    assert typed([1, 2]) == [1, 2]


def test_the_figure_is_json_and_small():
    ex = _two_knobs()
    assert json.loads(ex.json)["frames"]
    assert ex.nbytes == len(ex.json.encode()) and ex.views == 6
    with pytest.raises(ValueError, match="over 0.1 kB"):
        _two_knobs(max_kb=0.1)


def test_bad_explorers_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="at least two values"):
        Knob("a", "a", (1,))
    with pytest.raises(ValueError, match="start 5 is not one of"):
        Knob("a", "a", (1, 2), start=5)
    with pytest.raises(ValueError, match="share a name"):
        explorer([Knob("a", "a", (1, 2)), Knob("a", "b", (1, 2))], lambda a: View([]))
    with pytest.raises(ValueError, match="same traces"):
        explorer([Knob("a", "a", (1, 2))], lambda a: View([{"type": "scatter"}] * a))
    with pytest.raises(TypeError, match="must return a View"):
        explorer([Knob("a", "a", (1, 2))], lambda a: {"data": []})


def test_html_on_the_site_carries_no_library(monkeypatch):
    ex = _two_knobs()
    monkeypatch.setenv(interactive.ENV, "page")
    html = ex.html()
    assert '<script type="application/json" class="inflight-figure">' in html
    assert "<script>" not in html and "<script src" not in html  # the page loads plotly.js and explorer.js
    assert json.loads(re.search(r'class="inflight-figure">(.*?)</script>', html).group(1).replace("<\\/", "</"))


def test_html_in_a_notebook_brings_what_it_needs(monkeypatch):
    ex = _two_knobs()
    monkeypatch.delenv(interactive.ENV, raising=False)
    monkeypatch.setattr(interactive, "_plotly_in_notebook", False)
    first, second = ex.html(), ex.html()
    assert "Plotly" in first and len(first) > 1_000_000  # plotly.js, once per kernel
    assert len(second) < 100_000 and interactive.explorer_js() in second
    colab = ex.html("colab")
    assert re.search(r'<script src="https://cdn\.plot\.ly/plotly-[\d.]+\.min\.js"', colab)  # as plotly's Colab renderer
    assert "<\\/" not in interactive.explorer_js()


def test_live_explorer_logs_redraws_and_check_finds_failures():
    calls = []

    def show(a, b):
        calls.append((a, b))
        if a == 3:
            raise RuntimeError("boom")

    ex = live_explorer(show, [Knob("a", "slope", (1, 2, 3)), Knob("b", "offset", (0, 1))])
    assert calls == [(1, 0)] and len(ex.redraws) == 1  # drawn once when built
    ok = live_explorer(lambda a, b: None, [Knob("a", "slope", (1, 2)), Knob("b", "offset", (0, 1), play=True)])
    assert check_redraw(ok).startswith("5 redraws")  # built, then each knob one position and back
    assert [r.values for r in ok.redraws][1:3] == [{"a": 2, "b": 0}, {"a": 1, "b": 0}]
    assert any(type(c).__name__ == "HBox" for c in ok.children)  # the play button
    with pytest.raises(RuntimeError, match="boom"):
        check_redraw(live_explorer(lambda a: show(a, 0), [Knob("a", "slope", (2, 3))]))  # a=3 fails


def _serve(folder: Path):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (apt-get install chromium)")
def test_sliders_and_play_in_a_browser(tmp_path):
    from playwright.sync_api import sync_playwright

    ex = _two_knobs(play_ms=100)
    # as the book's site serves it: its own plotly.js bundle, fetched by explorer.js when needed
    (tmp_path / "plotly.min.js").write_bytes((ROOT / "_vendor" / "plotly" / "plotly.min.js").read_bytes())
    (tmp_path / "explorer.js").write_text(interactive.explorer_js())
    (tmp_path / "index.html").write_text(
        '<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,">'
        f'<script defer src="explorer.js" data-plotly="plotly.min.js"></script></head>'
        f'<body style="width:800px">{ex.html("page")}</body></html>')
    server = _serve(tmp_path)
    errors = []
    title = "() => document.querySelector('.g-gtitle').textContent"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"], headless=True)
        page = browser.new_page(viewport={"width": 1000, "height": 800})
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html", wait_until="load")
        page.locator(".main-svg").first.wait_for(timeout=15000)
        assert page.evaluate(title) == _title(2, 0.0)
        rails = page.locator(".slider-rail-touch-rect")
        box = rails.nth(0).bounding_box()  # slope: to its last value; the offset stays
        page.mouse.click(box["x"] + box["width"] * 0.97, box["y"] + box["height"] / 2)
        page.wait_for_timeout(300)
        assert page.evaluate(title) == _title(3, 0.0)
        page.locator(".updatemenu-button").first.click()  # play the offset: 0.0 -> 0.5, slope kept
        page.wait_for_timeout(800)
        assert page.evaluate(title) == _title(3, 0.5)
        assert "play" in page.locator(".updatemenu-button").first.text_content()  # it played to the end
        browser.close()
    server.shutdown()
    assert not errors, errors


def test_replay_frames_move_only_the_curtain():
    from inflight.book.explore_batching import replay_site
    from inflight.sim.schedulers import ContinuousBatchScheduler, StaticBatchScheduler
    from inflight.sim.simulate import simulate
    from inflight.sim.workloads import long_tailed

    w = long_tailed(30, seed=0, mean=10, max_len=60)
    runs = {"static": simulate(StaticBatchScheduler(4), w), "continuous": simulate(ContinuousBatchScheduler(4), w)}
    ex = replay_site(runs, frames=10)
    assert ex.knobs[0].play and ex.views == len(ex.knobs[0].values) <= 10
    assert all(not trace for f in ex.figure["frames"] for trace in f["data"])  # the Gantt charts are drawn once
    last = ex.figure["frames"][-1]["layout"]
    assert [s["x0"] for s in last["shapes"]] == [runs["static"].steps] * 2  # the curtain has gone past the end
    assert all(a["text"].endswith("✓") for a in last["annotations"] if "requests done" in a["text"])


def test_fixed_annotations_and_shapes_stay_in_every_frame():
    layout = panels(1, 1, titles=("the panel",))
    layout["shapes"] = [{"type": "line", "x0": 0, "x1": 1, "y0": 0, "y1": 0}]

    def draw(a):
        return View([{"type": "scatter", "y": [a]}], {"shapes": [{"type": "line", "x0": a, "x1": a, "y0": 0, "y1": 1}],
                                                       "annotations": [{"text": f"a={a}"}]})

    ex = explorer([Knob("a", "a", (1, 2))], draw, layout)
    for frame in ex.figure["frames"]:  # a frame's arrays replace the figure's: the fixed ones come along
        assert frame["layout"]["shapes"][0] == layout["shapes"][0] and len(frame["layout"]["shapes"]) == 2
        assert [a["text"] for a in frame["layout"]["annotations"]][0] == "the panel"
    assert len(ex.figure["layout"]["shapes"]) == 2 and len(ex.figure["layout"]["annotations"]) == 2
