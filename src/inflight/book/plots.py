"""Pictures of scheduling: Gantt charts of slots over steps, utilization and memory curves (their
interactive versions for the site are in `gantt_traces` and the chapters' `explore_*` modules).

Sizes are chosen for the book's text column (about 800 px at 1280 px): figures 8 inches wide at
100 dpi are shown at their own size, and no text is smaller than 9 pt."""
from __future__ import annotations

from typing import Any, Sequence

import matplotlib.pyplot as plt
from matplotlib.collections import PolyCollection
from matplotlib.patches import Patch

from inflight.sim.simulate import SimResult

WASTE = "#d62728"  # hatch colour: idle while someone waits
IDLE = "#ececec"  # idle, nobody waiting
WASTE_FILL = "#f6c9c9"  # flat version of WASTE, for animations
_CMAP = plt.get_cmap("tab20")


def _runs(values: Sequence[Any]) -> list[tuple[int, int, Any]]:
    """(start, length, value) of each run of equal consecutive values."""
    out, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            out.append((start, i - start, values[start]))
            start = i
    return out


def _rect(x: float, slot: int, width: float) -> list[tuple[float, float]]:
    return [(x, slot - 0.4), (x + width, slot - 0.4), (x + width, slot + 0.4), (x, slot + 0.4)]


REQUEST_COLORS = [_CMAP(i) for i in range(20)]


def color_indices(result: SimResult) -> dict[Any, int]:
    """Each request's colour, as an index into REQUEST_COLORS (neighbours get distinct colours)."""
    return {rid: (i * 7) % 20 for i, rid in enumerate(result.requests)}


def _colors(result: SimResult) -> dict[Any, Any]:
    return {rid: REQUEST_COLORS[i] for rid, i in color_indices(result).items()}


def gantt(result: SimResult, ax: Any = None, *, title: str | None = None, labels: bool | None = None,
          legend: bool = True, xmax: int | None = None, hatch: bool = True) -> Any:
    """Slots (rows) over steps (x): one coloured bar per request, idle slot-steps shaded —
    red where a request was waiting (wasted), grey where there was nothing to run.
    `hatch=False` fills wasted cells with flat pink instead (much faster to redraw in animations)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.35 * result.num_slots + 1.5))
    colors = _colors(result)
    steps = result.steps
    if labels is None:
        labels = len(result.requests) <= 30
    # one collection per kind of cell: a few artists instead of hundreds keeps redraws (animations) fast
    busy, busy_colors, idle, waste = [], [], [], []
    for slot in range(result.num_slots):
        col = [row[slot] for row in result.timeline]
        for start, length, rid in _runs(col):
            if rid is None:
                # split the idle run by whether anyone was waiting
                flags = [result.waiting[t] > 0 for t in range(start, start + length)]
                for s2, l2, w in _runs(flags):
                    (waste if w else idle).append(_rect(start + s2, slot, l2))
            else:
                busy.append(_rect(start, slot, length))
                busy_colors.append(colors[rid])
                if labels and length >= max(1, steps / 40):
                    ax.text(start + length / 2, slot, str(rid), ha="center", va="center", fontsize=9)
    ax.add_collection(PolyCollection(idle, facecolors=IDLE, linewidths=0))
    if hatch:
        ax.add_collection(PolyCollection(waste, facecolors="white", edgecolors=WASTE, hatch="////", linewidths=0))
    else:
        ax.add_collection(PolyCollection(waste, facecolors=WASTE_FILL, linewidths=0))
    ax.add_collection(PolyCollection(busy, facecolors=busy_colors, edgecolors="white", linewidths=0.5))
    ax.set_xlim(0, xmax or max(steps, 1))
    ax.set_ylim(result.num_slots - 0.5, -0.5)
    ax.set_yticks(range(result.num_slots))
    ax.set_yticklabels([f"slot {s}" for s in range(result.num_slots)] if result.num_slots <= 16 else
                       [str(s) if s % 4 == 0 else "" for s in range(result.num_slots)])
    ax.set_xlabel("step")
    ax.set_title(title if title is not None else
                 f"{result.name or 'schedule'}: {steps} steps, {result.utilization:.0%} of slot-steps busy",
                 loc="left", fontsize=11)
    if legend:
        ax.legend(handles=[Patch(facecolor="white", edgecolor=WASTE, hatch="////", label="idle while requests wait"),
                           Patch(color=IDLE, label="idle, queue empty")],
                  loc="lower right", bbox_to_anchor=(1, 1), ncol=2, fontsize=9, frameon=False)
    return ax


def utilization_plot(results: dict[str, SimResult] | Sequence[SimResult], ax: Any = None) -> Any:
    """Busy slots at every step, one line per schedule, with the slot count as the ceiling."""
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3))
    items = results.items() if isinstance(results, dict) else [(r.name, r) for r in results]
    top = 0
    for name, r in items:
        ax.step(range(r.steps), r.busy_per_step(), where="post", label=f"{name} ({r.utilization:.0%} busy)")
        top = max(top, r.num_slots)
    ax.axhline(top, color="k", ls=":", lw=1)
    ax.set_ylim(0, top * 1.1)
    ax.set_xlabel("step")
    ax.set_ylabel("busy slots")
    ax.legend(fontsize=9)
    return ax


def memory_plot(results: dict[str, SimResult] | Sequence[SimResult], ax: Any = None) -> Any:
    """Memory held by the running batch at every step, against the budget."""
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3))
    items = results.items() if isinstance(results, dict) else [(r.name, r) for r in results]
    budget = None
    for name, r in items:
        ax.step(range(r.steps), r.memory, where="post", label=name)
        budget = r.max_memory if r.max_memory is not None else budget
    if budget is not None:
        ax.axhline(budget, color="crimson", ls="--", lw=1, label="max_memory")
    ax.set_xlabel("step")
    ax.set_ylabel("memory in use")
    ax.legend(fontsize=9)
    return ax
