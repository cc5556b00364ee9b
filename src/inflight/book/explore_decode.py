"""Chapter 1's explorer: batch size and context length → the time of one decode step and the
tokens per second, measured on the device the notebook runs on.

A decode step reads every weight once, shared by the whole batch, and every request's own KV
cache: B·L·(KV bytes per token) more. The explorer puts the measured step time next to both parts
of that traffic over the measured bandwidth. While the requests' KV reads are small next to the
weights, a bigger batch is nearly free; they equal the weights at B× = weights / (L · KV bytes per
token), and beyond it every request adds its own reads — the longer the context, the sooner.

The notebook measures a small grid of (batch, context) points with its own timing function
(`measure_grid`). On the site, a slider steps through the context lengths of that grid
(`decode_site`); in Jupyter, sliders for both knobs re-time the chosen point on the reader's device
at every move and draw it over the grid (`decode_live`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullLocator

from inflight.book.interactive import TAB10, Explorer, Knob, View, explorer, panels
from inflight.book.widgets import live_explorer

Grid = dict  # (batch, context) -> seconds per decode step


@dataclass(frozen=True)
class StepBytes:
    """What one decode step must read, and how fast this device reads."""

    weight_bytes: float
    kv_bytes_per_token: float
    bandwidth: float  # bytes per second, measured

    def weights_seconds(self) -> float:
        return self.weight_bytes / self.bandwidth

    def kv_seconds(self, batch: Any, context: int) -> Any:
        return np.asarray(batch) * context * self.kv_bytes_per_token / self.bandwidth

    def crossover_batch(self, context: int) -> float:
        """The batch whose KV reads equal the weight reads."""
        return self.weight_bytes / (context * self.kv_bytes_per_token)


def measure_grid(time_step: Callable[[int, int], float], batches: Sequence[int], contexts: Sequence[int],
                 fits: Callable[[int, int], bool] = lambda b, L: True, known: Grid | None = None) -> Grid:
    """Seconds per decode step at every (batch, context) that `fits` (the device's memory), timed
    by `time_step(batch, context)`; points already in `known` are kept, not timed again."""
    grid = dict(known or {})
    for context in contexts:
        for batch in batches:
            if (batch, context) not in grid and fits(batch, context):
                grid[batch, context] = time_step(batch, context)
    return grid


def _row(grid: Grid, batches: Sequence[int], context: int) -> np.ndarray:
    return np.array([grid.get((b, context), np.nan) for b in batches], dtype=float)


def title(grid: Grid, costs: StepBytes, batches: Sequence[int], context: int, sep: str = "\n") -> str:
    """Two lines: where the KV reads catch up with the weights, and what the largest batch costs."""
    ms = _row(grid, batches, context) * 1e3
    last = max(i for i in range(len(batches)) if not np.isnan(ms[i]))
    ratio = float(costs.kv_seconds(batches[last], context)) / costs.weights_seconds()
    cross = costs.crossover_batch(context)
    where = (f"the requests' KV reads equal the weight reads at batch {cross:,.0f}" if cross <= batches[-1] else
             f"the requests' KV reads stay below the weight reads up to batch {batches[-1]} (equal at {cross:,.0f})")
    return (f"context {context}: {where}{sep}batch {batches[last]} reads {ratio:.1f}× the weights' bytes in KV "
            f"and its step takes {ms[last] / ms[0]:.1f}× batch 1's")


def ranges(grid: Grid, costs: StepBytes, batches: Sequence[int]) -> tuple[tuple, tuple]:
    """(low, high) of ms per step and of tokens per second over the whole grid: fixed axes, so that
    moving a knob moves the curves, not the axes (the KV line may leave the plot below, at short
    contexts, where it is negligible anyway)."""
    ms = np.array([v for v in grid.values()]) * 1e3
    tps = np.array([b / grid[b, c] for b, c in grid])
    return ((min(ms.min(), costs.weights_seconds() * 1e3) / 2, ms.max() * 1.5),
            (tps.min() / 1.5, tps.max() * 1.5))


def decode_figure(grid: Grid, costs: StepBytes, batches: Sequence[int], context: int, device: str,
                  now: tuple[int, float] | None = None) -> Any:
    """The live explorer's picture (matplotlib); `now` is (batch, seconds) just measured."""
    b = np.array(batches, dtype=float)
    ms = _row(grid, batches, context) * 1e3
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.6))
    fig.subplots_adjust(left=0.09, right=0.98, top=0.83, bottom=0.14, wspace=0.3)  # tight_layout costs a redraw
    ax1.plot(b, ms, "o-", color=TAB10[0], label="measured")
    ax1.plot(b, (costs.weights_seconds() + costs.kv_seconds(b, context)) * 1e3, "--", color="k", lw=1,
             label="(weights + KV) / bandwidth")
    ax1.plot(b, np.full_like(b, costs.weights_seconds() * 1e3), ":", color=TAB10[2], label="weights / bandwidth")
    ax1.plot(b, costs.kv_seconds(b, context) * 1e3, ":", color=TAB10[3], label="KV reads / bandwidth")
    ax2.plot(b, b / ms * 1e3, "o-", color=TAB10[0])
    if now is not None:
        ax1.plot([now[0]], [now[1] * 1e3], "*", ms=14, color=TAB10[1], label="measured just now")
        ax2.plot([now[0]], [now[0] / now[1]], "*", ms=14, color=TAB10[1])
    for ax, label, (lo, hi) in zip((ax1, ax2), ("ms per decode step", "tokens per second"),
                                   ranges(grid, costs, batches)):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_ylim(lo, hi)
        # fixed ticks: log axes' tick finders are most of a redraw otherwise
        ax.set_xticks(b, [str(x) for x in batches])
        ticks = log_ticks(lo, hi)
        ax.set_yticks(ticks, [f"{t:,g}" for t in ticks])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("batch size")
        ax.set_ylabel(label)
    ax1.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"{device}, " + title(grid, costs, batches, context), fontsize=10)
    return fig


