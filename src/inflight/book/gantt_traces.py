"""The Gantt chart of `plots.gantt` as plotly traces, for the site's explorers: slots (rows) over
steps (x), one bar per request's run, idle slot-steps shaded — hatched red where a request was
waiting (wasted), grey where there was nothing to run. Same colours as the matplotlib version.

Three bar traces per chart (idle, wasted, busy), always in that order, so a chart's traces match
from one view of an explorer to the next whatever the schedule."""
from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.colors import to_hex

from inflight.book import plots
from inflight.sim.simulate import SimResult

BAR = 0.8  # bar height in slots, as in plots.gantt
# plotly.js 4 warns about every bar coloured by a number through a colorscale: colour strings
HEX = [to_hex(c) for c in plots.REQUEST_COLORS]


def _cells(result: SimResult) -> dict[str, list[tuple[int, int, int, Any]]]:
    """(slot, start, length, request id or None) of every run of busy, wasted and idle cells."""
    cells: dict[str, list] = {"idle": [], "wasted": [], "busy": []}
    for slot in range(result.num_slots):
        column = [row[slot] for row in result.timeline]
        for start, length, rid in plots._runs(column):
            if rid is not None:
                cells["busy"].append((slot, start, length, rid))
                continue
            waiting = [result.waiting[t] > 0 for t in range(start, start + length)]
            for s2, l2, w in plots._runs(waiting):
                cells["wasted" if w else "idle"].append((slot, start + s2, l2, None))
    return cells


def _bars(cells: list, name: str, axes: tuple[str, str], marker: dict, legend: bool, **extra: Any) -> dict:
    slots, starts, lengths = (np.array([c[i] for c in cells], dtype=np.int32) for i in range(3))
    return {"type": "bar", "orientation": "h", "name": name, "y": slots, "base": starts, "x": lengths,
            "width": BAR, "marker": marker, "xaxis": axes[0], "yaxis": axes[1], "showlegend": legend,
            "legendgroup": name, **extra}


def gantt_traces(result: SimResult, axes: tuple[str, str] = ("x", "y"), legend: bool = True) -> list[dict]:
    """The three bar traces of `result`'s Gantt chart on the given axes (plotly's "x2", "y2", ...).

    Put the layout's `barmode` to "overlay" and reverse the y axis (`gantt_axis`)."""
    cells = _cells(result)
    order = {rid: i for i, rid in enumerate(result.requests)}
    colors = plots.color_indices(result)
    busy = cells["busy"]
    return [
        _bars(cells["idle"], "idle, queue empty", axes, {"color": plots.IDLE, "line": {"width": 0}}, legend,
              hoverinfo="skip"),
        _bars(cells["wasted"], "idle while requests wait", axes,
              {"color": "white", "line": {"width": 0},
               "pattern": {"shape": "/", "fgcolor": plots.WASTE, "size": 6, "solidity": 0.25}}, legend,
              hovertemplate="slot %{y}: idle for %{x} steps while requests wait<extra></extra>"),
        _bars(busy, "request", axes,
              {"color": [HEX[colors[c[3]]] for c in busy], "line": {"color": "white", "width": 0.5}}, False,
              customdata=np.array([order[c[3]] for c in busy], dtype=np.int32),
              hovertemplate="request %{customdata} in slot %{y}: %{x} steps<extra></extra>"),
    ]


def gantt_axis(num_slots: int) -> dict:
    """A y axis of slots, slot 0 on top, labelled like plots.gantt."""
    step = 1 if num_slots <= 16 else 4
    ticks = list(range(0, num_slots, step))
    return {"range": [num_slots - 0.5, -0.5], "tickvals": ticks, "showgrid": False,
            "ticktext": [f"slot {s}" if num_slots <= 16 else str(s) for s in ticks]}
