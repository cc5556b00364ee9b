"""Chapter 8's second explorer: the prefix cache as a tree, filling and evicting, step by step.

Requests that start with one of three system prompts (A, B, C: three blocks each), then a short
user turn of their own, arrive one every few steps at `SimEngine` with prefix caching on — the
engine's scheduler over a `PrefixCachingBlockAllocator` whose pool is too small to keep every
prefix. Every full block's key names its whole prefix (the key of its parent block and its own
tokens), so the cached blocks form a tree: a system prompt's blocks are a trunk, each request's own
blocks a branch. For the step on the slider each block of that tree is drawn as what the pool holds
then — in use (blue, larger the more requests share it), cached for reuse with nobody holding it
(light blue: the next request with that prefix takes it for free, or the allocator evicts it,
least recently used first), evicted (red ring), or not computed yet (a faint ring); beside it, the
pool's blocks by state over the run.

`prefix_site` steps through one run on the site; `prefix_live` reruns it at every move in Jupyter,
for any pool size."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from matplotlib.collections import LineCollection

from inflight.book.interactive import TAB10, Explorer, Knob, View, explorer, panels
from inflight.book.widgets import LiveFigure, live_explorer
from inflight.sim.engine_sim import SimEngine
from inflight.sim.workloads import Request

BLOCK = 4
SYSTEMS = "ABC"
NOT_YET, EVICTED, CACHED, IN_USE = range(4)  # a block's state in a step
STATE_COLORS = ("white", "white", "#9ecae1", TAB10[0])
EDGE_COLORS = ("#d0d0d0", "#d62728", "#6baed6", TAB10[0])


def workload(n: int = 14, seed: int = 0, every: int = 3) -> tuple[list[Request], dict[str, list[int]], list[str]]:
    """`n` requests, one every `every` steps: a system prompt (A most often), a user turn of 2-6
    tokens, 4-10 tokens out. Returns the requests, their token ids and their system prompts."""
    rng = random.Random(seed)
    systems = {s: [100 * (k + 1) + i for i in range(3 * BLOCK)] for k, s in enumerate(SYSTEMS)}
    requests, prompts, which = [], {}, []
    for i in range(n):
        system = rng.choices(SYSTEMS, weights=(5, 3, 2))[0]
        prompt = systems[system] + [1000 + 10 * i + j for j in range(rng.randint(2, 6))]
        requests.append(Request(str(i), len(prompt), rng.randint(4, 10), every * i))
        prompts[str(i)] = prompt
        which.append(system)
    return requests, prompts, which


@dataclass
class PrefixRun:
    """One run: the tree of every block key that was ever cached, and each step's states."""

    keys: list[bytes]  # the tree's nodes, parents before children
    parent: list[int]  # index of each node's parent (-1: a first block)
    system: list[str]  # the system prompt each node's branch starts with
    states: np.ndarray  # [step, node]
    holders: np.ndarray  # [step, node]: requests holding it
    pool: np.ndarray  # [step, (in use, cached, free)]
    said: list[str]  # what happened in each step
    num_blocks: int
    hit_rate: float  # of the prompt tokens the cache could have served, the share it did
    evictions: int


def run_prefix(num_blocks: int = 16, requests: Any = None, max_steps: int = 400) -> PrefixRun:
    """The workload through the engine with prefix caching, recording the cache after each step."""
    requests, prompts, which = requests or workload()
    sim = SimEngine(requests, num_blocks=num_blocks, block_size=BLOCK, max_batch_size=4, max_batched_tokens=64,
                    enable_prefix_caching=True, prompts=prompts)
    alloc = sim.scheduler.allocator
    snapshots, said, evictions = [], [], 0
    while not sim.done() and sim.step_no < max_steps:
        sim.run_step(SimEngine.step_in_order)
        cached = {alloc.key_of(b): b for b in range(num_blocks) if alloc.key_of(b) is not None}
        snapshots.append((cached, {b: alloc.ref_count(b) for b in cached.values()},
                          (alloc.num_used, alloc.num_evictable, alloc.num_free - alloc.num_evictable)))
        said.append(_said(sim, which, alloc.stats.evictions - evictions))
        evictions = alloc.stats.evictions
    seqs = sorted(sim.seqs, key=lambda s: int(s.request_id))
    keys, parent, system = [], [], []
    index: dict[bytes, int] = {}
    for s in seqs:  # every chain of keys, merged into one tree
        for depth, key in enumerate(s.block_hashes):
            if key not in index:
                index[key] = len(keys)
                keys.append(key)
                parent.append(index[s.block_hashes[depth - 1]] if depth else -1)
                system.append(which[int(s.request_id)])
    states = np.full((len(snapshots), len(keys)), NOT_YET, dtype=np.int8)
    holders = np.zeros((len(snapshots), len(keys)), dtype=np.int8)
    seen = np.zeros(len(keys), dtype=bool)
    for t, (cached, refs, _) in enumerate(snapshots):
        for k, key in enumerate(keys):
            block = cached.get(key)
            if block is None:
                states[t, k] = EVICTED if seen[k] else NOT_YET
            else:
                seen[k] = True
                holders[t, k] = refs[block]
                states[t, k] = IN_USE if refs[block] else CACHED
    return PrefixRun(keys, parent, system, states, holders, np.array([p for _, _, p in snapshots]), said, num_blocks,
                     alloc.stats.hit_rate, alloc.stats.evictions)


