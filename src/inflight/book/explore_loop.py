"""Chapter 6's explorer: one engine run, step by step, with what each of the five steps did.

The grader's "tight pool" workload (ten requests arriving over eight steps, a pool of ten blocks of
four tokens, at most four running) runs through `SimEngine` — the engine's own scheduler over a
simulated pool — one iteration at a time. For the step on the slider the picture shows the five
steps in the order they ran, each with what it did (who left and the blocks they gave back, the
budget, who joined, who was preempted, what the forward pass computed); below, every request's
life so far (waiting, prefilling, decoding, preempted) and the blocks held.

`loop_site` plays the engine's order on the site; `loop_live` reruns the engine at every move, for
the right order or any other `step(engine)` (the chapter's wrong orders), in Jupyter."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from inflight.book.interactive import TAB10, Explorer, Knob, View, explorer, panels
from inflight.book.widgets import LiveFigure, live_explorer
from inflight.engine.scheduler import STEP_ORDER
from inflight.engine.sequence import SequenceStatus
from inflight.exercises.engine_loop import WORKLOADS, reference_step
from inflight.sim.engine_sim import SimEngine

PHASE_COLORS = dict(zip(STEP_ORDER, ("#8ecae6", "#90be6d", "#f9c74f", "#f8961e", "#f4978e")))  # the chapter's diagram
IDLE = "#eeeeee"  # a step that had nothing to do
NOT_YET, WAITING, PREFILL, DECODE, STALLED, DONE = range(6)  # a request's state in a step
STATES = {WAITING: ("waiting", "#d9d9d9"), PREFILL: ("prefill", TAB10[1]), DECODE: ("decode", TAB10[0]),
          STALLED: ("running, no token", "#f4a3a3")}


@dataclass
class LoopStep:
    """What one iteration did: each step's words (in the order they ran), whether it acted, and
    after it every request's state and the blocks held."""

    said: list[tuple[str, str, bool]]  # (step name, what it did, did it do anything)
    states: list[int]
    preempted: list[int]
    blocks_held: int


@dataclass
class LoopRun:
    steps: list[LoopStep]
    requests: list[str]
    num_blocks: int
    arrivals: list[int] = field(default_factory=list)


def _names(seqs: Any) -> str:
    return ", ".join(f"r{s.request_id}" for s in seqs)


class _Recorder:
    """Stands in for the engine in `step(engine)`: each of the five calls goes to the engine, and
    what it did is written down in words."""

    def __init__(self, engine: SimEngine):
        self.engine, self.said, self.batch = engine, [], None

    def _call(self, name: str, *args: Any) -> Any:
        free = self.engine.scheduler.allocator.num_free
        out = getattr(self.engine, name)(*args)
        delta = self.engine.scheduler.allocator.num_free - free
        self.said.append((name, *_describe(name, out, delta)))
        if name == "decode":
            self.batch = out
        return out

    def reap(self):
        return self._call("reap")

    def budget(self, *compute):
        return self._call("budget", *compute)

    def admit(self):
        return self._call("admit")

    def preempt(self):
        return self._call("preempt")

    def decode(self):
        return self._call("decode")


def _n(count: int, word: str) -> str:
    return f"{count} {word}" + ("s" if count != 1 else "")


def _describe(name: str, out: Any, freed: int) -> tuple[str, bool]:
    """One step's result in a few words, and whether it did anything."""
    if name == "reap":
        verb = "leaves" if len(out) == 1 else "leave"
        return (f"{_names(out)} {verb};<br>{_n(freed, 'block')} back" if out else "nobody finished"), bool(out)
    if name == "budget":
        return f"{_n(out.blocks, 'block')}, {_n(out.tokens, 'token')},<br>{_n(out.slots, 'slot')} to hand out", True
    if name == "admit":
        verb = "joins" if len(out) == 1 else "join"
        return (f"{_names(out)} {verb}<br>with {_n(-freed, 'block')}" if out else "nobody joins"), bool(out)
    if name == "preempt":
        if out:
            return f"{_names(out)} preempted;<br>{_n(-freed, 'block')} for the rest", True
        return (f"{_n(-freed, 'new block')}<br>for growth" if freed else "nothing to do"), bool(freed)
    seqs = out.seqs
    prefill = sum(1 for s in seqs if not _is_decode(s))
    return (f"{_n(len(seqs), 'request')}:<br>{len(seqs) - prefill} decode, {prefill} prefill<br>"
            f"({_n(out.num_tokens, 'token')})" if seqs else "no batch"), bool(seqs)


