"""Chapter 11's explorer: how many replicas, how big each one's prefix cache → the hit rate and the
load spread of every routing policy, at a scale no laptop runs.

Each point is `inflight.sim.fleet.simulate_routing`: chat sessions (one of eight system prompts,
then four turns each resending its history) routed to `replicas` replicas with LRU caches of
`cache_blocks` blocks, by vllm-router's four policies. Left, the share of prompt blocks served from
a cache; right, the most-loaded replica's requests over the mean (1 = perfectly even). `fleet_live`
reruns the simulation at every move in Jupyter; `fleet_site` holds a grid of runs for the site."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from inflight.book.interactive import TAB10, Explorer, Knob, View, explorer, panels
from inflight.book.widgets import LiveFigure, live_explorer
from inflight.sim.fleet import ROUTING_POLICIES, simulate_routing

REPLICAS = (2, 4, 8, 16, 32)
CACHES = (100, 200, 400)
LIVE_REPLICAS = (2, 4, 8, 16, 32, 64)
LIVE_CACHES = (50, 100, 200, 400, 800)
SESSIONS = 300
COLORS = [TAB10[i] for i in range(len(ROUTING_POLICIES))]
SPREAD_TOP = 3.0


def runs(replicas: int, cache_blocks: int, sessions: int = SESSIONS) -> list[dict]:
    """One simulation per policy, same sessions."""
    return [simulate_routing(p, replicas, num_sessions=sessions, cache_blocks=cache_blocks) for p in ROUTING_POLICIES]


def caption(rs: list[dict], replicas: int, cache_blocks: int) -> str:
    best = max(rs, key=lambda r: r["hit_rate"])
    rr = rs[0]
    return (f"{replicas} replicas, caches of {cache_blocks} blocks: round robin serves {rr['hit_rate']:.0%} of the prompt "
            f"blocks from a cache, {best['policy']} {best['hit_rate']:.0%} (busiest replica "
            f"{best['load_spread_max_over_mean']:.2f}x the mean)")


# -- in Jupyter ---------------------------------------------------------------------------------

class LiveFleet:
    def __init__(self):
        self.live = LiveFigure(8, 3.8)
        self.ax, self.ax2 = self.live.fig.subplots(1, 2)
        self.live.fig.subplots_adjust(left=0.08, right=0.98, top=0.8, bottom=0.2, wspace=0.3)
        x = np.arange(len(ROUTING_POLICIES))
        self.hit = [self.live.move(b) for b in self.ax.bar(x, np.zeros(len(x)), color=COLORS)]
        self.spread = [self.live.move(b) for b in self.ax2.bar(x, np.zeros(len(x)), color=COLORS)]
        for ax, title, top in ((self.ax, "prompt blocks served from a cache", 1.0),
                               (self.ax2, "busiest replica / mean (1 = even)", SPREAD_TOP)):
            ax.set_xticks(x, [p.replace("_", "\n") for p in ROUTING_POLICIES], fontsize=8)
            ax.set_ylim(0, top)
            ax.set_title(title, loc="left", fontsize=10)
        self.ax2.axhline(1, color="gray", lw=0.8, ls=":")

    def __call__(self, replicas: int, cache_blocks: int) -> bytes:
        rs = runs(replicas, cache_blocks)  # the routing simulation, at every move
        for bar, r in zip(self.hit, rs):
            bar.set_height(r["hit_rate"])
        for bar, r in zip(self.spread, rs):
            bar.set_height(min(r["load_spread_max_over_mean"], SPREAD_TOP))
        self.live.title.set_text(caption(rs, replicas, cache_blocks).replace(": ", ":\n", 1))
        return self.live.png()


def fleet_live(replicas: Sequence[int] = LIVE_REPLICAS, caches: Sequence[int] = LIVE_CACHES) -> Any:
    knobs = [Knob("replicas", "replicas", tuple(replicas), start=8),
             Knob("cache_blocks", "cache per replica (blocks)", tuple(caches), start=200)]
    return live_explorer(LiveFleet(), knobs)


# -- on the site -------------------------------------------------------------------------------

def _view(grid: dict, replicas: int, cache_blocks: int) -> View:
    rs = grid[replicas, cache_blocks]
    names = [p.replace("_", "<br>", 1).replace("_", " ") for p in ROUTING_POLICIES]  # (two lines: a phone's width)
    data = [{"type": "bar", "x": names, "y": [round(r["hit_rate"], 3) for r in rs], "marker": {"color": COLORS},
             "showlegend": False, "hoverinfo": "y"},
            {"type": "bar", "x": names, "y": [round(min(r["load_spread_max_over_mean"], SPREAD_TOP), 3) for r in rs],
             "marker": {"color": COLORS}, "xaxis": "x2", "yaxis": "y2", "showlegend": False, "hoverinfo": "y"}]
    return View(data, {"title": {"text": caption(rs, replicas, cache_blocks).replace(": ", ":<br>", 1)}})


def fleet_site(replicas: Sequence[int] = REPLICAS, caches: Sequence[int] = CACHES) -> Explorer:
    grid = {(n, c): runs(n, c) for n in replicas for c in caches}
    layout = panels(1, 2, titles=("prompt blocks served from a cache", "busiest replica / mean"), hspace=0.12)
    # categories, said outright: the site's first drawing is an outline with numbers in x, which would
    # leave plotly's guess at a linear axis in the layout the real drawing reuses
    layout["xaxis"].update(type="category")
    layout["xaxis2"].update(type="category")
    layout["yaxis"].update(range=[0, 1], tickformat=".0%")
    layout["yaxis2"].update(range=[0, SPREAD_TOP])
    layout.update(title={"font": {"size": 13}}, margin={"t": 96}, bargap=0.3)
    knobs = [Knob("replicas", "replicas", tuple(replicas), start=8),
             Knob("cache_blocks", "cache per replica (blocks)", tuple(caches), start=200)]
    return explorer(knobs, lambda replicas, cache_blocks: _view(grid, replicas, cache_blocks), layout, height=380)
