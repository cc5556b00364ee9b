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

ENV = "INFLIGHT_EXPLORER_JS"  # "page": the page loads plotly.js and explorer.js (the book's site)
FONT = {"family": "DejaVu Sans, Verdana, Arial, sans-serif", "size": 13, "color": "#222"}
TAB10 = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
         "#bcbd22", "#17becf"]  # matplotlib's default colours: the static figures' and these agree
AXIS = {"showline": True, "linecolor": "#444", "ticks": "outside", "gridcolor": "#ececec", "zeroline": False,
        "automargin": True}
SLIDER_ROW_PX = 78  # one row of sliders: the current value, the rail, the tick labels
AXIS_TITLE_PX = 58  # the bottom axis's tick labels and title, above the sliders
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
    holds them, floats as float32. Lists and scalars pass through."""
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
    return {"dtype": kind, "bdata": base64.b64encode(data.tobytes()).decode("ascii"), "shape": str(values.size)}


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


def panels(rows: int = 1, cols: int = 1, *, titles: Sequence[str] = (), hspace: float = 0.1,
           vspace: float = 0.18, share_x: bool = False) -> dict:
    """The layout of a grid of panels (row by row: x/y, x2/y2, ...), each titled at its top left,
    in the book's style. `share_x` links every panel's x axis to the first."""
    layout: dict = {"annotations": []}
    width = (1 - hspace * (cols - 1)) / cols
    height = (1 - vspace * (rows - 1)) / rows
    for i in range(rows * cols):
        r, c = divmod(i, cols)
        n = "" if i == 0 else str(i + 1)
        x0, y1 = c * (width + hspace), 1 - r * (height + vspace)
        layout[f"xaxis{n}"] = {"domain": [x0, x0 + width], "anchor": f"y{n}", **AXIS}
        layout[f"yaxis{n}"] = {"domain": [y1 - height, y1], "anchor": f"x{n}", **AXIS}
        if share_x and i:
            layout[f"xaxis{n}"]["matches"] = "x"
        if i < len(titles):
            layout["annotations"].append({"text": titles[i], "xref": "paper", "yref": "paper", "x": x0, "y": y1,
                                          "xanchor": "left", "yanchor": "bottom", "yshift": 6, "showarrow": False,
                                          "font": {"size": 14}})
    return layout


def _merge(base: dict, extra: dict) -> dict:
    """`extra` over `base`, recursively; annotations and shapes are added to the base's, not replaced."""
    out = dict(base)
    for key, value in extra.items():
        if key in ("annotations", "shapes"):
            out[key] = list(base.get(key, [])) + list(value)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            out[key] = _merge(base[key], value)
        else:
            out[key] = value
    return out


def _controls(knobs: Sequence[Knob], plot_px: float) -> tuple[list, list]:
    """One slider per knob, two to a row below the plot; a play button left of a knob that plays."""
    sliders, menus = [], []
    per_row = 1 if len(knobs) == 1 else 2
    width = 1.0 / per_row
    for k, knob in enumerate(knobs):
        row, col = divmod(k, per_row)
        y = -(AXIS_TITLE_PX + row * SLIDER_ROW_PX) / plot_px
        x0 = col * width + (0.13 if knob.play else 0.0)
        many = len(knob.values) > 12  # tick labels would overlap: the current value alone says it
        sliders.append({
            "active": knob.start_index, "x": x0, "len": width - (x0 - col * width) - 0.03, "y": y,
            "xanchor": "left", "yanchor": "top", "pad": {"t": 6, "b": 0},
            "currentvalue": {"prefix": f"{knob.label}: ", "font": {"size": 13, "color": "#222"}},
            "font": {"size": 11, "color": "rgba(0,0,0,0)" if many else "#444"},
            "steps": [{"label": knob.fmt.format(v), "method": "skip", "args": [None]} for v in knob.values]})
        if knob.play:
            menus.append({"type": "buttons", "showactive": False, "x": col * width, "y": y, "xanchor": "left",
                          "yanchor": "top", "pad": {"t": 26}, "font": {"size": 12},
                          "buttons": [{"label": "▶ play", "method": "skip", "args": [None],
                                       "name": f"inflight-play-{k}"}]})
    return sliders, menus


def _style(layout: dict) -> dict:
    """Every axis in the book's style, unless the layout says otherwise."""
    out = dict(layout)
    for key, value in layout.items():
        if key.startswith(("xaxis", "yaxis")) and isinstance(value, dict):
            out[key] = {**AXIS, **value}
    return out


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
             play_ms: int = 500, max_kb: float = MAX_KB) -> Explorer:
    """Compute `draw(**values)` at every point of the knobs' grid and make one figure of it.

    `layout` is the figure's fixed layout (`panels(...)`, legends, axis titles); `height` is the
    plot's own, the sliders are added below it. Fails when the figure's JSON exceeds `max_kb`:
    a page should stay light, so use fewer knob values or fewer points per trace."""
    if not knobs:
        raise ValueError("an explorer needs at least one knob")
    if len({k.name for k in knobs}) != len(knobs):
        raise ValueError(f"two knobs share a name: {[k.name for k in knobs]}")
    rows = 1 if len(knobs) == 1 else -(-len(knobs) // 2)
    bottom = AXIS_TITLE_PX + rows * SLIDER_ROW_PX
    # the title on the top line, the legend under it on the right (panel titles sit on its left)
    base = _style(_merge({"height": height + bottom, "margin": {"l": 70, "r": 20, "t": 84, "b": bottom},
                          "font": FONT, "colorway": TAB10, "paper_bgcolor": "white", "plot_bgcolor": "white",
                          "title": {"x": 0.0, "xanchor": "left", "xref": "paper", "yref": "container",
                                    "yanchor": "top", "font": {"size": 14}},
                          "legend": {"orientation": "h", "x": 1.0, "xanchor": "right", "y": 1.0, "yanchor": "bottom",
                                     "font": {"size": 12}},
                          "hoverlabel": {"font": {"size": 12}}},
                         layout or {}))
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
        frame_layout = _merge({key: base.get(key, []) for key in ("annotations", "shapes")}, view_layout)
        frames.append({"name": ",".join(map(str, index)), "data": data, "layout": frame_layout})
        if index == start:
            first = copy.deepcopy((data, view_layout))  # the frames are trimmed below, the first view is not
    for i in range(ntraces):
        _drop_constant([f["data"][i] for f in frames])
    _drop_constant([f["layout"] for f in frames])
    # 12 px from the top; plotly lifts a title of several lines by 12 px more (measured, plotly.js 4)
    titles = [f["layout"].get("title", {}).get("text", "") for f in frames] + [first[1].get("title", {}).get("text", "")]
    base["title"].setdefault("y", 1 - (12 + 12 * any("<br>" in str(t) for t in titles)) / base["height"])
    sliders, menus = _controls(knobs, base["height"] - base["margin"]["t"] - base["margin"]["b"])
    figure = {"data": first[0], "layout": {**_merge(base, first[1]), "sliders": sliders, "updatemenus": menus},
              "frames": frames, "config": {"responsive": True, "displayModeBar": False}}
    out = Explorer(figure, knobs, play_ms)
    if out.nbytes > max_kb * 1024:
        raise ValueError(f"the explorer's data is {out.nbytes / 1024:.0f} kB, over {max_kb} kB: "
                         f"use fewer knob values than {[len(k.values) for k in knobs]} or fewer points per trace")
    return out
