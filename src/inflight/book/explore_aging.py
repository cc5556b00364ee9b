"""Chapter 8's explorer: the aging rate → who waits.

The chapter's overloaded workload (two classes of requests, 30% of them low priority) runs through
`PriorityScheduler` — the engine's priority order (`inflight.engine.priority`) over chapter 4's
slots — with the starvation guard on the knob: a waiting request's effective priority improves by
one level every `aging` steps (strict priorities: never). Left, every request's wait against its
arrival, by class; right, the trade-off the knob moves along — the low-priority p99 wait against
the high-priority one — for every aging on the slider, this one marked.

`aging_live` simulates at every move in Jupyter; `aging_site` holds the slider's values."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from inflight.book.interactive import TAB10, Explorer, Knob, View, explorer, panels
from inflight.book.widgets import LiveFigure, live_explorer
from inflight.sim.schedulers import PriorityScheduler
from inflight.sim.simulate import SimResult, simulate
from inflight.sim.workloads import Request
from inflight.stats import percentile

CLASSES = ((0, "high priority", TAB10[0]), (1, "low priority", TAB10[3]))
STRICT = "strict"  # the knob's value for no aging at all
AGINGS = (STRICT, 160, 80, 40, 20, 10, 5)


def run(workload: Sequence[Request], priorities: dict, slots: int, aging: Any) -> SimResult:
    """The workload under `PriorityScheduler` with `aging` steps per level (STRICT: none)."""
    return simulate(PriorityScheduler(slots, aging=None if aging == STRICT else aging, priorities=priorities),
                    workload)


def waits(result: SimResult, priorities: dict, level: int) -> tuple[np.ndarray, np.ndarray]:
    """(arrival, steps waited) of the requests of one priority level."""
    pts = [(s.arrival, s.waiting_steps) for rid, s in result.requests.items() if priorities[rid] == level]
    return np.array([p[0] for p in pts], dtype=np.int32), np.array([p[1] for p in pts], dtype=np.int32)


def tails(result: SimResult, priorities: dict) -> tuple[float, float]:
    """The p99 wait of the high- and of the low-priority requests."""
    return tuple(float(percentile(waits(result, priorities, level)[1], 99)) for level, _, _ in CLASSES)


def aging_name(aging: Any) -> str:
    return "strict priorities" if aging == STRICT else f"aging {aging:g} steps per level"


def headline(result: SimResult, priorities: dict, aging: Any) -> str:
    high, low = tails(result, priorities)
    return (f"{aging_name(aging)}: p99 wait {low:.0f} steps for low priority, {high:.0f} for high; "
            f"all done at step {result.steps}")


# -- in Jupyter: matplotlib, one figure updated in place --------------------------------------

class LiveAging:
    """The live explorer's figure: waits by arrival (left), the trade-off over every aging (right)."""

    def __init__(self, workload: Sequence[Request], priorities: dict, slots: int, agings: Sequence):
        self.workload, self.priorities, self.slots = workload, priorities, slots
        self.live = LiveFigure(8, 3.8)
        move = self.live.move
        self.ax, right = self.live.fig.subplots(1, 2, width_ratios=(1.5, 1))
        self.live.fig.subplots_adjust(left=0.08, right=0.98, top=0.83, bottom=0.14, wspace=0.28)  # no tight_layout
        self.points = {level: move(self.ax.plot([], [], "o", ms=3.5, alpha=0.75, color=color, label=name)[0])
                       for level, name, color in CLASSES}
        self.ax.set_xlabel("arrival (step)")
        self.ax.set_ylabel("steps waited before it ran")
        self.ax.legend(fontsize=8, loc="upper left")
        end = max(r.arrival for r in workload)
        self.ax.set_xlim(0, end * 1.02)
        self.curve = {a: tails(run(workload, priorities, slots, a), priorities) for a in agings}
        top = max(max(t) for t in self.curve.values())
        self.ax.set_ylim(-top * 0.03, top * 1.05)  # fixed: the points move, the axes stay
        right.plot([t[0] for t in self.curve.values()], [t[1] for t in self.curve.values()], "o-", color="0.5", ms=3)
        self.mark = move(right.plot([], [], "o", ms=10, color=TAB10[1])[0])
        right.set_xlabel("high priority: p99 wait")
        right.set_ylabel("low priority: p99 wait")

    def __call__(self, aging: Any) -> bytes:
        result = run(self.workload, self.priorities, self.slots, aging)  # the scheduler, at every move
        for level, line in self.points.items():
            line.set_data(*waits(result, self.priorities, level))
        high, low = tails(result, self.priorities)
        self.mark.set_data([high], [low])
        self.live.title.set_text(headline(result, self.priorities, aging).replace("; all", ";\nall"))
        return self.live.png()


