"""Chapters 2 and 3's explorers: batch size and the spread of output lengths → the Gantt chart of
static batching (chapter 2), and of static batching next to continuous batching (chapter 3).

Each comes in two forms over the same simulation (`inflight.sim.simulate` running the package's
schedulers, or the chapter's): live sliders that simulate and draw at every move
(`static_live`, `batching_explorer`), and the site's figure of a small precomputed grid
(`static_site`, `batching_site`). The workload is `with_spread(48 requests, mean 20 tokens)`, all
present at step 0, so the two knobs are the only things that change. `replay_site` plays schedules
step by step on a shared clock (chapter 3's first picture)."""
from __future__ import annotations

from typing import Any

from matplotlib.collections import PolyCollection

from inflight.book import plots
from inflight.book.gantt_traces import gantt_axis, gantt_traces
from inflight.book.interactive import Explorer, Knob, View, explorer, panels
from inflight.book.widgets import LiveFigure, live_explorer, nice_ceil
from inflight.sim.schedulers import ContinuousBatchScheduler, StaticBatchScheduler
from inflight.sim.simulate import SimResult, simulate
from inflight.sim.workloads import with_spread

N_REQUESTS, MEAN, SEED = 48, 20, 0
LIVE_KNOBS = (Knob("max_batch_size", "batch size", tuple(range(1, 33)), start=8),
              Knob("spread", "length spread", tuple(round(0.1 * i, 1) for i in range(26)), start=1.0, fmt="{:.1f}"))


def site_knobs(batch_sizes: tuple = (1, 2, 4, 8, 16, 32), spreads: tuple = (0.0, 0.5, 1.0, 1.5, 2.0)) -> tuple:
    """The grid of the site's figure: a few values of each live knob (each point is one view)."""
    return (Knob("max_batch_size", "batch size", batch_sizes, start=8),
            Knob("spread", "length spread", spreads, start=1.0, fmt="{:.1f}"))


def run(scheduler: Any, max_batch_size: int, spread: float, name: str) -> SimResult:
    """One schedule of the explorers' workload (`scheduler`: a class taking max_batch_size)."""
    return simulate(scheduler(max_batch_size), with_spread(N_REQUESTS, seed=SEED, mean=MEAN, spread=spread), name=name)


def static_title(r: SimResult) -> str:
    slots = f"{r.num_slots} slot" + ("s" if r.num_slots != 1 else "")
    return (f"static batching, {slots}: {r.steps} steps, {r.utilization:.0%} of slot-steps busy, "
            f"{r.wasted_slot_steps:,} idle while requests wait")


def batching_title(static: SimResult, cont: SimResult) -> str:
    return (f"batch size {static.num_slots}: continuous finishes in {cont.steps} steps vs {static.steps} "
            f"({static.steps / cont.steps:.2f}× fewer)")


# -- chapter 2: static batching alone ---------------------------------------------------------

def _margins(fig: Any, height: float, rows: int = 1, gap: float = 1.0) -> None:
    """Fixed margins and `gap` inches between rows of axes (tight_layout would cost the live
    explorer another draw)."""
    top, bottom = 1 - 0.8 / height, 0.5 / height
    axes_height = (height * (top - bottom) - gap * (rows - 1)) / rows
    fig.subplots_adjust(left=0.09, right=0.98, top=top, bottom=bottom, hspace=gap / axes_height)


class _Gantt:
    """One Gantt chart (as `plots.gantt` draws it), made once: a redraw replaces the rectangles of
    its three collections and its title, and creates no artist."""

    def __init__(self, ax: Any, legend: bool, live: LiveFigure):
        self.ax = ax
        self.idle = live.move(ax.add_collection(PolyCollection([], facecolors=plots.IDLE, linewidths=0)))
        self.wasted = live.move(ax.add_collection(PolyCollection([], facecolors="white", edgecolors=plots.WASTE,
                                                                 hatch="////", linewidths=0)))
        self.busy = live.move(ax.add_collection(PolyCollection([], edgecolors="white", linewidths=0.5)))
        self.title = live.move(ax.set_title("", loc="left", fontsize=11))  # (the left title, not ax.title)
        live.move(ax.yaxis)  # its ticks follow the batch size: drawn at every move, not kept
        ax.set_xlabel("step")
        ax.set_ylabel("slot")
        if legend:
            plots.gantt_legend(ax)
        self.slots = 0

    def draw(self, r: SimResult, xmax: float, title: str) -> None:
        cells = plots.gantt_cells(r)
        for kind in ("idle", "wasted", "busy"):
            getattr(self, kind).set_verts(plots._rects(cells[kind]))
        colors = plots.color_indices(r)
        self.busy.set_facecolor([plots.REQUEST_COLORS[colors[c[3]]] for c in cells["busy"]])
        self.ax.set_xlim(0, xmax)
        if r.num_slots != self.slots:  # new ticks only when the number of slots changes
            self.slots = r.num_slots
            self.ax.set_ylim(r.num_slots - 0.5, -0.5)
            ticks = range(0, r.num_slots, 1 if r.num_slots <= 8 else 2 if r.num_slots <= 16 else 4)
            self.ax.set_yticks(list(ticks), [str(t) for t in ticks])
        self.title.set_text(title)


