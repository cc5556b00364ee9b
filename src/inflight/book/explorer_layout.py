"""How the book's explorers are laid out, at every width (issue 32): one place for every chapter's
explorer, so a chapter's `explore_*` module says only what its panels show.

- Panels (`panels`) in the book's style; no axis zooms or pans (a swipe over a plot on a phone
  scrolls the page: `dragmode` off, every axis `fixedrange`).
- Sliders below the plot, two to a row; a knob that plays has its button left of its slider, the
  slider padded by the button's width in pixels (so the button never covers the rail at any width).
- Above the plot, explorer.js stacks the figure's title (wrapped to the width), the legend (when
  it sits above the plot) and the panels' titles in bands of their own, measured once drawn.
- Under NARROW_PX (a phone), explorer.js draws `narrow_spec`'s layout instead: panels side by side
  are stacked (each keeps its height in pixels), one slider a row, every legend above the plot, and
  whatever the chapter's explorer adds for itself (`explorer(..., narrow={"layout": ..., "traces": ...})`).
"""
from __future__ import annotations

import re
from typing import Any, Sequence

FONT = {"family": "DejaVu Sans, Verdana, Arial, sans-serif", "size": 13, "color": "#222"}
TAB10 = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
         "#bcbd22", "#17becf"]  # matplotlib's default colours: the static figures' and these agree
AXIS = {"showline": True, "linecolor": "#444", "ticks": "outside", "gridcolor": "#ececec", "zeroline": False,
        "automargin": True, "fixedrange": True}
SLIDER_ROW_PX = 78  # one row of sliders: the current value, the rail, the tick labels
AXIS_TITLE_PX = 58  # the bottom axis's tick labels and title, above the sliders
PLAY_PX = 92  # the play button's room, left of its slider (the button reads "▶ play" or "❚❚ pause")
NARROW_PX = 600  # an explorer narrower than this (a phone) is drawn with its narrow layout
STACK_GAP_PX = 100  # between panels stacked on a narrow screen: tick labels, an axis title, a panel title
MARGIN = {"l": 70, "r": 20, "t": 84}
NARROW_MARGIN = {"l": 48, "r": 12}


def panels(rows: int = 1, cols: int = 1, *, titles: Sequence[str] = (), hspace: float = 0.1,
           vspace: float = 0.18, share_x: bool = False) -> dict:
    """The layout of a grid of panels (row by row: x/y, x2/y2, ...), each titled at its top left
    (placed on its own axes: it follows its panel where the chapter or a narrow screen moves it),
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
        if i < len(titles):  # at the top left of its panel, wherever the chapter moves the panel
            layout["annotations"].append({"text": titles[i], "xref": f"x{n} domain", "yref": f"y{n} domain", "x": 0,
                                          "y": 1, "xanchor": "left", "yanchor": "bottom", "yshift": 6,
                                          "showarrow": False, "font": {"size": 14}})
    return layout


def merge(base: dict, extra: dict) -> dict:
    """`extra` over `base`, recursively; annotations and shapes are added to the base's, not replaced."""
    out = dict(base)
    for key, value in extra.items():
        if key in ("annotations", "shapes"):
            out[key] = list(base.get(key, [])) + list(value)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            out[key] = merge(base[key], value)
        else:
            out[key] = value
    return out


def style(layout: dict) -> dict:
    """Every axis in the book's style (no zoom, no pan), unless the layout says otherwise; a log
    axis labelled at 1, 2 and 5 of each decade unless it says where (plotly labels every digit of
    a short decade, and they pile up)."""
    out = dict(layout)
    for key, value in layout.items():
        if key.startswith(("xaxis", "yaxis")) and isinstance(value, dict):
            out[key] = {**AXIS, **value}
            if value.get("type") == "log" and not {"dtick", "tickvals"} & set(value):
                out[key]["dtick"] = "D2"
    return out


def base_layout(height: int, bottom: int, layout: dict) -> dict:
    """An explorer's fixed layout, `height` pixels tall with `bottom` for the sliders: the book's
    font, colours, margins, title and legend places, and no dragging, under the chapter's `layout`."""
    return style(merge({"height": height, "margin": {**MARGIN, "b": bottom},
                        "font": FONT, "colorway": TAB10, "paper_bgcolor": "white", "plot_bgcolor": "white",
                        "dragmode": False,
                        "title": {"x": 0.0, "xanchor": "left", "xref": "paper", "yref": "container",
                                  "yanchor": "top", "font": {"size": 14}},
                        "legend": {"orientation": "h", "x": 1.0, "xanchor": "right", "y": 1.0, "yanchor": "bottom",
                                   "font": {"size": 12}},
                        "hoverlabel": {"font": {"size": 12}}},
                       layout))


