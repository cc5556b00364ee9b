"""How far a run is from the fastest its own work allows: lower bounds on its time, measured here.

Two parts of every forward pass have a floor this machine can measure:

- the **linear layers**: each step's tokens through every `nn.Linear` of the model, timed alone at
  that many rows (`profiling.measure_linear_layers`, on a grid of row counts, interpolated) -- but
  the LM head at one row per sequence in the step, where the run recorded them: the engine computes
  logits only for the rows it samples from, and a floor that charged the head for every prompt token
  would sit above the engine's own time;
- the **KV cache**: each step reads the keys and values of the requests it carries, at best as
  fast as memory copies (`profiling.measure_memory_bandwidth`);
- the **prefill attention's arithmetic**: every prompt token's query against every key before it
  (q·k and the probabilities times v: 4 · heads · head size FLOPs per pair, per layer) at the rate
  this machine multiplies matrices (`profiling.measure_matmul_flops`: the faster of torch's GEMM and
  the package's own on an n×n product). Decode attention is already
  bound by its KV read; on a prompt-heavy workload this is the term that grows with the square of
  the prompt, and a floor without it flatters nothing but says little.

What the run spent beyond those — attention's indexing and softmax, norms, rotary,
activations, sampling, Python — is what a better engine could still win back. The useful tokens
divided by the linear floor alone is the fastest this model can serve this workload here even if
everything else cost nothing; divided by a peer's speed, it is the largest ratio *any* engine could
show against that peer on this machine. A target above that bound is out of reach, not unmet.
"""
from __future__ import annotations

import bisect
from typing import Any, Callable, Sequence

import torch

from inflight.bench.profiling import measure_linear_layers

__all__ = ["row_grid", "linear_seconds", "prefill_attention_flops", "time_floor", "ratio_bounds"]


def row_grid(rows: Sequence[int], points: int = 8) -> list[int]:
    """At most `points` row counts, geometrically spaced from the smallest to the largest in `rows`
    (both included): where the linear layers are timed."""
    lo, hi = min(rows), max(rows)
    if lo < 1:
        raise ValueError(f"row counts must be >= 1, got {lo}")
    if points < 2 or lo == hi:
        return sorted({lo, hi})
    grid = {round(lo * (hi / lo) ** (i / (points - 1))) for i in range(points)}
    return sorted(grid | {lo, hi})


def linear_seconds(model: torch.nn.Module, step_rows: Sequence[int], points: int = 8,
                   min_seconds: float = 0.05, head_rows: Sequence[int] | None = None) -> tuple[float, dict[int, float]]:
    """Seconds the model's linear layers alone need for a run whose forward passes carried
    `step_rows` tokens each: each step's time interpolated (piecewise linearly in rows) between the
    measured grid points. Returns the total and the measured {rows: seconds} grid.

    With `head_rows` (one count per step, beside `step_rows`), the LM head is timed apart at those
    rows: an engine runs it only on the rows it samples from, one per sequence at most (a prompt
    chunk that does not end its prompt samples nothing), not on every token of a prefill chunk. The
    grid returned is then the other layers'; the head's own total is in the first figure."""
    lm_head = getattr(model, "lm_head", None)
    if head_rows is None or not isinstance(lm_head, torch.nn.Linear):
        return _interpolated(lambda r: measure_linear_layers(model, r, repeats=5, min_seconds=min_seconds),
                             step_rows, points)
    if len(head_rows) != len(step_rows):
        raise ValueError(f"head_rows has {len(head_rows)} steps, step_rows {len(step_rows)}")
    body = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not lm_head]
    total, grid = _interpolated(lambda r: measure_linear_layers(model, r, repeats=5, min_seconds=min_seconds,
                                                                layers=body), step_rows, points)
    head, _ = _interpolated(lambda r: measure_linear_layers(model, r, repeats=5, min_seconds=min_seconds,
                                                            layers=[lm_head]), head_rows, points)
    return total + head, grid