class LiveGantts:
    """The live explorers' figure, kept from move to move: one Gantt chart per scheduler (a class
    taking max_batch_size, by name) over the explorers' workload, `height` inches tall whatever
    the batch size (a figure that changed size would be drawn anew at every move); `title(*results)`
    heads it. Calling it with the knobs' values runs the schedulers and redraws the charts; the
    picture of the axes is kept while the steps fit the x axis."""

    def __init__(self, schedulers: dict[str, Any], title: Any, height: float, chart_titles: bool = True):
        self.schedulers, self.title, self.chart_titles = schedulers, title, chart_titles
        self.live = LiveFigure(8, height)
        axes = self.live.fig.subplots(len(schedulers), 1, squeeze=False)[:, 0]
        _margins(self.live.fig, height, rows=len(axes))
        self.charts = [_Gantt(ax, k == 0, self.live) for k, ax in enumerate(axes)]
        self.live.title.set_fontsize(10 if len(axes) == 1 else 11)

    def __call__(self, max_batch_size: int, spread: float) -> Any:
        results = [run(cls, max_batch_size, spread, name) for name, cls in self.schedulers.items()]
        xmax = nice_ceil(max(results[0].steps, 1))  # the x axis moves only in nice steps
        for chart, r in zip(self.charts, results):
            chart.draw(r, xmax, f"{r.name}: {r.steps} steps, {r.utilization:.0%} busy" if self.chart_titles else "")
        self.live.title.set_text(self.title(*results))
        return self.live.png(xmax)


def static_live(scheduler: Any = StaticBatchScheduler) -> Any:
    """Sliders for batch size and length spread over static batching's Gantt chart."""
    show = LiveGantts({"static": scheduler}, static_title, 4.4, chart_titles=False)
    return live_explorer(show, LIVE_KNOBS)


def static_site(scheduler: Any = StaticBatchScheduler, knobs: tuple | None = None) -> Explorer:
    def view(max_batch_size: int, spread: float) -> View:
        r = run(scheduler, max_batch_size, spread, "static")
        return View(gantt_traces(r), {"title": {"text": static_title(r)}, "xaxis": {"range": [0, r.steps]},
                                      "yaxis": gantt_axis(max_batch_size)})

    layout = panels(1, 1)
    layout["barmode"] = "overlay"
    layout["xaxis"]["title"] = {"text": "step"}
    return explorer(knobs or site_knobs(), view, layout, height=380)


# -- chapter 3: static next to continuous ---------------------------------------------------

def batching_explorer(static: Any = StaticBatchScheduler, continuous: Any = ContinuousBatchScheduler) -> Any:
    """Sliders for batch size and the spread of output lengths; redraws both schedules."""
    show = LiveGantts({"static": static, "continuous": continuous}, batching_title, 7.0)
    return live_explorer(show, LIVE_KNOBS)


def batching_site(static: Any = StaticBatchScheduler, continuous: Any = ContinuousBatchScheduler,
                  knobs: tuple | None = None) -> Explorer:
    def view(max_batch_size: int, spread: float) -> View:
        s = run(static, max_batch_size, spread, "static")
        c = run(continuous, max_batch_size, spread, "continuous")
        axis = gantt_axis(max_batch_size)
        return View(gantt_traces(s) + gantt_traces(c, ("x2", "y2"), legend=False),
                    {"title": {"text": batching_title(s, c)}, "xaxis": {"range": [0, s.steps]},
                     "yaxis": axis, "yaxis2": axis})

    layout = panels(2, 1, titles=("static batching", "continuous batching"), share_x=True, vspace=0.2)
    layout["barmode"] = "overlay"
    layout["xaxis2"]["title"] = {"text": "step"}
    knobs = knobs or site_knobs((2, 4, 8, 16, 32), (0.0, 0.5, 1.0, 2.0))
    return explorer(knobs, view, layout, height=470)


def replay_site(runs: dict[str, SimResult], frames: int = 36) -> Explorer:
    """Schedules side by side on a shared clock, revealed step by step: a play button (and a slider)
    over time. Every view holds the same Gantt charts, drawn once; a white curtain hides the steps
    still to come, so each frame carries only where the curtain stands."""
    rs = list(runs.values())
    end = max(r.steps for r in rs)
    ticks = tuple(sorted({max(1, round(i * end / frames)) for i in range(1, frames + 1)}))
    traces = [t for k, r in enumerate(rs)
              for t in gantt_traces(r, (f"x{k + 1 if k else ''}", f"y{k + 1 if k else ''}"), legend=k == 0)]

    def view(step: int) -> View:
        shapes, notes = [], []
        for k, r in enumerate(rs):
            n = str(k + 1) if k else ""
            shapes.append({"type": "rect", "layer": "above", "xref": f"x{n}", "yref": f"y{n} domain", "x0": step,
                           "x1": end + 1, "y0": -0.02, "y1": 1.02, "fillcolor": "white", "line": {"width": 0}})
            done = sum(1 for s in r.requests.values() if s.finish_step is not None and s.finish_step < step)
            notes.append({"text": f"step {min(step, r.steps)}: {done}/{len(r.requests)} requests done"
                                  + (" ✓" if step >= r.steps else ""),
                          "xref": f"x{n} domain", "yref": f"y{n} domain", "x": 1, "y": 1, "xanchor": "right",
                          "yanchor": "bottom", "yshift": 4, "showarrow": False, "font": {"size": 13}})
        return View(traces, {"shapes": shapes, "annotations": notes})

    layout = panels(len(rs), 1, titles=tuple(runs), share_x=True, vspace=0.22)
    layout["barmode"] = "overlay"
    # no title: the legend takes the top line, the steps' counters sit on each panel's right
    layout["legend"] = {"x": 0.0, "xanchor": "left", "y": 0.99, "yanchor": "top", "yref": "container"}
    for k, r in enumerate(rs):
        layout[f"yaxis{k + 1 if k else ''}"].update(gantt_axis(r.num_slots))
    layout["xaxis"]["range"] = [0, end]
    layout[f"xaxis{len(rs)}"]["title"] = {"text": "step"}
    knob = Knob("step", "step", ticks, play=True)
    return explorer([knob], view, layout, height=140 + 150 * len(rs), play_ms=150)
