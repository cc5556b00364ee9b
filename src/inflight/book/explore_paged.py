"""Chapter 5's explorer: how the KV cache is laid out (a contiguous reservation of `max_len` per
request, or blocks of 4–32 tokens handed out as a request grows) → what the pool holds, step by step.

A small chat workload (the chapter's, at a quarter of its lengths: prompts of 4–32 tokens, outputs
exponential with mean 12, capped at 64) runs through a pool of 512 KV slots with the engine's own
scheduler and `BlockAllocator` (`inflight.sim.kv_sim`, as the chapter's utilization figures):
whole prompts are written at admission, one token per step after, blocks come back at the reap,
and when the pool runs dry the latest arrival is preempted. The picture is the pool after one
step, slot by slot in rows of 32: a slot that holds a token in its request's colour, a slot that
is reserved but still empty in pink, a free slot in grey, the blocks outlined. Beside it, the
requests in memory at every step, for every layout.

In Jupyter, `paged_live` reruns the engine at every move (a slider for the layout, a Play button
for the step); on the site, `paged_site` holds a few steps of each layout."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.colors import ListedColormap

from inflight.book.interactive import TAB10, Explorer, Knob, View, explorer, panels
from inflight.book.widgets import LiveFigure, live_explorer
from inflight.sim import kv_sim
from inflight.sim.workloads import short_chat

POOL_SLOTS, ROW = 512, 32  # the pool: 16 rows of 32 slots
PROMPTS, MAX_OUTPUT = (4, 32), 64
MAX_LEN = PROMPTS[1] + MAX_OUTPUT  # what the server allows a request: a contiguous reservation, 3 rows
LAYOUTS = ("contiguous", 32, 16, 8, 4)  # the site's; the live slider adds 2 and 1
FREE, EMPTY = 0, 1  # a slot's colour code; a request's tokens are 2 + (its number % 8)
OWNER = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#7f7f7f", "#bcbd22", "#17becf")  # no red, no pink
COLORS = ("#ececec", "#f4a3a3") + OWNER


def workload(n: int = 40, seed: int = 0) -> list[tuple[int, int]]:
    """(prompt_len, output_len) of the explorer's requests: the chapter's chat at a quarter scale."""
    return kv_sim.lengths_of(short_chat(n, seed, prompt_range=PROMPTS, mean_output=12, max_output=MAX_OUTPUT))


def layout_name(layout: Any) -> str:
    return "contiguous (max_len each)" if layout == "contiguous" else f"blocks of {layout}"


@dataclass
class PoolRun:
    """One layout's run: the pool's colour codes after every step, and what it held."""

    layout: Any
    unit: int  # slots per block (max_len for the contiguous layout)
    pools: np.ndarray  # [step, slot] colour codes
    tokens: np.ndarray  # slots holding a token, per step
    reserved: np.ndarray  # slots held by requests, per step
    running: np.ndarray  # requests in memory, per step
    done: np.ndarray  # requests finished, per step
    requests: int

    @property
    def steps(self) -> int:
        return len(self.tokens)


def pool_codes(sim: Any, pool_slots: int) -> np.ndarray:
    """Each slot of the pool now: a request's colour where it holds that request's token, EMPTY
    where a request's block has no token yet, FREE where no request holds it."""
    unit = sim.scheduler.block_size
    codes = np.full(pool_slots, FREE, dtype=np.int8)
    for s in sim.scheduler.running:
        owner = 2 + int(s.request_id) % len(OWNER)
        for i, block in enumerate(s.block_table):
            filled = min(unit, max(0, s.num_computed_tokens - i * unit))
            codes[block * unit:block * unit + filled] = owner
            codes[block * unit + filled:(block + 1) * unit] = EMPTY
    return codes


def run_pool(requests: Sequence[tuple[int, int]], layout: Any, pool_slots: int = POOL_SLOTS) -> PoolRun:
    """The requests through the pool under `layout` ("contiguous" or a block size), step by step."""
    paged = layout != "contiguous"
    sim, pool_slots = kv_sim.kv_engine(requests, "paged" if paged else "contiguous",
                                       block_size=layout if paged else 16, max_len=MAX_LEN, pool_slots=pool_slots)
    pools, tokens, reserved, running, done = [], [], [], [], []
    for sim in kv_sim.kv_steps(sim):
        pools.append(pool_codes(sim, pool_slots))
        seqs = sim.scheduler.running
        tokens.append(sum(s.num_computed_tokens for s in seqs))
        reserved.append(sum(len(s.block_table) for s in seqs) * sim.scheduler.block_size)
        running.append(sum(s.finish_reason is None for s in seqs))
        done.append(sum(s.finish_reason is not None for s in sim.seqs))
    return PoolRun(layout, sim.scheduler.block_size, np.array(pools), *(np.array(a) for a in (tokens, reserved,
                   running, done)), len(requests))


