"""Chapter 12's explorer: proposals per step k and batch size → what speculative decoding buys.

One verifying step of B requests checks B·(k + 1) tokens in one forward pass of the target, and
yields on average E(α, k) = (1 − α^(k+1)) / (1 − α) tokens per request, α being the chance a
proposal is accepted. So over plain decoding (one token per request per step)

    speed-up(B, k) = E(α, k) · t(B, 1) / (t(B, k + 1) + draft(B, k)),

with t(B, q) the target's forward pass over B requests of q new tokens each, and draft(B, k) the
proposer's own work (the draft model's k passes; nothing for prompt lookup). The notebook measures
t and the draft's passes on the reader's device (`measure_costs`) and α per method from the engine
itself; on a GPU the same formula runs on the roofline of a datasheet (`roofline_costs`), where
t(B, k + 1) ≈ t(B, 1) until B·(k + 1) tokens reach the ridge. Left, E(α, k) for each method with
the chosen k marked; right, the predicted speed-up against the batch size, on this device and on
the GPU's roofline, the chosen batch marked.

`spec_live` redraws in Jupyter at every move; `spec_site` holds every view of the sliders."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from inflight.book.interactive import TAB10, Explorer, Knob, View, explorer, panels
from inflight.book.widgets import LiveFigure, live_explorer
from inflight.engine.spec_decode.metrics import expected_tokens_per_step

KS = (1, 2, 3, 4, 6, 8)
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
METHODS = (("ngram", "prompt lookup", TAB10[0]), ("draft", "draft model", TAB10[1]))


def pass_timer(model: Any, batch: int, q: int, context: int = 64) -> Callable[[], float]:
    """A function timing one pass of `model` over `batch` requests, each computing `q` new tokens
    after `context - q` cached ones (a decode is q = 1; a verify of k proposals, q = k + 1): the
    attention metadata built from the block tables, as every engine pass does, then the forward."""
    import torch

    from inflight.model.attention_metadata import AttentionMetadata
    from inflight.model.kv_cache import KVCache

    bs = 16
    per = -(-context // bs)
    param = next(model.parameters())
    cache = KVCache.for_model(model.config, batch * per, bs, dtype=param.dtype, device=param.device)
    tables = [list(range(i * per, (i + 1) * per)) for i in range(batch)]
    ids = torch.randint(1, model.config.vocab_size, (batch * q,), device=cache.device)
    rows = torch.arange(batch * q, device=cache.device)  # every row's logits: a verify samples them all

    @torch.inference_mode()
    def once() -> float:
        t0 = time.perf_counter()
        meta = AttentionMetadata.build([q] * batch, [context] * batch, tables, bs, cache.device)
        model(ids, meta.positions, meta, cache, logits_indices=rows)
        if cache.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    return once


def time_passes(timers: dict, reps: int = 5) -> dict:
    """Best of `reps` seconds for every timer, timed round-robin (a burst of load on a shared machine
    then hits every point alike, not one point's every repetition); one warm-up round first."""
    best = {key: float("inf") for key in timers}
    for r in range(reps + 1):
        for key, once in timers.items():
            t = once()
            if r:
                best[key] = min(best[key], t)
    return best


@dataclass
class Costs:
    """Seconds per forward pass: `target[(B, q)]` and `draft[(B, q)]` at the measured points;
    between them, linear in q (a pass's cost grows with its tokens), and a batch not measured is
    interpolated in log B. `overhead[B]`: the rest of an engine step (scheduling, inputs,
    sampling: Python), paid once per step whatever its tokens — on a CPU it matters as much as
    the weights' reads on a GPU."""

    target: dict
    draft: dict
    label: str
    overhead: dict | None = None

    @property
    def max_batch(self) -> int:
        """The largest batch measured: the predictions stop there."""
        return max(b for b, _ in self.target)

    def batches(self, batches: Sequence[int]) -> list[int]:
        return [b for b in batches if b <= self.max_batch]

    def _at(self, table: dict, batch: int, q: float) -> float:
        bs = sorted({b for b, _ in table})
        b = min(max(batch, bs[0]), bs[-1])
        lo = max(x for x in bs if x <= b)
        hi = min(x for x in bs if x >= b)
        def f(bb: int) -> float:
            pts = sorted((qq, t) for (b2, qq), t in table.items() if b2 == bb)
            return float(np.interp(q, [p[0] for p in pts], [p[1] for p in pts]))

        if lo == hi:
            return f(lo)
        w = (np.log(b) - np.log(lo)) / (np.log(hi) - np.log(lo))
        return float(np.exp((1 - w) * np.log(f(lo)) + w * np.log(f(hi))))

    def step(self, batch: int, q: int) -> float:
        extra = self._at({(b, 1): t for b, t in self.overhead.items()}, batch, 1) if self.overhead else 0.0
        return self._at(self.target, batch, q) + extra

    def proposer(self, method: str, batch: int, k: int) -> float:
        """The proposer's work per step: the draft's catch-up pass (about 2 new tokens) and k − 1 decodes."""
        if method == "ngram":
            return 0.0
        return self._at(self.draft, batch, 2) + (k - 1) * self._at(self.draft, batch, 1)

    def speedup(self, method: str, alpha: float, k: int, batch: int) -> float:
        return expected_tokens_per_step(alpha, k) * self.step(batch, 1) / (
            self.step(batch, k + 1) + self.proposer(method, batch, k))


def measure_costs(target: Any, draft: Any, batches: Sequence[int] = (1, 8, 32, 64), qs: Sequence[int] = (1, 2, 3, 5, 9),
                  context: int = 64, label: str = "this device", overhead: dict | None = None, reps: int = 5) -> Costs:
    """The target's passes at every (batch, q) and the draft's at q = 1 and 2, timed here (best of
    `reps`, round-robin), with the engine's per-step `overhead` {batch: seconds} if given. A pass
    over more tokens never costs less than one over fewer: where noise says otherwise, the larger q
    takes the smaller q's time (a running maximum over q)."""
    times = time_passes({("t", b, q): pass_timer(target, b, q, context) for b in batches for q in qs}
                        | {("d", b, q): pass_timer(draft, b, q, context) for b in batches for q in (1, 2)}, reps)
    tables: dict = {"t": {}, "d": {}}
    for b in batches:
        for which, qq in (("t", qs), ("d", (1, 2))):
            run = 0.0
            for q in sorted(qq):
                run = max(run, times[which, b, q])
                tables[which][b, q] = run
    return Costs(tables["t"], tables["d"], label, overhead)


def roofline_costs(params: float, draft_params: float, kv_per_token: float, draft_kv_per_token: float,
                   peak_flops: float, bandwidth: float, context: int, label: str, bytes_per_param: int = 2,
                   batches: Sequence[int] = BATCHES, qs: Sequence[int] = (1, 2, 3, 4, 5, 7, 9)) -> Costs:
    """The same tables from a datasheet's roofline (`inflight.sim.roofline`): a pass of B requests
    of q tokens reads the weights once and each request's KV once, and does 2·params FLOPs a token."""
    from inflight.sim.roofline import decode_step

    def t(p: float, kv: float, b: int, q: int) -> float:  # (batch B·q rows, each request's KV read once)
        return decode_step(p, p * bytes_per_param, kv, b * q, context / q, peak_flops, bandwidth).time_s

    return Costs({(b, q): t(params, kv_per_token, b, q) for b in batches for q in qs},
                 {(b, q): t(draft_params, draft_kv_per_token, b, q) for b in batches for q in (1, 2)}, label)


def headline(alphas: dict, k: int, batch: int, costs: Sequence[Costs]) -> str:
    """k and batch, then per method: tokens per step and the speed-up by each cost table (its label's first word)."""
    parts = [f"k = {k}, batch {batch}:"]
    for m, name, _ in METHODS:
        e = expected_tokens_per_step(alphas[m], k)
        here = ", ".join(f"×{c.speedup(m, alphas[m], k, batch):.2f} {c.label.split()[0]}" for c in costs
                         if batch <= c.max_batch)
        parts.append(f"{name} {e:.2f} tokens/step, {here};")
    return " ".join(parts).rstrip(";")


# -- in Jupyter: matplotlib, one figure updated in place --------------------------------------

class LiveSpec:
    def __init__(self, alphas: dict, costs: Sequence[Costs], ks: Sequence[int], batches: Sequence[int]):
        self.alphas, self.costs, self.batches = alphas, costs, batches
        self.live = LiveFigure(8.5, 3.9)
        move = self.live.move
        left, self.right = self.live.fig.subplots(1, 2)
        self.live.fig.subplots_adjust(left=0.08, right=0.98, top=0.8, bottom=0.14, wspace=0.3)
        kk = np.arange(1, max(ks) + 1)
        self.marks = {}
        for m, name, color in METHODS:
            left.plot(kk, [expected_tokens_per_step(alphas[m], int(k)) for k in kk], "-", color=color,
                      label=f"{name} (α = {alphas[m]:.2f})")
            self.marks[m] = move(left.plot([], [], "o", ms=9, color=color)[0])
        left.plot(kk, kk + 1, ":", color="0.6", label="every proposal accepted")
        left.set_xlabel("proposals per step k")
        left.set_ylabel("tokens per verifying step")
        left.legend(fontsize=8, loc="upper left")
        self.lines = {}
        for (m, name, color) in METHODS:
            for c, style in zip(costs, ("-", "--")):
                self.lines[m, c.label] = move(self.right.plot([], [], style, color=color, label=f"{name}, {c.label}")[0])
        self.dot = move(self.right.axvline(batches[0], color="0.5", lw=1))
        self.right.axhline(1, color="0.3", lw=0.8)
        self.right.set_xscale("log", base=2)
        self.right.set_xlim(min(batches), max(batches))
        top = max(c.speedup(m, alphas[m], k, b) for c in costs for m, _, _ in METHODS for k in ks for b in c.batches(batches))
        self.right.set_ylim(0, top * 1.08)
        self.right.set_xlabel("batch size")
        self.right.set_ylabel("speed-up over plain decoding")
        self.right.legend(fontsize=7, loc="upper right")

    def __call__(self, k: int, batch: int) -> bytes:
        for m, _, _ in METHODS:
            self.marks[m].set_data([k], [expected_tokens_per_step(self.alphas[m], k)])
            for c in self.costs:
                bb = c.batches(self.batches)
                self.lines[m, c.label].set_data(bb, [c.speedup(m, self.alphas[m], k, b) for b in bb])
        self.dot.set_xdata([batch, batch])
        self.live.title.set_text(headline(self.alphas, k, batch, self.costs).replace("; ", ";\n").replace(": ", ":\n", 1))
        return self.live.png()


def spec_live(alphas: dict, costs: Sequence[Costs], ks: Sequence[int] = KS, batches: Sequence[int] = BATCHES,
              start: tuple[int, int] = (4, 1)) -> Any:
    """Sliders for k and the batch size; each move recomputes the predictions from the measured costs."""
    figure = LiveSpec(alphas, costs, ks, batches)
    return live_explorer(figure, [Knob("k", "proposals per step k", tuple(ks), start=start[0]),
                                  Knob("batch", "batch size", tuple(batches), start=start[1])])


# -- on the site: plotly, one view per (k, batch) ---------------------------------------------

def spec_site(alphas: dict, costs: Sequence[Costs], ks: Sequence[int] = KS, batches: Sequence[int] = BATCHES,
              start: tuple[int, int] = (4, 1)) -> Explorer:
    layout = panels(1, 2, titles=("tokens per verifying step", "speed-up over plain decoding"), hspace=0.14)
    layout["xaxis"].update(title={"text": "proposals per step k"})
    layout["xaxis2"].update(title={"text": "batch size"}, type="log", dtick=np.log10(2))
    top = max(c.speedup(m, alphas[m], k, b) for c in costs for m, _, _ in METHODS for k in ks for b in c.batches(batches))
    layout["yaxis2"].update(range=[0, round(top * 1.08, 2)])
    layout.update(title={"font": {"size": 12}}, margin={"t": 100})
    kk = list(range(1, max(ks) + 1))
    curves = [{"type": "scatter", "mode": "lines", "x": kk, "y": [round(expected_tokens_per_step(alphas[m], k), 3)
                                                                  for k in kk],
               "name": f"{name}, α = {alphas[m]:.2f}", "line": {"color": color}, "hoverinfo": "skip"}
              for m, name, color in METHODS]
    one = {"type": "scatter", "mode": "lines", "x": [min(batches), max(batches)], "y": [1, 1], "xaxis": "x2",
           "yaxis": "y2", "line": {"color": "#444", "width": 1}, "showlegend": False, "hoverinfo": "skip"}
    # the right panel's line styles, named once in the legend (its lines keep the methods' colours)
    styles = [{"type": "scatter", "mode": "lines", "x": [None], "y": [None], "xaxis": "x2", "yaxis": "y2",
               "name": c.label, "line": {"color": "#666", "dash": dash}, "hoverinfo": "skip"}
              for c, dash in zip(costs, ("solid", "dash"))]

    def view(k: int, batch: int) -> View:
        data = list(curves) + [one] + styles
        for m, name, color in METHODS:
            data.append({"type": "scatter", "mode": "markers", "x": [k], "y": [round(expected_tokens_per_step(alphas[m], k), 3)],
                         "marker": {"size": 12, "color": color}, "showlegend": False, "hoverinfo": "skip"})
            for c, dash in zip(costs, ("solid", "dash")):
                bb = c.batches(batches)
                ys = [round(c.speedup(m, alphas[m], k, b), 3) for b in bb]
                data.append({"type": "scatter", "mode": "lines+markers", "x": bb, "y": ys, "xaxis": "x2",
                             "yaxis": "y2", "name": f"{name}, {c.label}", "line": {"color": color, "dash": dash},
                             "showlegend": False,
                             "marker": {"size": [11 if b == batch else 4 for b in bb]},
                             "hovertemplate": "batch %{x}: ×%{y}<extra></extra>"})
        return View(data, {"title": {"text": headline(alphas, k, batch, costs).replace("; ", ";<br>")
                                     .replace(": ", ":<br>", 1)}})

    knobs = [Knob("k", "proposals per step k", tuple(ks), start=start[0]),
             Knob("batch", "batch size", tuple(batches), start=start[1])]
    return explorer(knobs, view, layout, height=440)
