"""Chapters 7 and 9's explorer: the request rate → what each request waited, the latency
percentiles, and (with objectives) the goodput.

Both chapters sweep the rate at which requests arrive: chapter 7 replays arrivals against the
engine's own clock, chapter 9 sends them to the server over HTTP (`inflight.bench.serve`). Each
run is a row with vLLM's per-request fields — `start_times`, `ttfts`, `itls`, `latencies` and
`output_lens`, in seconds (and `errors`, empty for a request that succeeded) — besides its `rate`.
For the rate on the slider, the left panel draws every request from its arrival: waiting for its
first token (grey), then streaming its tokens (blue; red when it missed an objective); the right
panel the TTFT and inter-token latency percentiles of every rate, with this one marked. Below
capacity the grey bars stay short; past it each request waits for those before it, and the wait
grows with the arrival order.

The runs are too slow to repeat at every move, so both forms step through the rows the chapter
computed: `load_site` on the site, `load_live` in Jupyter."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
from matplotlib.collections import PolyCollection

from inflight.bench.serve.client import RequestResult
from inflight.bench.serve.stats import is_good
from inflight.book.explore_decode import log_ticks
from inflight.book.interactive import TAB10, Explorer, Knob, View, explorer, panels
from inflight.book.widgets import LiveFigure, live_explorer
from inflight.stats import percentile

WAIT, GOOD, BAD = "#c9c9c9", TAB10[0], TAB10[3]
SERIES = (("ttft", 50, "TTFT p50", TAB10[1], "solid"), ("ttft", 99, "TTFT p99", TAB10[1], "dash"),
          ("itl", 50, "ITL p50", TAB10[2], "solid"), ("itl", 99, "ITL p99", TAB10[2], "dash"))


def requests_of(row: dict, slo: dict | None = None) -> dict[str, np.ndarray]:
    """One run's requests in arrival order: arrival and first/last token (s from the first arrival),
    whether each met the objectives `slo` (ms, as `parse_goodput` gives them; all when None), and
    whether it succeeded."""
    errors = row.get("errors") or [""] * len(row["ttfts"])
    order = np.argsort(row["start_times"], kind="stable")
    start = np.asarray(row["start_times"], dtype=float)[order]
    ttft = np.asarray(row["ttfts"], dtype=float)[order]
    latency = np.asarray(row["latencies"], dtype=float)[order]
    ok = np.array([not errors[i] for i in order])
    good = np.array([ok[k] and is_good(RequestResult(success=True, output_len=row["output_lens"][i], ttft=ttft[k],
                                                      latency=latency[k]), slo or {}) for k, i in enumerate(order)])
    t0 = start[0] if len(start) else 0.0
    return {"arrival": start - t0, "first": start - t0 + ttft, "last": start - t0 + latency, "good": good, "ok": ok}


def percentiles(row: dict) -> dict[tuple[str, int], float]:
    """TTFT and ITL percentiles in ms over the run's successful requests (as vLLM computes them)."""
    errors = row.get("errors") or [""] * len(row["ttfts"])
    ttft = [t for t, e in zip(row["ttfts"], errors) if not e]
    itl = [g for gaps, e in zip(row["itls"], errors) if not e for g in gaps]
    return {(name, q): percentile(values, q) * 1e3 for name, values in (("ttft", ttft), ("itl", itl)) for q in (50, 99)}


def headline(row: dict, label: str, slo: dict | None) -> str:
    p = percentiles(row)
    words = (f"{label}: TTFT p50 {p['ttft', 50]:,.0f} ms, p99 {p['ttft', 99]:,.0f} ms; "
             f"ITL p50 {p['itl', 50]:.1f} ms, p99 {p['itl', 99]:.1f} ms")
    if slo:
        r = requests_of(row, slo)
        words += f"<br>{int(r['good'].sum())} of {len(r['good'])} requests met the objectives"
    return words