def _is_decode(s: Any) -> bool:
    """Whether `s` computed one generated token in the step just run (not part of a prompt)."""
    q = s.num_scheduled_tokens
    return q == 1 and s.num_computed_tokens - q >= s.num_prompt_tokens


def _state(s: Any, in_batch: bool) -> int:
    if s is None:
        return NOT_YET
    if in_batch:
        return DECODE if _is_decode(s) else PREFILL
    if s.finish_reason is not None:
        return DONE
    return STALLED if s.status is SequenceStatus.RUNNING else WAITING


def run_loop(step: Callable[[Any], Any] = reference_step, workload: str = "tight pool",
             max_steps: int = 60) -> LoopRun:
    """Run the workload with `step(engine)` (the engine's order by default), one iteration at a time."""
    engine = SimEngine(**WORKLOADS[workload]())
    ids = [r.id for _, r in engine.pending]
    out = LoopRun([], ids, engine.scheduler.allocator.num_blocks, [r.arrival for _, r in engine.pending])
    while not engine.done() and engine.step_no < max_steps:
        rec = _Recorder(engine)
        engine.run_step(lambda e: step(rec))
        events = engine.scheduler.events
        in_batch = {s.request_id: s for s in (rec.batch.seqs if rec.batch else [])}
        by_id = {s.request_id: s for s in engine.seqs}
        states = [_state(by_id.get(rid), rid in in_batch) for rid in ids]
        out.steps.append(LoopStep(rec.said, states, [ids.index(s.request_id) for s in events.preempted],
                                  engine.scheduler.allocator.num_used))
    return out


def runs_of(run: LoopRun) -> dict[int, list[tuple[int, int, int]]]:
    """(request row, first step, steps) of every run of one state, by state (the timeline's bars)."""
    bars: dict[int, list] = {k: [] for k in STATES}
    for row in range(len(run.requests)):
        column = [st.states[row] for st in run.steps] + [-1]
        start = 0
        for t in range(1, len(column)):
            if column[t] != column[start]:
                if column[start] in bars:
                    bars[column[start]].append((row, start, t - start))
                start = t
    return bars


def headline(run: LoopRun, t: int) -> str:
    st = run.steps[t]
    waiting = sum(s == WAITING for s in st.states)
    running = sum(s in (PREFILL, DECODE, STALLED) for s in st.states)
    done = sum(s == DONE for s in st.states)
    return (f"step {t} of {len(run.steps)}: {running} running, {waiting} waiting, {done} done; "
            f"{st.blocks_held} of {run.num_blocks} KV blocks held")


def box_text(name: str, words: str, k: int) -> str:
    return f"<b>{k + 1} {name}</b><br>{words}"


# -- in Jupyter: matplotlib, one figure updated in place --------------------------------------