def _said(sim: SimEngine, which: Sequence[str], evicted: int) -> str:
    ev = sim.scheduler.events
    parts = [f"r{s.request_id} ({which[int(s.request_id)]}) joins, {s.num_cached_tokens} of its "
             f"{s.num_prompt_tokens} prompt tokens from the cache" for s in ev.admitted]
    parts += [f"r{s.request_id} preempted" for s in ev.preempted]
    parts += [f"{evicted} cached block{'s' if evicted != 1 else ''} evicted"] if evicted else []
    return "; ".join(parts) or "decoding"


def layout_tree(run: PrefixRun) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of every node: depth along x (block 0 on the left), leaves one row apart along y,
    a parent at the middle of its children."""
    children: dict[int, list[int]] = {}
    for k, p in enumerate(run.parent):
        children.setdefault(p, []).append(k)
    x = np.array([0.0] * len(run.keys))
    y = np.array([0.0] * len(run.keys))
    row = [0]

    def place(k: int, depth: int) -> float:
        x[k] = depth
        kids = children.get(k, [])
        if not kids:
            y[k] = row[0]
            row[0] += 1
        else:
            y[k] = float(np.mean([place(c, depth + 1) for c in kids]))
        return y[k]

    for k in children.get(-1, []):
        place(k, 0)
    return x, y


def headline(run: PrefixRun, t: int) -> str:
    in_use, cached, free = run.pool[t]
    return (f"step {t}: {run.said[t]}<br>pool of {run.num_blocks} blocks: {in_use} in use, "
            f"{cached} cached for reuse, {free} free")


def _sizes(run: PrefixRun, t: int) -> np.ndarray:
    return np.where(run.states[t] == IN_USE, 9 + 3 * np.minimum(run.holders[t], 4), 9).astype(np.int8)


def _bands(colors: Sequence[str]) -> list:
    """A colour scale that gives value k (of 0..n-1, with cmin -0.5 and cmax n - 0.5) colors[k]."""
    n = len(colors)
    return [[(k + d) / n, c] for k, c in enumerate(colors) for d in (0, 1)]


def _edges(run: PrefixRun, x: np.ndarray, y: np.ndarray) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    return [((x[p], y[p]), (x[k], y[k])) for k, p in enumerate(run.parent) if p >= 0]


# -- in Jupyter: matplotlib, one figure updated in place --------------------------------------

class LivePrefix:
    """The live explorer's figure: the tree (left), the pool's blocks by state (right)."""

    def __init__(self, requests: Any = None):
        self.requests = requests or workload()
        self.live = LiveFigure(8, 4.4)
        self.ax, self.right = self.live.fig.subplots(1, 2, width_ratios=(1.6, 1))
        self.live.fig.subplots_adjust(left=0.03, right=0.98, top=0.82, bottom=0.12, wspace=0.12)  # no tight_layout
        self.edges = self.live.move(self.ax.add_collection(LineCollection([], colors="#cccccc", linewidths=1)))
        self.nodes = self.live.move(self.ax.scatter([], [], s=[], zorder=3))
        self.ax.set_xlabel("block of the prompt (0 = first)")
        self.ax.set_yticks([])
        self.labels = [self.live.move(self.ax.text(0, 0, "", ha="right", va="center", fontsize=9)) for _ in SYSTEMS]
        self.bands: list = []
        self.cursor = self.live.move(self.right.axvline(0, color="k", lw=0.8, ls=":"))
        self.right.set_xlabel("step")
        self.right.set_title("the pool: in use (blue), cached (light),\nfree (grey)", loc="left",
                             fontsize=9)  # (no legend: less text)
        self.shown = None

    def _draw_run(self, run: PrefixRun) -> None:
        x, y = layout_tree(run)
        self.xy = np.column_stack([x, y])
        self.edges.set_segments(_edges(run, x, y))
        self.ax.set_xlim(-1.2, x.max() + 0.6)
        self.ax.set_xticks(range(int(x.max()) + 1))
        self.ax.set_ylim(y.max() + 0.8, -0.8)
        for label, s in zip(self.labels, SYSTEMS):
            first = [k for k, p in enumerate(run.parent) if p < 0 and run.system[k] == s]
            label.set_position((-0.35, y[first[0]]) if first else (0, 0))
            label.set_text(f"system {s}" if first else "")
        for band in self.bands:  # the previous pool size's
            band.remove()
        steps = np.arange(len(run.pool))
        self.bands = self.right.stackplot(steps, run.pool.T, colors=(TAB10[0], "#9ecae1", "#eeeeee"), step="post")
        self.right.set_xlim(0, len(run.pool))
        self.right.set_ylim(0, run.num_blocks)

    def __call__(self, num_blocks: int, step: int) -> bytes:
        run = run_prefix(num_blocks, self.requests)  # the engine with prefix caching, at every move
        if self.shown != num_blocks:
            self._draw_run(run)
            self.shown = num_blocks
        t = min(step, len(run.said) - 1)
        st = run.states[t]
        self.nodes.set_offsets(self.xy)
        self.nodes.set_sizes(_sizes(run, t).astype(float) ** 2 / 2)
        self.nodes.set_facecolors([STATE_COLORS[s] for s in st])
        self.nodes.set_edgecolors([EDGE_COLORS[s] for s in st])
        self.cursor.set_xdata([t, t])
        self.live.title.set_text(headline(run, t).replace("<br>", "\n"))
        return self.live.png(num_blocks)


def prefix_live(requests: Any = None, pools: Sequence[int] = (10, 12, 16, 20, 24, 32), steps: int = 60) -> Any:
    """A slider for the pool's size and one, with Play, for the step; each move reruns the engine."""
    knobs = [Knob("num_blocks", "KV pool (blocks of 4 tokens)", tuple(pools), start=16),
             Knob("step", "step", tuple(range(steps)), start=12, play=True)]
    return live_explorer(LivePrefix(requests), knobs, play_ms=500)