def _bars(r: dict, good: bool | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, start, length) of the waiting bars (good None) or the streaming bars that met (True) or
    missed (False) the objectives."""
    rows = np.arange(len(r["arrival"]))
    if good is None:
        keep = r["ok"]
        return rows[keep], r["arrival"][keep], (r["first"] - r["arrival"])[keep]
    keep = r["ok"] & (r["good"] == good)
    return rows[keep], r["first"][keep], (r["last"] - r["first"])[keep]


# -- in Jupyter: matplotlib, one figure updated in place --------------------------------------

class LiveLoad:
    """The live explorer's figure: the requests of one run (left), the percentiles of all (right)."""

    def __init__(self, rows: Sequence[dict], labels: Sequence[str], slo: dict | None):
        self.rows, self.labels, self.slo = list(rows), list(labels), slo
        self.live = LiveFigure(8, 4.0)
        move = self.live.move
        self.ax, right = self.live.fig.subplots(1, 2, width_ratios=(1.4, 1))
        self.live.fig.subplots_adjust(left=0.08, right=0.98, top=0.8, bottom=0.13, wspace=0.3)  # no tight_layout
        self.kinds = {kind: move(self.ax.add_collection(PolyCollection([], facecolors=color, linewidths=0)))
                      for kind, color in ((None, WAIT), (True, GOOD), (False, BAD))}
        self.ax.set_xlabel("seconds since the first arrival")
        self.ax.set_ylabel("request (by arrival)")
        rates = [row["rate"] for row in self.rows]
        values = []
        for name, q, label, color, dash in SERIES:
            values += [percentiles(row)[name, q] for row in self.rows]
            right.plot(rates, values[-len(rates):], "o-" if dash == "solid" else "o--", color=color, label=label, ms=4)
        right.set_xscale("log")
        right.set_yscale("log")
        right.set_xticks(rates, [f"{x:.3g}" for x in rates])
        lo, hi = min(values) / 1.3, max(values) * 1.3
        right.set_ylim(lo, hi)
        right.set_yticks(log_ticks(lo, hi), [f"{t:g}" for t in log_ticks(lo, hi)])  # no mathtext: it is slow to draw
        right.minorticks_off()
        right.set_xlabel("request rate (req/s)")
        right.set_ylabel("ms")
        right.legend(fontsize=8, ncol=2, loc="best")
        self.marker = move(right.axvline(rates[0], color="k", lw=0.8, ls=":"))
        # one time axis for every run: the runs compare at a glance, and the axes are drawn once
        self.end = max(float(requests_of(row)["last"].max()) for row in self.rows) * 1.02
        self.ax.set_xlim(0, self.end)

    def __call__(self, rate: float) -> bytes:
        k = [row["rate"] for row in self.rows].index(rate)
        row = self.rows[k]
        r = requests_of(row, self.slo)
        for kind, collection in self.kinds.items():
            collection.set_verts([[(s, y - 0.4), (s + n, y - 0.4), (s + n, y + 0.4), (s, y + 0.4)]
                                  for y, s, n in zip(*_bars(r, kind))])
        self.ax.set_ylim(len(r["arrival"]) - 0.5, -0.5)
        self.marker.set_xdata([rate, rate])
        self.live.title.set_text(headline(row, self.labels[k], self.slo).replace("; ITL", ";\nITL").replace("<br>", "\n"))
        return self.live.png(len(r["arrival"]))


def load_live(rows: Sequence[dict], label: Callable[[dict], str] = lambda row: f"{row['rate']:g} req/s",
              slo: dict | None = None) -> Any:
    """A slider over the runs' rates (the runs themselves: the chapter's)."""
    figure = LiveLoad(rows, [label(row) for row in rows], slo)
    knob = Knob("rate", "request rate", tuple(row["rate"] for row in rows), fmt="{:.3g}")
    return live_explorer(figure, [knob])


# -- on the site: plotly, one view per run -----------------------------------------------------

def _view(rows: Sequence[dict], label: Callable[[dict], str], slo: dict | None, rate: float) -> View:
    row = next(row for row in rows if row["rate"] == rate)
    r = requests_of(row, slo)
    data = []
    for kind, color, name in ((None, WAIT, "waiting for the first token"),
                              (True, GOOD, "streaming" + (", objectives met" if slo else "")),
                              (False, BAD, "streaming, objectives missed")):
        y, base, x = _bars(r, kind)
        data.append({"type": "bar", "orientation": "h", "y": y.astype(np.int16), "base": np.round(base, 4),
                     "x": np.round(x, 4), "width": 0.8, "name": name, "showlegend": kind is not False or bool(slo),
                     "marker": {"color": color, "line": {"width": 0}}, "hoverinfo": "skip"})
    return View(data, {"title": {"text": headline(row, label(row), slo)},
                       "yaxis": {"range": [len(r["arrival"]) - 0.5, -0.5]},
                       "shapes": [{"type": "line", "xref": "x2", "yref": "y2 domain", "x0": rate, "x1": rate, "y0": 0,
                                   "y1": 1, "line": {"color": "black", "width": 1, "dash": "dot"}}]})


def load_site(rows: Sequence[dict], label: Callable[[dict], str] = lambda row: f"{row['rate']:g} req/s",
              slo: dict | None = None, start: int = -1) -> Explorer:
    """The site's figure: one view per run (a slider over the rates); the percentiles of every run
    are drawn once, beside it."""
    rates = [row["rate"] for row in rows]
    layout = panels(1, 2, titles=("every request, from its arrival", "latency percentiles (ms)"), hspace=0.12)
    end = max(float(requests_of(row)["last"].max()) for row in rows) * 1.02  # one time axis for every run
    layout["xaxis"].update(domain=[0, 0.55], range=[0, end], title={"text": "seconds since the first arrival"})
    layout["yaxis"].update(title={"text": "request (by arrival)"}, showgrid=False)
    layout["xaxis2"].update(domain=[0.67, 1], type="log", tickvals=rates, ticktext=[f"{x:.3g}" for x in rates],
                            title={"text": "request rate (req/s)"})
    layout["yaxis2"].update(type="log")
    layout.update(barmode="overlay", title={"font": {"size": 13}}, margin={"t": 110})
    fixed = [{"type": "scatter", "mode": "lines+markers", "x": rates, "name": name,
              "y": [round(percentiles(row)[key, q], 2) for row in rows], "xaxis": "x2", "yaxis": "y2",
              "line": {"color": color, "dash": dash}, "marker": {"size": 6}}
             for key, q, name, color, dash in SERIES]

    def view(rate: float) -> View:
        v = _view(rows, label, slo, rate)
        return View(v.data + fixed, v.layout)

    knob = Knob("rate", "request rate (req/s)", tuple(rates), start=rates[start], fmt="{:.3g}")
    return explorer([knob], view, layout, height=400)