def slider_rows(knobs: Sequence[Any], per_row: int) -> int:
    return -(-len(knobs) // per_row)


def controls(knobs: Sequence[Any], plot_px: float, per_row: int | None = None) -> tuple[list, list]:
    """One slider per knob, `per_row` to a row below the plot (two, or one for a single knob); a
    play button at the left of a knob that plays, its slider padded by the button's width."""
    per_row = per_row or (1 if len(knobs) == 1 else 2)
    width = 1.0 / per_row
    sliders, menus = [], []
    for k, knob in enumerate(knobs):
        row, col = divmod(k, per_row)
        y = -(AXIS_TITLE_PX + row * SLIDER_ROW_PX) / plot_px
        many = len(knob.values) > 12  # tick labels would overlap: the current value alone says it
        sliders.append({
            "active": knob.start_index, "x": col * width, "len": width - 0.03, "y": y,
            "xanchor": "left", "yanchor": "top", "pad": {"t": 6, "b": 0, "l": PLAY_PX if knob.play else 0},
            "currentvalue": {"prefix": f"{knob.label}: ", "font": {"size": 13, "color": "#222"}},
            "font": {"size": 11, "color": "rgba(0,0,0,0)" if many else "#444"},
            "steps": [{"label": knob.fmt.format(v), "method": "skip", "args": [None]} for v in knob.values]})
        if knob.play:
            menus.append({"type": "buttons", "showactive": False, "x": col * width, "y": y, "xanchor": "left",
                          "yanchor": "top", "pad": {"t": 26}, "font": {"size": 12},
                          "buttons": [{"label": "▶ play", "method": "skip", "args": [None],
                                       "name": f"inflight-play-{k}"}]})
    return sliders, menus


def _subplots(layout: dict) -> list[tuple[float, float, float, float]]:
    """(x0, x1, y0, y1) of every subplot of the layout, in paper coordinates."""
    rects = []
    for key, axis in layout.items():
        if not (re.fullmatch(r"xaxis\d*", key) and isinstance(axis, dict)):
            continue
        anchor = axis.get("anchor", "y" + key[5:])
        yaxis = layout.get("yaxis" + anchor[1:], {}) if isinstance(anchor, str) and anchor.startswith("y") else {}
        x0, x1 = axis.get("domain", [0, 1])
        y0, y1 = yaxis.get("domain", [0, 1])
        rects.append((x0, x1, y0, y1))
    return rects


def columns(layout: dict) -> list[tuple[float, float, float, float]]:
    """The columns of panels side by side, left to right, as (x0, x1, y0, y1): subplots whose x
    domains overlap belong to one column. One column: nothing to stack."""
    cols: list[list[float]] = []
    for x0, x1, y0, y1 in sorted(_subplots(layout)):
        if cols and x0 < cols[-1][1] - 1e-6:
            c = cols[-1]
            c[1], c[2], c[3] = max(c[1], x1), min(c[2], y0), max(c[3], y1)
        else:
            cols.append([x0, x1, y0, y1])
    return [tuple(c) for c in cols]


def narrow_spec(layout: dict, knobs: Sequence[Any], plot_px: int, extra: dict | None = None) -> dict:
    """What explorer.js changes under NARROW_PX: columns of panels stacked top to bottom, each its
    height in pixels (`blocks`: each column's paper rectangle, and the y range it takes there: x
    goes to the full width), one slider a row, narrower side margins; `extra` is the chapter's own
    ({"layout": {...}, "traces": {index: {...}}}, its "height" the narrow plot's, in pixels)."""
    extra = dict(extra or {})
    cols = columns(layout)
    blocks = []
    if len(cols) > 1:
        heights = [(y1 - y0) * plot_px for _, _, y0, y1 in cols]
        total = sum(heights) + STACK_GAP_PX * (len(cols) - 1)
        top = total
        for (x0, x1, y0, y1), h in zip(cols, heights):
            blocks.append([x0, x1, y0, y1, (top - h) / total, top / total])
            top -= h + STACK_GAP_PX
        plot_px = round(total)
    plot_px = extra.pop("height", plot_px)
    rows = slider_rows(knobs, 1)
    bottom = AXIS_TITLE_PX + rows * SLIDER_ROW_PX
    sliders, menus = controls(knobs, plot_px, per_row=1)
    geometry = ("x", "len", "y", "pad")
    out_layout = {"height": plot_px + MARGIN["t"] + bottom, "margin": {**NARROW_MARGIN, "b": bottom},
                  "sliders": [{k: s[k] for k in geometry} for s in sliders],
                  "updatemenus": [{"x": m["x"], "y": m["y"]} for m in menus]}
    return {"below": NARROW_PX, "blocks": blocks, "plot_px": plot_px,
            "layout": merge(out_layout, extra.get("layout", {})), "traces": extra.get("traces", {})}
