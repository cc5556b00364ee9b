"""The site's own conventions (issue 32), without a browser: the browser code it vendors is what
SHA256SUMS says and the plotly.js the explorers are written for; explorers are laid out for narrow
screens (side-by-side panels stacked, each its height in pixels), never zoom on a swipe, keep the
play button off its slider, and use only the trace types the site's plotly.js draws; figures are
written at twice their size with their smallest text recorded, from which the pages keep that
text at 8 CSS px or more. (tests/site_check.py checks all of it on the built site, in Chromium.)"""
from __future__ import annotations

import hashlib
import io
import re
import sys
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from inflight.book import explorer_layout, site_figures  # noqa: E402
from inflight.book.interactive import SITE_TRACES, Knob, View, explorer, panels  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VENDOR = ROOT / "_vendor"


def test_vendored_files_are_what_sha256sums_says():
    listed = {}
    for line in (VENDOR / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        listed[name] = digest
    shipped = {p.relative_to(VENDOR).as_posix() for p in VENDOR.rglob("*")
               if p.suffix in {".js", ".css", ".woff2"} and p.name != "entry.js"}
    assert shipped == set(listed), f"not listed or missing: {sorted(shipped ^ set(listed))}"
    for name, digest in listed.items():
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, f"{name} changed: run update.sh"


def test_the_sites_plotly_is_the_one_plotly_writes_for():
    import plotly.offline

    banner = (VENDOR / "plotly" / "plotly.min.js").read_text(encoding="utf-8")[:300]
    version = re.search(r"plotly\.js v([\d.]+)", banner).group(1)
    assert version == plotly.offline.get_plotlyjs_version(), "re-vendor plotly.js (_vendor/README.md)"


def test_the_bundles_traces_are_site_traces():
    entry = (VENDOR / "plotly" / "entry.js").read_text()
    bundled = {"scatter"} | set(re.findall(r'require\("plotly\.js/lib/(\w+)"\)', entry)) - {"core"}
    assert bundled == set(SITE_TRACES)


def test_an_explorer_refuses_a_trace_the_site_cannot_draw():
    with pytest.raises(ValueError, match="'pie' is not in the site's plotly.js bundle"):
        explorer([Knob("a", "a", (1, 2))], lambda a: View([{"type": "pie", "values": [a, 1]}]))


def _side_by_side():
    layout = panels(1, 2, titles=("left", "right"), hspace=0.12)
    layout["xaxis"]["domain"], layout["xaxis2"]["domain"] = [0, 0.6], [0.72, 1]

    def draw(a):
        return View([{"type": "scatter", "y": [a, 1]}, {"type": "bar", "y": [1, a], "xaxis": "x2", "yaxis": "y2"}],
                    {"title": {"text": f"a = {a}"}})

    return explorer([Knob("a", "a", (1, 2), play=True)], draw, layout, height=400)


def test_side_by_side_panels_stack_on_a_narrow_screen():
    fig = _side_by_side().figure
    spec, plot_px = fig["narrow"], fig["layout"]["height"] - fig["layout"]["margin"]["t"] - fig["layout"]["margin"]["b"]
    assert spec["below"] == explorer_layout.NARROW_PX
    left, right = spec["blocks"]
    assert left[:2] == [0, 0.6] and right[:2] == [0.72, 1]  # each column, left to right...
    assert left[5] == 1 and right[4] == 0 and left[4] > right[5]  # ...stacked top to bottom, a gap between
    heights = [(b[5] - b[4]) * spec["plot_px"] for b in spec["blocks"]]
    assert heights == pytest.approx([plot_px, plot_px])  # each keeps its height in pixels
    assert spec["plot_px"] == 2 * plot_px + explorer_layout.STACK_GAP_PX
    assert [s["len"] for s in spec["layout"]["sliders"]] == [0.97]  # one slider a row, the full width


def test_a_single_column_is_not_restacked():
    ex = explorer([Knob("a", "a", (1, 2))], lambda a: View([{"type": "scatter", "y": [a]}]), panels(2, 1))
    assert ex.figure["narrow"]["blocks"] == []


def test_no_axis_zooms_or_pans_and_the_play_button_has_its_own_room():
    layout = _side_by_side().figure["layout"]
    assert layout["dragmode"] is False
    axes = [v for k, v in layout.items() if re.fullmatch(r"[xy]axis\d*", k)]
    assert len(axes) == 4 and all(a["fixedrange"] for a in axes)
    (slider,), (menu,) = layout["sliders"], layout["updatemenus"]
    assert slider["x"] == menu["x"] and slider["pad"]["l"] == explorer_layout.PLAY_PX


def _png_info(data: bytes) -> dict:
    from PIL import Image

    return dict(Image.open(io.BytesIO(data)).info)


def test_figures_are_twice_their_size_with_their_smallest_text_recorded():
    fig, ax = plt.subplots(figsize=(6, 3), dpi=100)
    ax.plot([0, 1], [0, 1])
    ax.set_title("title", fontsize=12)
    ax.text(0.2, 0.5, "small", fontsize=7.5)
    ax.text(0.2, 0.8, "hidden", fontsize=3, visible=False)  # never drawn: does not count
    data, shown = site_figures.site_png(fig)
    info = _png_info(data)
    assert float(info[site_figures.MIN_TEXT_KEY]) == 7.5
    assert info["dpi"][0] == pytest.approx(200, abs=0.01)
    width = int.from_bytes(data[16:20], "big")
    assert shown["width"] == width // 2 and 500 < shown["width"] <= 600  # (a tight box, near 6 inches)
    plt.close(fig)
    assert site_figures.site_png(plt.figure()) is None  # an empty figure shows nothing


def test_a_page_keeps_a_figures_smallest_text_legible(tmp_path):
    sys.path.insert(0, str(ROOT / "_ext"))
    from site_assets import legible_width

    fig, ax = plt.subplots(figsize=(8, 3), dpi=100)
    ax.set_title("nine points", fontsize=9)
    ax.tick_params(labelsize=9)
    data, _ = site_figures.site_png(fig)
    plt.close(fig)
    (tmp_path / "f.png").write_bytes(data)
    natural = int.from_bytes(data[16:20], "big")
    # 9 pt at 200 dpi is 25 px of the PNG: 8 CSS px of it take 8/25 of its width
    assert legible_width(tmp_path / "f.png") == pytest.approx(natural * 8 / 25, rel=1e-3)
    plain = io.BytesIO()
    fig.savefig(plain, format="png")  # not drawn by the site's convention: nothing recorded
    (tmp_path / "g.png").write_bytes(plain.getvalue())
    assert legible_width(tmp_path / "g.png") is None
