"""Chapter 1's picture of where batching stops being nearly free: a decode step's roofline time and
throughput against the batch size, one curve per context length, from `inflight.sim.roofline`.

Each curve marks the batch at which the requests' KV reads equal the weight reads (a dot) and ends
where the KV caches fill the memory left after the weights (a cross). Sized for the book's text
column (8 inches at 100 dpi); no text under 9 pt."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from inflight.sim.roofline import decode_step, kv_crossover_batch, weight_ridge_batch

__all__ = ["plot_batching_crossover"]


def _batches(last: float) -> np.ndarray:
    """Batch sizes from 1 to `last` (inclusive, fractional end allowed), dense on a log axis."""
    return np.unique(np.concatenate([np.geomspace(1, max(last, 1), 200), [max(last, 1)]]))


def plot_batching_crossover(params: float, weight_bytes: float, kv_bytes_per_token: float,
                            contexts: Sequence[int], peak_flops: float, bandwidth: float,
                            kv_room_bytes: float, title: str = "") -> Figure:
    """Step time (left) and tokens/s (right) against the batch, for each context in `contexts`.

    `kv_room_bytes` is the memory left for KV caches: a curve ends at the batch that fills it."""
    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(8, 4.4))
    colours = plt.get_cmap("viridis")(np.linspace(0.0, 0.85, len(contexts)))
    weights_ms = weight_bytes / bandwidth * 1e3
    ridge = weight_ridge_batch(peak_flops, bandwidth, weight_bytes / params)
    last = max(kv_room_bytes / (min(contexts) * kv_bytes_per_token), ridge * 1.5)
    for ctx, colour in zip(contexts, colours):
        fit = kv_room_bytes / (ctx * kv_bytes_per_token)
        steps = [decode_step(params, weight_bytes, kv_bytes_per_token, b, ctx, peak_flops, bandwidth)
                 for b in _batches(fit)]
        b = np.array([s.batch for s in steps])
        t = np.array([s.time_s for s in steps]) * 1e3
        ax_t.plot(b, t, color=colour, label=f"L = {ctx:,}")
        ax_r.plot(b, b / t * 1e3, color=colour)
        ax_t.plot(b[-1], t[-1], "x", color=colour, ms=8, mew=2)
        ax_r.plot(b[-1], b[-1] / t[-1] * 1e3, "x", color=colour, ms=8, mew=2)
        cross = kv_crossover_batch(weight_bytes, ctx, kv_bytes_per_token)
        if 1 <= cross <= fit:
            s = decode_step(params, weight_bytes, kv_bytes_per_token, cross, ctx, peak_flops, bandwidth)
            ax_t.plot(cross, s.time_s * 1e3, "o", color=colour, ms=7)
            ax_r.plot(cross, cross / s.time_s, "o", color=colour, ms=7)
    ideal = _batches(last)  # no KV reads at all: the weights' roofline
    ideal_t = np.array([decode_step(params, weight_bytes, kv_bytes_per_token, x, 0, peak_flops, bandwidth).time_s
                        for x in ideal])
    ax_t.plot(ideal, ideal_t * 1e3, color="0.55", ls="--", lw=1.2, label="weights only (no KV)")
    ax_r.plot(ideal, ideal / ideal_t, color="0.55", ls="--", lw=1.2)
    plain = FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}")
    for ax in (ax_t, ax_r):
        ax.axvline(ridge, color="C3", ls=":", lw=1.2)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(plain)
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("requests in the batch", fontsize=10)
        ax.tick_params(labelsize=9)
    ax_t.text(ridge * 1.08, weights_ms * 0.9, f"ridge of the\nweight matmuls\n(B* = {ridge:.0f})",
              color="C3", fontsize=9, va="top")
    ax_t.set_ylim(weights_ms * 0.5, None)
    ax_t.set_ylabel("ms per decode step", fontsize=10)
    ax_r.set_ylabel("tokens per second", fontsize=10)
    ax_t.set_title("time per step", fontsize=11)
    ax_r.set_title("throughput", fontsize=11)
    marks = [Line2D([], [], ls="", marker="o", color="0.3", ms=7, label="KV reads = weight reads"),
             Line2D([], [], ls="", marker="x", color="0.3", ms=8, mew=2, label="KV memory full")]
    lines, labels = ax_t.get_legend_handles_labels()
    fig.legend(lines[:-1], labels[:-1], loc="lower center", bbox_to_anchor=(0.5, 0.08), ncol=len(contexts),
               fontsize=9, frameon=False, title="L = tokens in each request's KV cache", title_fontsize=9)
    fig.legend(lines[-1:] + marks, labels[-1:] + [m.get_label() for m in marks], loc="lower center",
               bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=9, frameon=False)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.19, 1, 1))
    return fig
