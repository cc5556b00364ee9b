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

import matplotlib.pyplot as plt

from inflight.book import plots
from inflight.book.gantt_traces import gantt_axis, gantt_traces
from inflight.book.interactive import Explorer, Knob, View, explorer, panels
from inflight.book.widgets import live_explorer
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

def static_figure(max_batch_size: int = 8, spread: float = 1.0, scheduler: Any = StaticBatchScheduler) -> Any:
    r = run(scheduler, max_batch_size, spread, "static")
    height = 2.0 + 0.2 * max_batch_size
    fig, ax = plt.subplots(figsize=(8, height))
    _margins(fig, height)
    plots.gantt(r, ax, labels=False, title="")
    fig.suptitle(static_title(r), fontsize=10)
    return fig


def _margins(fig: Any, height: float, rows: int = 1, gap: float = 1.0) -> None:
    """Fixed margins and `gap` inches between rows of axes (tight_layout would cost the live
    explorer another draw)."""
    top, bottom = 1 - 0.8 / height, 0.5 / height
    axes_height = (height * (top - bottom) - gap * (rows - 1)) / rows
    fig.subplots_adjust(left=0.09, right=0.98, top=top, bottom=bottom, hspace=gap / axes_height)


def static_live(scheduler: Any = StaticBatchScheduler) -> Any:
    """Sliders for batch size and length spread over static batching's Gantt chart."""
    return live_explorer(lambda max_batch_size, spread: static_figure(max_batch_size, spread, scheduler), LIVE_KNOBS)


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

def batching_figure(max_batch_size: int = 8, spread: float = 1.0, static: Any = StaticBatchScheduler,
                    continuous: Any = ContinuousBatchScheduler) -> Any:
    """Static vs continuous Gantt charts for one workload; returns the figure."""
    s = run(static, max_batch_size, spread, "static")
    c = run(continuous, max_batch_size, spread, "continuous")
    height = 2.6 + 0.4 * min(max_batch_size, 16)
    fig, axes = plt.subplots(2, 1, figsize=(8, height))
    _margins(fig, height, rows=2)
    for ax, r, legend in zip(axes, (s, c), (True, False)):
        plots.gantt(r, ax, labels=False, xmax=s.steps, legend=legend,
                    title=f"{r.name}: {r.steps} steps, {r.utilization:.0%} busy")
    fig.suptitle(batching_title(s, c), fontsize=11)
    return fig


def batching_explorer(static: Any = StaticBatchScheduler, continuous: Any = ContinuousBatchScheduler) -> Any:
    """Sliders for batch size and the spread of output lengths; redraws both schedules."""
    return live_explorer(lambda max_batch_size, spread: batching_figure(max_batch_size, spread, static, continuous),
                         LIVE_KNOBS)


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