# -- on the site: plotly, every step of one run ------------------------------------------------

def prefix_site(num_blocks: int = 16, requests: Any = None, frames: int = 36) -> Explorer:
    """The site's figure: the steps of one run (a slider, and play)."""
    run = run_prefix(num_blocks, requests)
    x, y = layout_tree(run)
    end = len(run.said)
    ticks = tuple(sorted({round(i * (end - 1) / (frames - 1)) for i in range(frames)})) if end > frames else \
        tuple(range(end))
    ex, ey = [], []
    for (x0, y0), (x1, y1) in _edges(run, x, y):
        ex += [x0, x1, None]
        ey += [y0, y1, None]
    firsts = [k for k, p in enumerate(run.parent) if p < 0]
    fixed = [{"type": "scatter", "mode": "lines", "x": ex, "y": ey, "hoverinfo": "skip", "showlegend": False,
              "line": {"color": "#cccccc", "width": 1}},
             {"type": "scatter", "mode": "text", "x": [-0.35] * len(firsts), "y": [y[k] for k in firsts],
              "text": [f"system {run.system[k]}" for k in firsts], "textposition": "middle left",
              "hoverinfo": "skip", "showlegend": False}]
    steps = list(range(end))
    for band, (name, color) in enumerate((("in use", TAB10[0]), ("cached for reuse", "#9ecae1"),
                                          ("free", "#dddddd"))):
        fixed.append({"type": "scatter", "mode": "lines", "x": steps, "y": run.pool[:, band].astype(np.int16),
                      "stackgroup": "pool", "name": name, "xaxis": "x2", "yaxis": "y2", "hoverinfo": "skip",
                      "line": {"color": color, "width": 0.5, "shape": "hv"}, "fillcolor": color})

    def view(step: int) -> View:
        st = run.states[step]
        # states as numbers through a colour scale of four bands: a few bytes a view
        nodes = {"type": "scatter", "mode": "markers", "x": x, "y": y, "hoverinfo": "skip", "showlegend": False,
                 "marker": {"size": _sizes(run, step), "color": st, "cmin": -0.5, "cmax": 3.5,
                            "colorscale": _bands(STATE_COLORS),
                            "line": {"width": 2, "color": st, "cmin": -0.5, "cmax": 3.5,
                                     "colorscale": _bands(EDGE_COLORS)}}}
        cursor = {"type": "scatter", "mode": "lines", "x": [step, step], "y": [0, run.num_blocks], "xaxis": "x2",
                  "yaxis": "y2", "hoverinfo": "skip", "showlegend": False,
                  "line": {"color": "black", "width": 1, "dash": "dot"}}
        return View(fixed + [nodes, cursor], {"title": {"text": headline(run, step)}})

    layout = panels(1, 2, titles=("the cached blocks, as a tree", "the pool's blocks"), hspace=0.08)
    layout["xaxis"].update(domain=[0, 0.6], range=[-1.6, float(x.max()) + 0.6], title={"text": "block of the prompt"},
                           tickvals=list(range(int(x.max()) + 1)), showgrid=False)
    layout["yaxis"].update(range=[float(y.max()) + 0.8, -0.8], visible=False)
    layout["xaxis2"].update(domain=[0.68, 1], range=[0, end], title={"text": "step"})
    layout["yaxis2"].update(range=[0, run.num_blocks])
    # inside the pool's panel, top right (below the axes it would meet the slider)
    layout["legend"] = {"x": 1, "xanchor": "right", "y": 1, "yanchor": "top", "xref": "paper", "yref": "paper",
                        "orientation": "v", "bgcolor": "rgba(255,255,255,0.85)", "font": {"size": 11}}
    layout.update(title={"font": {"size": 13}}, margin={"t": 96})
    knob = Knob("step", "step", ticks, play=True)
    return explorer([knob], view, layout, height=430, play_ms=700)
