"""Explorers that work with no kernel: a grid of knob values computed ahead of time, shown as one
plotly figure with a slider per knob (and, for a knob that is time, a play button).

    knobs = [Knob("max_batch_size", "batch size", (1, 2, 4, 8, 16), start=8),
             Knob("spread", "length spread", (0.0, 0.5, 1.0), fmt="{:.1f}")]

    def draw(max_batch_size, spread):       # one view of the grid: its traces, and its layout
        result = simulate(StaticBatchScheduler(max_batch_size), with_spread(48, spread=spread))
        return View(gantt_traces(result), {"title": {"text": f"{result.steps} steps"}})

    explorer(knobs, draw, panels(1, 1), height=420)   # the last line of a cell displays it

`draw` is called once per point of the grid (here 5 × 3 = 15 views); every view must have the
same traces in the same order (plotly moves from view to view trace by trace). Whatever a view
sets in the layout, every view should set, or a value stays from the view shown before. Panel
titles are annotations: a view's own annotations (and shapes) are drawn beside the layout's,
never instead.

Where the JavaScript comes from (never from inside each figure):
- on the book's site, the page itself loads plotly.js and `explorer.js` from the site's `_static`
  (`_ext/plotly_explorers.py` adds them to the pages that hold an explorer, and sets
  INFLIGHT_EXPLORER_JS=page for the kernels myst-nb starts, so outputs carry only their JSON);
- on Colab, where each output is a page of its own, the output loads plotly.js the way plotly's
  own Colab renderer does (its CDN) and carries `explorer.js`;
- in any other Jupyter, the first explorer of a kernel puts plotly.js into the notebook page, as
  plotly's notebook renderer does, and each output carries `explorer.js`.
"""
from __future__ import annotations

import base64
import copy
import html
import itertools
import json
import os
import sys
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Callable, Sequence

import numpy as np

from inflight.book.explorer_layout import (AXIS_TITLE_PX, FONT, SLIDER_ROW_PX, TAB10, base_layout, controls,  # noqa: F401
                                           merge, narrow_spec, panels, slider_rows)

ENV = "INFLIGHT_EXPLORER_JS"  # "page": the page loads plotly.js and explorer.js (the book's site)
# The trace types the site's plotly.js bundle draws (_vendor/plotly/entry.js: its core and these).
SITE_TRACES = ("scatter", "bar", "heatmap")
MAX_KB = 100  # a figure's JSON; a page stays light (and a bigger grid usually means too many knob values)
_plotly_in_notebook = False  # generic Jupyter: plotly.js is put into the page with the first explorer


@dataclass(frozen=True)
class Knob:
    """One slider: `name` is the keyword `draw` takes, `label` what the reader sees."""

    name: str
    label: str
    values: Sequence[Any]
    start: Any = None  # the value shown first (default: the first)
    fmt: str = "{}"  # how a value is written on the slider
    play: bool = False  # a play button steps through this knob (time, steps of a run)

    def __post_init__(self) -> None:
        if len(self.values) < 2:
            raise ValueError(f"knob {self.name!r} needs at least two values to slide between, got {list(self.values)}")
        if self.start is not None and self.start not in self.values:
            raise ValueError(f"knob {self.name!r}: start {self.start!r} is not one of its values {list(self.values)}")

    @property
    def start_index(self) -> int:
        return 0 if self.start is None else list(self.values).index(self.start)


@dataclass
class View:
    """What one point of the grid shows: its traces (plotly dicts or graph objects) and the layout
    it changes (nested plotly dicts: {"title": {"text": ...}, "xaxis": {"range": [...]}})."""

    data: list
    layout: dict = field(default_factory=dict)


