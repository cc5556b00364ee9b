"""ipywidgets explorers for Jupyter and Colab (they need a live kernel; the static site shows the
animations in `inflight.book.plots` instead)."""
from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt

from inflight.book import plots
from inflight.sim.schedulers import ContinuousBatchScheduler, StaticBatchScheduler
from inflight.sim.simulate import simulate
from inflight.sim.workloads import with_spread


def batching_figure(max_batch_size: int = 8, spread: float = 1.0, n_requests: int = 48, mean: float = 20,
                    seed: int = 0) -> Any:
    """Static vs continuous Gantt charts for one workload; returns the figure."""
    w = with_spread(n_requests, seed=seed, mean=mean, spread=spread)
    static = simulate(StaticBatchScheduler(max_batch_size), w, name="static")
    cont = simulate(ContinuousBatchScheduler(max_batch_size), w, name="continuous")
    fig, axes = plt.subplots(2, 1, figsize=(8, 2.5 + 0.5 * max_batch_size), sharex=False)
    for ax, r in zip(axes, (static, cont)):
        plots.gantt(r, ax, labels=False, xmax=static.steps)
    fig.suptitle(f"batch size {max_batch_size}, spread {spread:.1f}: continuous finishes in "
                 f"{cont.steps} steps vs {static.steps} ({static.steps / cont.steps:.2f}× fewer)", fontsize=11)
    fig.tight_layout()
    return fig


def batching_explorer(n_requests: int = 48, mean: float = 20, seed: int = 0) -> Any:
    """Sliders for batch size and the spread of output lengths; redraws both schedules."""
    import ipywidgets as widgets

    def show(max_batch_size: int, spread: float) -> None:
        batching_figure(max_batch_size, spread, n_requests, mean, seed)
        plt.show()

    return widgets.interactive(
        show,
        max_batch_size=widgets.IntSlider(value=8, min=1, max=32, description="batch size"),
        spread=widgets.FloatSlider(value=1.0, min=0.0, max=2.5, step=0.1, description="length spread"),
    )