def aging_live(workload: Sequence[Request], priorities: dict, slots: int,
               agings: Sequence = (STRICT, 200, 160, 120, 80, 60, 40, 30, 20, 15, 10, 5, 2), start: Any = 40) -> Any:
    """A slider for the aging rate; each move runs the priority scheduler over the workload."""
    figure = LiveAging(workload, priorities, slots, agings)
    knob = Knob("aging", "aging (steps per level)", tuple(agings), start=start, fmt="{}")
    return live_explorer(figure, [knob])


# -- on the site: plotly, one view per aging ---------------------------------------------------

def aging_site(workload: Sequence[Request], priorities: dict, slots: int, agings: Sequence = AGINGS,
               start: Any = 40) -> Explorer:
    """The site's figure: one view per aging on the slider."""
    results = {a: run(workload, priorities, slots, a) for a in agings}
    curve = {a: tails(r, priorities) for a, r in results.items()}
    layout = panels(1, 2, titles=("every request: its wait against its arrival", "p99 wait (steps)"), hspace=0.12)
    layout["xaxis"].update(domain=[0, 0.58], title={"text": "arrival (step)"})
    layout["yaxis"].update(title={"text": "steps waited before it ran"},
                           range=[-5, max(max(t) for t in curve.values()) * 1.05])
    layout["xaxis2"].update(domain=[0.7, 1], title={"text": "high priority"})
    layout["yaxis2"].update(title={"text": "low priority"})
    layout.update(title={"font": {"size": 13}}, margin={"t": 96})
    trade = {"type": "scatter", "mode": "lines+markers+text", "x": [round(t[0], 1) for t in curve.values()],
             "y": [round(t[1], 1) for t in curve.values()], "xaxis": "x2", "yaxis": "y2", "showlegend": False,
             "text": [str(a) for a in curve],  # neighbours' labels on either side of the curve
             "textposition": ["top right" if k % 2 == 0 else "bottom left" for k in range(len(curve))],
             "textfont": {"size": 10}, "line": {"color": "#999"}, "marker": {"size": 5, "color": "#999"},
             "hoverinfo": "skip"}

    def view(aging: Any) -> View:
        r = results[aging]
        data = [{"type": "scatter", "mode": "markers", "x": x, "y": y, "name": name, "opacity": 0.75,
                 "marker": {"size": 5, "color": color}, "hovertemplate": "arrived at step %{x}, waited %{y}<extra></extra>"}
                for level, name, color in CLASSES for x, y in [waits(r, priorities, level)]]
        high, low = curve[aging]
        data += [trade, {"type": "scatter", "mode": "markers", "x": [round(high, 1)], "y": [round(low, 1)],
                         "xaxis": "x2", "yaxis": "y2", "showlegend": False, "hoverinfo": "skip",
                         "marker": {"size": 13, "color": TAB10[1]}}]
        return View(data, {"title": {"text": headline(r, priorities, aging).replace("; all", ";<br>all")}})

    knob = Knob("aging", "aging (steps per level)", tuple(agings), start=start)
    return explorer([knob], view, layout, height=400)