def _interpolated(measure: Callable[[int], float], step_rows: Sequence[int], points: int
                  ) -> tuple[float, dict[int, float]]:
    rows = [int(r) for r in step_rows if r > 0]
    if not rows:
        return 0.0, {}
    grid = row_grid(rows, points)
    measured = {r: measure(r) for r in grid}
    xs = sorted(measured)
    total = 0.0
    for r in rows:
        i = bisect.bisect_left(xs, r)
        if xs[i] == r:
            total += measured[r]
            continue
        a, b = xs[i - 1], xs[i]  # r lies strictly between two grid points
        total += measured[a] + (measured[b] - measured[a]) * (r - a) / (b - a)
    return total, measured


def prefill_attention_flops(config: Any, prompt_lens: Sequence[int]) -> float:
    """FLOPs of causal attention over these prompts, each computed once: a prompt of P tokens has
    P(P+1)/2 (query, key) pairs; each costs 2·D for q·k and 2·D for adding its share of v, per
    query head, per layer."""
    pairs = sum(p * (p + 1) // 2 for p in prompt_lens)
    return 4.0 * config.num_attention_heads * config.head_dim * config.num_hidden_layers * pairs


def time_floor(model: torch.nn.Module, run: dict[str, Any], bandwidth: float, kv_bytes_per_token: int,
               points: int = 8, min_seconds: float = 0.05, prompt_lens: Sequence[int] = (),
               matmul_flops: float | None = None) -> dict[str, Any]:
    """The lower bounds of one engine run (a mode summary with `work_per_step`) and how its wall
    time splits against them; `bandwidth` in bytes/s (the measured copy rate); `prompt_lens` and
    `matmul_flops` (FLOP/s) add the prefill attention's arithmetic."""
    work = run.get("work_per_step") or {}
    tokens, kv_tokens = work.get("tokens") or [], work.get("kv_tokens") or []
    wall = run.get("wall_s")
    if not tokens or not wall:
        raise ValueError("the run has no per-step work recorded (only engine modes record it)")
    # (`sequences`, where recorded: each step's sequences, the most rows its LM head can have run on)
    lin_s, grid = linear_seconds(model, tokens, points, min_seconds, head_rows=work.get("sequences"))
    kv_bytes = sum(kv_tokens) * kv_bytes_per_token
    kv_s = kv_bytes / bandwidth
    flops = prefill_attention_flops(model.config, prompt_lens) if prompt_lens else 0.0
    pre_s = flops / matmul_flops if flops and matmul_flops else 0.0
    floor_s = lin_s + kv_s + pre_s
    useful = run["useful_tokens"]
    return {"wall_s": wall, "steps": len(tokens), "forward_tokens": sum(tokens),
            "linear_layers_s": lin_s, "kv_read_s": kv_s, "kv_read_bytes": kv_bytes,
            "prefill_attention_s": pre_s, "prefill_attention_flops": flops, "matmul_flops_per_s": matmul_flops,
            "floor_s": floor_s, "rest_s": max(0.0, wall - floor_s),
            "linear_share": lin_s / wall, "kv_share": kv_s / wall, "prefill_attention_share": pre_s / wall,
            "rest_share": max(0.0, 1 - floor_s / wall),
            # the fastest this workload can be served here: only the linear layers cost anything; the
            # linear layers plus one read of the KV cache per step; and those plus the prompts' attention
            "max_tokens_per_s_linear_only": useful / lin_s if lin_s else None,
            "max_tokens_per_s_linear_and_kv": useful / (lin_s + kv_s) if lin_s + kv_s else None,
            "max_tokens_per_s_floor": useful / floor_s if floor_s else None,
            "linear_grid_ms": {str(r): s * 1e3 for r, s in grid.items()}}


def ratio_bounds(floor: dict[str, Any], peers: dict[str, float | None]) -> dict[str, dict[str, float]]:
    """The largest ratio over each peer (its tokens/s) that any engine could reach on this machine:
    the floor's maximum speed over the peer's measured speed."""
    out = {}
    for name, tps in peers.items():
        if tps:
            out[name] = {"linear_only": floor["max_tokens_per_s_linear_only"] / tps,
                         "linear_and_kv": floor["max_tokens_per_s_linear_and_kv"] / tps}
            if floor.get("max_tokens_per_s_floor"):
                out[name]["floor"] = floor["max_tokens_per_s_floor"] / tps
    return out
