"""Chapter 4's explorer: the memory budget → head-of-line blocking and the queue over time.

The chapter's mixed workload (small requests and a few large ones arriving faster than they can
be served) runs under each admission policy it compares — strict FIFO and skip-ahead — for the
budget on the knob. Top: the memory each holds, against the budget (strict FIFO leaves memory
idle while a large request waits at the head). Bottom: the requests waiting, all of them and the
large ones alone (under skip-ahead the large ones pile up: starvation). Live sliders simulate at
every move (`admission_live`); the site shows a few budgets precomputed (`admission_site`)."""
from __future__ import annotations

from typing import Any, Sequence

import matplotlib.pyplot as plt
import numpy as np

from inflight.book.interactive import TAB10, Explorer, Knob, View, explorer, panels
from inflight.book.widgets import live_explorer
from inflight.sim.simulate import SimResult, simulate
from inflight.sim.workloads import Request

POINTS = 200  # points per curve on the site: a long run is averaged over windows of steps
BUDGET_COLOR = "#d62728"


def run_policies(workload: Sequence[Request], policies: dict[str, Any], slots: int, budget: float) -> dict[str, SimResult]:
    """Each policy (a scheduler class taking max_batch_size and max_memory) over the workload."""
    return {name: simulate(cls(slots, max_memory=budget), workload, name=name) for name, cls in policies.items()}


def large_waiting(result: SimResult, big_cost: float) -> np.ndarray:
    """Large requests (memory_cost >= big_cost) waiting to start, at each step."""
    change = np.zeros(result.steps + 1, dtype=np.int64)
    for s in result.requests.values():
        if s.memory_cost >= big_cost and s.arrival < result.steps:
            change[s.arrival] += 1
            change[s.first_step if s.first_step is not None else result.steps] -= 1
    return np.cumsum(change)[:-1]


def curves(result: SimResult, big_cost: float, points: int | None = None) -> dict[str, np.ndarray]:
    """Memory in use, requests waiting and large requests waiting per step; with `points`, the
    means over consecutive windows of steps (at most that many), at each window's first step."""
    series = {"memory": np.asarray(result.memory, dtype=float), "waiting": np.asarray(result.waiting, dtype=float),
              "large": large_waiting(result, big_cost).astype(float)}
    width = 1 if points is None else max(1, -(-result.steps // points))
    n = -(-result.steps // width)
    out = {"step": np.arange(n) * width}
    for name, values in series.items():
        padded = np.full(n * width, np.nan)
        padded[:len(values)] = values
        out[name] = np.round(np.nanmean(padded.reshape(n, width), axis=1), 1)
    return out


def summary(runs: dict[str, SimResult], big_cost: float, window: int, sep: str = "\n") -> str:
    """Per policy, one line each: tokens per step while requests still arrive, and large
    requests' mean wait."""
    parts = []
    for name, r in runs.items():
        large = [s.waiting_steps for s in r.requests.values() if s.memory_cost >= big_cost and s.first_step is not None]
        tput = sum(r.busy_per_step()[:window]) / window
        wait = f"large wait {sum(large) / len(large):.0f} steps" if large else "no large request started"
        parts.append(f"{name}: {tput:.1f} tokens/step, {wait}")
    return sep.join(parts)


def admission_figure(workload: Sequence[Request], big_cost: float, policies: dict[str, Any], slots: int,
                     budget: float) -> Any:
    """The live explorer's picture (matplotlib), for one budget."""
    runs = run_policies(workload, policies, slots, budget)
    window = max(r.arrival for r in workload)  # as the chapter: while requests keep arriving
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.2), sharex=True)
    fig.subplots_adjust(left=0.09, right=0.98, top=0.87, bottom=0.1, hspace=0.12)  # tight_layout costs a draw
    for color, (name, r) in zip(TAB10, runs.items()):
        c = curves(r, big_cost)
        top.step(c["step"], c["memory"], where="post", color=color, lw=1, label=name)
        bottom.step(c["step"], c["waiting"], where="post", color=color, lw=1.2, label=f"{name}: all waiting")
        bottom.step(c["step"], c["large"], where="post", color=color, lw=1.2, ls=":", label=f"{name}: large waiting")
    top.axhline(budget, color=BUDGET_COLOR, ls="--", lw=1, label="memory budget")
    top.set_ylabel("memory in use")
    top.legend(fontsize=9, ncol=3, loc="lower center")
    bottom.set_ylabel("requests waiting")
    bottom.set_xlabel("step")
    bottom.legend(fontsize=9, ncol=2)
    fig.suptitle(f"memory budget {budget:g}\n" + summary(runs, big_cost, window), fontsize=10)
    return fig


def admission_live(workload: Sequence[Request], big_cost: float, policies: dict[str, Any], slots: int = 16,
                   budgets: Sequence[float] = tuple(range(12, 66, 2)), start: float = 20) -> Any:
    """A slider for the memory budget; each move runs every policy over the workload."""
    knob = Knob("budget", "memory budget", tuple(budgets), start=start)
    return live_explorer(lambda budget: admission_figure(workload, big_cost, policies, slots, budget), [knob])


def _view(workload: Sequence[Request], big_cost: float, policies: dict[str, Any], slots: int, budget: float) -> View:
    runs = run_policies(workload, policies, slots, budget)
    window = max(r.arrival for r in workload)  # as the chapter: while requests keep arriving
    data, end = [], max(r.steps for r in runs.values())
    for color, (name, r) in zip(TAB10, runs.items()):
        c = curves(r, big_cost, POINTS)
        width = int(c["step"][1]) if len(c["step"]) > 1 else 1  # x = x0 + i * dx: no x arrays to carry
        line = {"type": "scatter", "mode": "lines", "x0": 0, "dx": width,
                "line": {"color": color, "shape": "hv", "width": 1.5}}
        data += [{**line, "y": c["memory"], "name": name, "legendgroup": name},
                 {**line, "y": c["waiting"], "xaxis": "x2", "yaxis": "y2", "name": f"{name}: all", "showlegend": False},
                 {**line, "y": c["large"], "xaxis": "x2", "yaxis": "y2", "name": f"{name}: large", "showlegend": False,
                  "line": {**line["line"], "dash": "dot"}}]
    data.append({"type": "scatter", "mode": "lines", "x": [0, end], "y": [budget, budget], "name": "memory budget",
                 "line": {"color": BUDGET_COLOR, "dash": "dash", "width": 1.2}})
    return View(data, {"title": {"text": f"memory budget {budget:g}<br>" + summary(runs, big_cost, window, "<br>")},
                       "xaxis": {"range": [0, end]}})


def admission_site(workload: Sequence[Request], big_cost: float, policies: dict[str, Any], slots: int = 16,
                   budgets: Sequence[float] = (12, 16, 20, 24, 32, 48), start: float = 20) -> Explorer:
    """The site's figure: one view per budget."""
    layout = panels(2, 1, titles=("memory in use (KV blocks)", "requests waiting: all (solid), large ones (dotted)"),
                    share_x=True, vspace=0.2)
    layout["xaxis2"]["title"] = {"text": "step"}
    layout.update(title={"font": {"size": 13}}, margin={"t": 110})
    knob = Knob("budget", "memory budget", tuple(budgets), start=start)
    return explorer([knob], lambda budget: _view(workload, big_cost, policies, slots, budget), layout, height=480)