class LiveLoop:
    """The live explorer's figure: the five steps (top), the requests' lives, the blocks held."""

    def __init__(self, steps: dict[str, Callable[[Any], Any]], workload: str = "tight pool"):
        self.steps, self.workload = steps, workload
        self.live = LiveFigure(8, 5.8)
        fig, move = self.live.fig, self.live.move
        grid = fig.add_gridspec(3, 1, height_ratios=(1.1, 3, 1.2), hspace=0.35, left=0.08, right=0.98, top=0.9,
                                bottom=0.08)
        self.top = fig.add_subplot(grid[0])
        self.ax = fig.add_subplot(grid[1])
        self.blocks_ax = fig.add_subplot(grid[2], sharex=self.ax)
        self.top.set_xlim(0, 5)
        self.top.set_ylim(0, 1)
        self.top.axis("off")
        self.boxes = [move(self.top.add_patch(Rectangle((k + 0.04, 0.02), 0.92, 0.96, ec="k", lw=0.8)))
                      for k in range(5)]
        self.words = [move(self.top.text(k + 0.5, 0.5, "", ha="center", va="center", fontsize=8.5)) for k in range(5)]
        self.bars = {k: self.ax.add_collection(PolyCollection([], facecolors=color, linewidths=0, label=label))
                     for k, (label, color) in STATES.items()}
        self.marks = self.ax.plot([], [], "x", color="#d62728", ms=8, mew=2, label="preempted")[0]
        self.ax.legend(loc="lower right", bbox_to_anchor=(1, 1), ncol=5, fontsize=8, frameon=False)
        self.held = self.blocks_ax.step([], [], where="post", color="k", lw=1.2)[0]
        self.pool = self.blocks_ax.axhline(0, color="#d62728", ls="--", lw=1, zorder=2.3)  # over the curtain
        self.blocks_ax.set_ylabel("blocks held", fontsize=9)
        self.blocks_ax.set_xlabel("step")
        # the steps still to come, hidden (over the bars and lines, under the axes' frame)
        self.curtains = [move(a.add_patch(Rectangle((0, -1e3), 1e3, 2e3, fc="white", ec="none", zorder=2.2)))
                         for a in (self.ax, self.blocks_ax)]
        for a in (self.ax, self.blocks_ax):
            a.xaxis.set_major_locator(MaxNLocator(integer=True))
            for spine in a.spines.values():
                move(spine)
        move(self.pool)
        self.shown = None

    def _draw_run(self, run: LoopRun) -> None:
        for k, cells in runs_of(run).items():
            self.bars[k].set_verts([[(t, r - 0.4), (t + n, r - 0.4), (t + n, r + 0.4), (t, r + 0.4)]
                                    for r, t, n in cells])
        marks = [(t + 0.5, r) for t, st in enumerate(run.steps) for r in st.preempted]
        self.marks.set_data([m[0] for m in marks], [m[1] for m in marks])
        end = len(run.steps)
        self.held.set_data(np.arange(end + 1), [s.blocks_held for s in run.steps] + [run.steps[-1].blocks_held])
        self.pool.set_ydata([run.num_blocks] * 2)
        self.ax.set_xlim(0, end)
        self.ax.set_ylim(len(run.requests) - 0.5, -0.5)
        self.ax.set_yticks(range(len(run.requests)), [f"r{r}" for r in run.requests], fontsize=8)
        self.blocks_ax.set_ylim(0, run.num_blocks * 1.15)

    def __call__(self, order: str, step: int) -> Any:
        run = run_loop(self.steps[order], self.workload)  # the engine's scheduler, at every move
        if self.shown != order:
            self._draw_run(run)
            self.shown = order
        t = min(step, len(run.steps) - 1)
        for k, (box, text) in enumerate(zip(self.boxes, self.words)):
            name, words, acted = run.steps[t].said[k]
            box.set_facecolor(PHASE_COLORS[name] if acted else IDLE)
            text.set_text(box_text(name, words, k).replace("<b>", "").replace("</b>", "").replace("<br>", "\n"))
        for curtain in self.curtains:
            curtain.set_x(t + 1)
        self.live.title.set_text(headline(run, t))
        return self.live.png(order)


def loop_live(steps: dict[str, Callable[[Any], Any]] | None = None, workload: str = "tight pool") -> Any:
    """A slider for the order of the five steps (`steps`: name → step(engine)) and one, with Play,
    for the iteration; each move reruns the engine."""
    steps = steps or {" → ".join(STEP_ORDER): reference_step}
    figure = LiveLoop(steps, workload)
    end = max(len(run_loop(fn, workload).steps) for fn in steps.values())
    knobs = [Knob("order", "order", tuple(steps)), Knob("step", "step", tuple(range(end)), play=True)]
    return live_explorer(figure, knobs, play_ms=700)


# -- on the site: plotly, every step of the engine's order -------------------------------------