def decode_live(time_step: Callable[[int, int], float], grid: Grid, costs: StepBytes, batches: Sequence[int],
                contexts: Sequence[int], device: str) -> Any:
    """Sliders for batch size and context length: each move times that decode step on this device
    (`time_step(batch, context)`) and shows it over the notebook's grid."""
    knobs = [Knob("batch", "batch size", tuple(batches), start=batches[len(batches) // 2]),
             Knob("context", "context length", tuple(contexts), start=contexts[len(contexts) // 2])]

    def show(batch: int, context: int) -> None:
        decode_figure(grid, costs, batches, context, device, (batch, time_step(batch, context)))

    return live_explorer(show, knobs)


def log_ticks(lo: float, hi: float) -> list[float]:
    """Tick values 1, 2, 5 × 10^k between lo and hi (a log axis labels only these)."""
    exponents = range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
    return [float(f"{m}e{e}") for e in exponents for m in (1, 2, 5) if lo <= m * 10.0**e <= hi]


def _view(grid: Grid, costs: StepBytes, batches: Sequence[int], context: int) -> View:
    ms = _row(grid, batches, context) * 1e3
    kv = costs.kv_seconds(batches, context) * 1e3
    cross = costs.crossover_batch(context)
    line = {"type": "scatter", "x": list(batches), "mode": "lines"}
    data = [
        {**line, "y": np.round(ms, 3), "mode": "lines+markers", "name": "measured", "line": {"color": TAB10[0]}},
        {**line, "y": np.round(costs.weights_seconds() * 1e3 + kv, 3), "name": "(weights + KV) / bandwidth",
         "line": {"color": "black", "dash": "dash", "width": 1}},
        {**line, "y": [round(costs.weights_seconds() * 1e3, 3)] * len(batches), "name": "weights / bandwidth",
         "line": {"color": TAB10[2], "dash": "dot", "width": 1.5}},
        {**line, "y": np.round(kv, 3), "name": "KV reads / bandwidth", "line": {"color": TAB10[3], "dash": "dot", "width": 1.5}},
        {**line, "y": np.round(np.array(batches) / ms * 1e3, 1), "mode": "lines+markers", "xaxis": "x2", "yaxis": "y2",
         "name": "tokens per second", "showlegend": False, "line": {"color": TAB10[0]}},
    ]
    # where the KV line crosses the weights line (none when that is beyond the grid's batches)
    mark = [{"type": "line", "xref": "x", "yref": "y domain", "x0": cross, "x1": cross, "y0": 0, "y1": 1,
             "line": {"color": TAB10[3], "dash": "dot", "width": 1}}] if cross <= batches[-1] else []
    return View(data, {"title": {"text": title(grid, costs, batches, context, "<br>")}, "shapes": mark})


def decode_site(grid: Grid, costs: StepBytes, batches: Sequence[int], contexts: Sequence[int], device: str,
                start: int | None = None) -> Explorer:
    """The site's figure: one view per context length of the grid (batch size on the x axis)."""
    layout = panels(1, 2, titles=(f"one decode step on {device}", "tokens per second"), hspace=0.14)
    ms_range, tps_range = ranges(grid, costs, batches)
    for axis in ("xaxis", "xaxis2"):
        layout[axis].update(type="log", tickvals=list(batches), title={"text": "batch size"})
    for axis, (lo, hi), name in (("yaxis", ms_range, "ms per step"), ("yaxis2", tps_range, None)):
        layout[axis].update(type="log", range=[np.log10(lo), np.log10(hi)], tickvals=log_ticks(lo, hi),
                            title={"text": name} if name else {})
    layout.update(legend={"x": 0.01, "xanchor": "left", "y": 0.99, "yanchor": "top", "orientation": "v",
                          "bgcolor": "rgba(255,255,255,0.85)", "font": {"size": 11}},
                  title={"font": {"size": 13}}, margin={"t": 96})
    knob = Knob("context", "context length (tokens in each request's KV cache)", tuple(contexts),
                start=start if start in contexts else contexts[len(contexts) // 2])
    return explorer([knob], lambda context: _view(grid, costs, batches, context), layout, height=400)