def at(run: PoolRun, step: int) -> tuple[np.ndarray, str]:
    """The pool after `step` (empty once the run is over) as rows of ROW slots, and what it says."""
    if step >= run.steps:
        return np.zeros((len(run.pools[0]) // ROW, ROW), dtype=np.int8), \
            f"{layout_name(run.layout)}: all {run.requests} requests done at step {run.steps}"
    tokens, reserved = int(run.tokens[step]), int(run.reserved[step])
    empty = f"{(reserved - tokens) / reserved:.0%}" if reserved else "none"
    return run.pools[step].reshape(-1, ROW), (
        f"{layout_name(run.layout)}, step {step}: {run.running[step]} requests in memory, "
        f"{run.done[step]} of {run.requests} done; reserved but empty: {empty} "
        f"({reserved - tokens} of {reserved} slots)")


def outlines(unit: int, rows: int) -> list[tuple[str, float]]:
    """The block boundaries inside the pool's grid: ("x", column) lines between blocks in a row,
    ("y", row) lines between reservations that span rows."""
    if unit < ROW:
        return [("x", k * unit - 0.5) for k in range(1, ROW // unit)]
    return [("y", r - 0.5) for r in range(unit // ROW, rows, unit // ROW)]


# -- in Jupyter: matplotlib, one figure updated in place --------------------------------------

class LivePool:
    """The live explorer's figure: the pool (left) and the requests in memory per layout (right)."""

    def __init__(self, requests: Sequence[tuple[int, int]], layouts: Sequence[Any]):
        self.requests = requests
        self.live = LiveFigure(8, 3.9)
        move = self.live.move
        self.pool_ax, self.ax = self.live.fig.subplots(1, 2, width_ratios=(1.7, 1))
        self.live.fig.subplots_adjust(left=0.03, right=0.98, top=0.8, bottom=0.13, wspace=0.16)  # no tight_layout
        rows = POOL_SLOTS // ROW
        self.image = move(self.pool_ax.imshow(np.zeros((rows, ROW)), cmap=ListedColormap(COLORS), vmin=-0.5,
                                              vmax=len(COLORS) - 0.5, interpolation="nearest", aspect="auto"))
        self.edges = move(self.pool_ax.add_collection(LineCollection([], colors="black", linewidths=1.2)))
        self.pool_ax.set_xticks([])
        self.pool_ax.set_yticks([])
        self.pool_ax.set_xlabel(f"the pool: {POOL_SLOTS} KV slots, {ROW} per row")
        self.lines = {}
        for layout in layouts:  # every layout's run once: the lines beside the pool
            r = run_pool(requests, layout)
            self.lines[layout] = move(self.ax.plot(r.running, lw=1, label=str(layout))[0])
        self.cursor = move(self.ax.axvline(0, color="k", lw=0.8, ls=":"))
        self.ax.set_xlabel("step")
        self.ax.set_title("requests in memory", loc="left", fontsize=10)
        self.ax.legend(fontsize=8, title="layout", title_fontsize=8, loc="upper right")

    def __call__(self, layout: Any, step: int) -> Any:
        run = run_pool(self.requests, layout)  # the engine's scheduler and allocator, at every move
        codes, title = at(run, step)
        self.image.set_data(codes)
        rows = len(codes)
        self.edges.set_segments([[(v, -0.5), (v, rows - 0.5)] if axis == "x" else [(-0.5, v), (ROW - 0.5, v)]
                                 for axis, v in outlines(run.unit, rows)])
        for key, line in self.lines.items():
            line.set_linewidth(2.5 if key == layout else 1)
            line.set_alpha(1 if key == layout else 0.35)
        self.cursor.set_xdata([step, step])
        self.live.title.set_text(title.replace("; ", ";\n", 1))
        return self.live.png()


def paged_live(requests: Sequence[tuple[int, int]] | None = None, layouts: Sequence[Any] = LAYOUTS + (2, 1),
               steps: int | None = None) -> Any:
    """A slider for the layout and one (with Play) for the step; each move reruns the engine."""
    requests = requests or workload()
    figure = LivePool(requests, layouts)
    end = steps or max(len(line.get_ydata()) for line in figure.lines.values())
    knobs = [Knob("layout", "layout", tuple(layouts), start=16 if 16 in layouts else layouts[-1]),
             Knob("step", "step", tuple(range(end)), start=10, play=True)]
    return live_explorer(figure, knobs, play_ms=400)


# -- on the site: plotly, a few steps of each layout -----------------------------------------

def _outline_xy(unit: int, rows: int) -> tuple[list, list]:
    """The block boundaries as one polyline (None between segments): a trace, lighter than shapes."""
    xs, ys = [], []
    for axis, v in outlines(unit, rows):
        xs += [v, v, None] if axis == "x" else [-0.5, ROW - 0.5, None]
        ys += [-0.5, rows - 0.5, None] if axis == "x" else [v, v, None]
    return xs, ys


def _view(runs: dict, layout: Any, step: int, top: int) -> View:
    run = runs[layout]
    codes, title = at(run, step)
    xs, ys = _outline_xy(run.unit, len(codes))
    data = [{"type": "heatmap", "z": codes, "zmin": 0, "zmax": len(COLORS) - 1, "showscale": False, "xgap": 1,
             "ygap": 1, "hoverinfo": "skip",
             "colorscale": [[(i + d) / len(COLORS), c] for i, c in enumerate(COLORS) for d in (0, 1)]},
            {"type": "scatter", "mode": "lines", "x": xs, "y": ys, "showlegend": False, "hoverinfo": "skip",
             "line": {"color": "black", "width": 1.5}},
            {"type": "scatter", "mode": "lines", "x": [step, step], "y": [0, top], "xaxis": "x2", "yaxis": "y2",
             "showlegend": False, "hoverinfo": "skip", "line": {"color": "black", "width": 1, "dash": "dot"}}]
    # every layout's curve; the chosen one stands out (a view changes only the curves' opacity)
    data += [{"type": "scatter", "mode": "lines", "x0": 0, "dx": 1, "y": r.running.astype(np.int16),
              "name": layout_name(key).replace(" (max_len each)", ""), "xaxis": "x2", "yaxis": "y2",
              "opacity": 1 if key == layout else 0.3, "line": {"width": 2, "color": TAB10[i]}}
             for i, (key, r) in enumerate(runs.items())]
    return View(data, {"title": {"text": title.replace("; ", ";<br>", 1)}})


def paged_site(requests: Sequence[tuple[int, int]] | None = None, layouts: Sequence[Any] = LAYOUTS,
               frames: int = 9) -> Explorer:
    """The site's figure: the pool after a few steps (play) of each layout (a slider)."""
    requests = requests or workload()
    runs = {layout: run_pool(requests, layout) for layout in layouts}
    end = max(r.steps for key, r in runs.items() if key != "contiguous")  # the paged runs' last step
    ticks = tuple(sorted({round(i * (end - 1) / (frames - 1)) for i in range(frames)}))
    layout = panels(1, 2, titles=(f"the pool: {POOL_SLOTS} KV slots, {ROW} per row", "requests in memory"),
                    hspace=0.1)
    layout["xaxis"].update(domain=[0, 0.58], showticklabels=False, ticks="", showline=False, showgrid=False)
    layout["yaxis"].update(showticklabels=False, ticks="", showline=False, showgrid=False, autorange="reversed")
    layout["xaxis2"].update(domain=[0.68, 1], title={"text": "step"})
    layout["legend"] = {"x": 1, "xanchor": "right", "y": 1, "yanchor": "top", "xref": "paper", "yref": "paper",
                        "orientation": "v", "bgcolor": "rgba(255,255,255,0.8)", "font": {"size": 11}}
    layout.update(title={"font": {"size": 13}}, margin={"t": 96})
    knobs = [Knob("layout", "layout", tuple(layouts), start=16 if 16 in layouts else layouts[-1], fmt="{}"),
             Knob("step", "step", ticks, play=True)]
    top = max(int(r.running.max()) for r in runs.values()) + 1
    return explorer(knobs, lambda layout, step: _view(runs, layout, step, top), layout, height=360,
                    play_ms=600)