def _view(run: LoopRun, t: int) -> View:
    st = run.steps[t]
    end = len(run.steps)
    data = [{"type": "bar", "x": list(range(5)), "y": [1] * 5, "width": 0.94, "hoverinfo": "skip",
             "showlegend": False, "marker": {"color": [PHASE_COLORS[n] if acted else IDLE for n, _, acted in st.said],
                                             "line": {"color": "#333", "width": 1}}},
            {"type": "scatter", "mode": "text", "x": list(range(5)), "y": [0.5] * 5, "hoverinfo": "skip",
             "showlegend": False, "text": [box_text(n, w, k) for k, (n, w, _) in enumerate(st.said)],
             "textfont": {"size": 12}}]
    for k, cells in runs_of(run).items():
        rows, starts, lengths = (np.array([c[i] for c in cells], dtype=np.int16) for i in range(3))
        data.append({"type": "bar", "orientation": "h", "y": rows, "base": starts, "x": lengths, "width": 0.8,
                     "name": STATES[k][0], "marker": {"color": STATES[k][1], "line": {"width": 0}}, "xaxis": "x2",
                     "yaxis": "y2", "hoverinfo": "skip"})
    marks = [(u + 0.5, r) for u, s in enumerate(run.steps) for r in s.preempted]
    data.append({"type": "scatter", "mode": "markers", "x": [m[0] for m in marks], "y": [m[1] for m in marks],
                 "name": "preempted", "xaxis": "x2", "yaxis": "y2", "hoverinfo": "skip",
                 "marker": {"symbol": "x-thin", "size": 11, "line": {"width": 2.5, "color": "#d62728"}}})
    data.append({"type": "scatter", "mode": "lines", "x0": 0, "dx": 1, "showlegend": False, "xaxis": "x3",
                 "yaxis": "y3", "y": np.array([s.blocks_held for s in run.steps] + [run.steps[-1].blocks_held],
                                             dtype=np.int16),
                 "line": {"color": "black", "shape": "hv", "width": 1.5}, "hoverinfo": "skip"})
    curtains = [{"type": "rect", "layer": "above", "xref": f"x{n}", "yref": f"y{n} domain", "x0": t + 1,
                 "x1": end + 1, "y0": -0.05, "y1": 1.05, "fillcolor": "white", "line": {"width": 0}} for n in (2, 3)]
    return View(data, {"title": {"text": headline(run, t)}, "shapes": curtains})


def loop_site(step: Callable[[Any], Any] = reference_step, workload: str = "tight pool") -> Explorer:
    """The site's figure: every iteration of one run (a slider, and play)."""
    run = run_loop(step, workload)
    end = len(run.steps)
    layout = panels(3, 1, titles=("", "every request, step by step", f"KV blocks held (the pool has {run.num_blocks})"))
    layout["annotations"] = layout["annotations"][1:]
    layout["xaxis"].update(domain=[0, 1], range=[-0.5, 4.5], visible=False, fixedrange=True)
    layout["yaxis"].update(domain=[0.8, 1], range=[-0.03, 1.03], visible=False, fixedrange=True)  # (the boxes' borders)
    layout["yaxis2"].update(domain=[0.3, 0.7], range=[len(run.requests) - 0.5, -0.5], showgrid=False,
                            tickvals=list(range(len(run.requests))), ticktext=[f"r{r}" for r in run.requests])
    layout["yaxis3"].update(domain=[0, 0.16], range=[0, run.num_blocks + 1])
    layout["xaxis2"].update(range=[0, end])
    layout["xaxis3"].update(range=[0, end], matches="x2", title={"text": "step"})
    layout["shapes"] = [{"type": "line", "xref": "x3", "yref": "y3", "x0": 0, "x1": end, "y0": run.num_blocks,
                         "y1": run.num_blocks, "line": {"color": "#d62728", "dash": "dash", "width": 1}}]
    layout.update(barmode="overlay", bargap=0, legend={"x": 1, "xanchor": "right", "y": 0.7, "yanchor": "bottom",
                                                        "orientation": "h", "font": {"size": 11}})
    knob = Knob("step", "step", tuple(range(end)), play=True)
    return explorer([knob], lambda step: _view(run, step), layout, height=520, play_ms=900, narrow=_narrow(layout))


def _narrow(layout: dict) -> dict:  # (the panels' titles follow their axes)
    """On a phone the five steps are a list, one row each, above the requests and the blocks."""
    # of a 700 px plot: the blocks 80 px, the requests 195 px, the steps 320 px (four lines a row)
    rows = {"yaxis": [0.543, 1.0], "yaxis2": [0.214, 0.493], "yaxis3": [0.0, 0.114]}
    return {"height": 700,
            "layout": {"xaxis": {"range": [-0.01, 1.01]}, "yaxis": {"domain": rows["yaxis"], "range": [4.55, -0.55]},
                       **{axis: {"domain": rows[axis]} for axis in ("yaxis2", "yaxis3")}},
            "traces": {0: {"orientation": "h", "x": [1] * 5, "y": list(range(5)), "width": 0.92},
                       1: {"x": [0.5] * 5, "y": list(range(5))}}}