def typed(values: Any) -> Any:
    """A numpy array as plotly's compact typed array (base64): integers in the smallest type that
    holds them, floats as float32, 2-D arrays row by row. Lists and scalars pass through."""
    if not isinstance(values, np.ndarray):
        return values
    if values.dtype.kind in "iub" and values.size:
        lo, hi = int(values.min()), int(values.max())
        kind = next(t for t in ("i1", "i2", "i4") if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max)
    elif values.dtype.kind in "iub":
        kind = "i1"
    else:
        kind = "f4"
    data = np.ascontiguousarray(values, dtype=np.dtype(kind).newbyteorder("<"))
    # a 2-D array (a heatmap's z) keeps its rows and columns: plotly reads "rows, columns"
    shape = ", ".join(map(str, values.shape)) if values.ndim > 1 else str(values.size)
    return {"dtype": kind, "bdata": base64.b64encode(data.tobytes()).decode("ascii"), "shape": shape}


def _plain(obj: Any) -> Any:
    """Plotly graph objects become dicts, numpy arrays typed arrays, numpy scalars Python numbers."""
    if hasattr(obj, "to_plotly_json"):
        obj = obj.to_plotly_json()
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return typed(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def _drop_constant(parts: list[dict]) -> None:
    """Leave out of every frame what no frame changes (the figure's first view has it already):
    plotly merges a frame into the traces and layout it finds, nested objects key by key, so a
    frame needs only what moves. `parts` are the same dict (a trace, a layout, a marker) in every
    frame; emptied dicts stay (a trace is matched by its position)."""
    for key in list(parts[0]):
        values = [p.get(key) for p in parts]
        if all(v == values[0] for v in values):
            for p in parts:
                p.pop(key, None)
        elif all(isinstance(v, dict) and "bdata" not in v for v in values):
            _drop_constant(values)
            if not any(values):
                for p in parts:
                    p.pop(key, None)


class Explorer:
    """A figure of precomputed views with its sliders; displays itself in a notebook or on the site."""

    def __init__(self, figure: dict, knobs: Sequence[Knob], play_ms: int):
        self.figure = figure
        self.knobs = list(knobs)
        self.play_ms = play_ms
        self.json = json.dumps(figure, separators=(",", ":"), allow_nan=False)

    @property
    def nbytes(self) -> int:
        """Bytes of the figure's JSON (what a page carries for it)."""
        return len(self.json.encode("utf-8"))

    @property
    def views(self) -> int:
        return len(self.figure["frames"])

    def __repr__(self) -> str:
        names = " × ".join(f"{k.label} ({len(k.values)})" for k in self.knobs)
        return f"<explorer: {names}; {self.views} views, {self.nbytes / 1024:.0f} kB>"

    def html(self, mode: str | None = None) -> str:
        """The output's HTML. `mode`: "page" (the page loads the scripts), "colab" or "jupyter";
        by default, where this kernel runs (see the module's docstring)."""
        global _plotly_in_notebook
        mode = mode or where()
        data = self.json.replace("</", "<\\/")  # the JSON cannot end its <script> early
        height = self.figure["layout"]["height"]
        body = (f'<div class="inflight-explorer" data-play-ms="{self.play_ms}">'
                f'<div class="inflight-plot" style="width:100%;height:{height}px"></div>'
                f'<script type="application/json" class="inflight-figure">{data}</script></div>')
        if mode == "page":
            return body
        script = f"<script>{explorer_js()}</script>"
        if mode == "colab":
            from plotly.io._utils import plotly_cdn_url

            return f'<script src="{html.escape(plotly_cdn_url())}" charset="utf-8"></script>' + body + script
        if not _plotly_in_notebook:  # once per kernel, as plotly's own notebook renderer does
            from plotly.offline import get_plotlyjs

            _plotly_in_notebook = True
            body = f"<script>window.PlotlyConfig = {{MathJaxConfig: 'local'}};</script><script>{get_plotlyjs()}</script>" + body
        return body + script

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        return {"text/html": self.html(), "text/plain": repr(self)}


def where() -> str:
    """Where this kernel's outputs are shown: "page" (the book's site), "colab" or "jupyter"."""
    if os.environ.get(ENV) == "page":
        return "page"
    return "colab" if "google.colab" in sys.modules else "jupyter"


def explorer_js() -> str:
    """The script that draws explorers and drives their sliders (served by the site once per page)."""
    return resources.files("inflight.book").joinpath("explorer.js").read_text(encoding="utf-8")


def explorer(knobs: Sequence[Knob], draw: Callable[..., View], layout: dict | None = None, *, height: int = 420,
             play_ms: int = 500, max_kb: float = MAX_KB, narrow: dict | None = None) -> Explorer:
    """Compute `draw(**values)` at every point of the knobs' grid and make one figure of it.

    `layout` is the figure's fixed layout (`panels(...)`, legends, axis titles); `height` is the
    plot's own with its top margin, the sliders are added below it. `narrow` is what the chapter's
    explorer changes on a narrow screen, over the book's own narrow layout (`explorer_layout`).
    Fails when the figure's JSON exceeds `max_kb`: a page should stay light, so use fewer knob
    values or fewer points per trace; and on a trace type the site's plotly.js does not draw."""
    if not knobs:
        raise ValueError("an explorer needs at least one knob")
    if len({k.name for k in knobs}) != len(knobs):
        raise ValueError(f"two knobs share a name: {[k.name for k in knobs]}")
    bottom = AXIS_TITLE_PX + slider_rows(knobs, 1 if len(knobs) == 1 else 2) * SLIDER_ROW_PX
    base = base_layout(height + bottom, bottom, layout or {})
    frames, first, ntraces = [], None, None
    start = tuple(k.start_index for k in knobs)
    for index in itertools.product(*(range(len(k.values)) for k in knobs)):
        values = {k.name: k.values[i] for k, i in zip(knobs, index)}
        view = draw(**values)
        if not isinstance(view, View):
            raise TypeError(f"draw must return a View, got {type(view).__name__} for {values}")
        data, view_layout = _plain(view.data), _plain(view.layout)
        if ntraces is not None and len(data) != ntraces:
            raise ValueError(f"every view must have the same traces: {values} has {len(data)}, the first had {ntraces}")
        ntraces = len(data)
        # a frame's annotations and shapes replace the figure's: the fixed ones go with every frame
        frame_layout = merge({key: base.get(key, []) for key in ("annotations", "shapes")}, view_layout)
        frames.append({"name": ",".join(map(str, index)), "data": data, "layout": frame_layout})
        if index == start:
            first = copy.deepcopy((data, view_layout))  # the frames are trimmed below, the first view is not
    _check_traces(first[0])
    for i in range(ntraces):
        _drop_constant([f["data"][i] for f in frames])
    _drop_constant([f["layout"] for f in frames])
    plot_px = base["height"] - base["margin"]["t"] - base["margin"]["b"]
    sliders, menus = controls(knobs, plot_px)
    figure = {"data": first[0], "layout": {**merge(base, first[1]), "sliders": sliders, "updatemenus": menus},
              "frames": frames, "config": {"responsive": True, "displayModeBar": False},
              "narrow": narrow_spec(base, knobs, plot_px, narrow)}
    out = Explorer(figure, knobs, play_ms)
    if out.nbytes > max_kb * 1024:
        raise ValueError(f"the explorer's data is {out.nbytes / 1024:.0f} kB, over {max_kb} kB: "
                         f"use fewer knob values than {[len(k.values) for k in knobs]} or fewer points per trace")
    return out


def _check_traces(data: list) -> None:
    """Every trace must be of a type the site's plotly.js bundle draws."""
    for trace in data:
        kind = trace.get("type", "scatter")
        if kind not in SITE_TRACES:
            raise ValueError(f"trace type {kind!r} is not in the site's plotly.js bundle ({', '.join(SITE_TRACES)}): "
                             "add it to _vendor/plotly/entry.js and SITE_TRACES, and run _vendor/update.sh")
