"""Where one engine run's time goes, by what the work is: linear layers, attention (decode-only
steps apart from steps that carry prompt tokens), the small fused operations, sampling, Python.

A profiler table lists operators; the question a reader (and whoever optimises the engine) asks is
coarser and per concept: "of this run's 3.2 s, how much was the matmuls, how much attention over
prompts, how much the interpreter?". `TimeSplit` answers it by timing, for the length of one run,
the model's own seams — the three functions every layer goes through (`llama._linear` for each
projection and the LM head, the attention backend, the fused norm / rotary + KV write / SwiGLU
kernels of `fused_ops`), or, where a step's layers run in one C call (`inflight.model.layer_driver`),
that call's clocks around the same kernels — and reads the engine's own per-step clock (`StepStats`) for scheduling,
input preparation and sampling. What no seam covers is Python: between operators inside the
forward pass (embedding, rotary tables, indexing) and around the engine (the driver loop).

A timer costs well under a microsecond per call against calls of tens of microseconds or more;
the run's wall time with the timers on is recorded beside the split, so the cost is visible.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Callable

__all__ = ["TimeSplit", "CATEGORIES", "split_of_run"]

#: the categories a split reports, in the order a table shows them
CATEGORIES = ("linear layers", "attention, decode-only steps", "attention, steps with prompt tokens",
              "norms, rotary + KV write, SwiGLU", "rest of the forward pass", "sampling and bookkeeping",
              "scheduling", "input preparation", "outside the engine")


class TimeSplit:
    """`with TimeSplit(model) as ts: <one engine run>` — `ts.seconds` per seam, `ts.calls` per seam.

    Patches the seams for the duration of the block (module functions and the backend's
    `__call__`), and puts every one back on exit, also when the run raises."""

    def __init__(self, model: Any):
        self.model = model
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._undo: list[Callable[[], None]] = []

    def _wrap(self, owner: Any, attr: str, name: Callable[..., str] | str) -> None:
        orig = getattr(owner, attr)
        seconds, calls, clock = self.seconds, self.calls, time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            key = name if isinstance(name, str) else name(*args, **kwargs)
            t0 = clock()
            try:
                return orig(*args, **kwargs)
            finally:
                seconds[key] += clock() - t0
                calls[key] += 1

        setattr(owner, attr, timed)
        self._undo.append(lambda: setattr(owner, attr, orig))

    def __enter__(self) -> "TimeSplit":
        from inflight.model import attention, fused_ops, layer_driver, llama

        def attention_kind(backend: Any, q: Any, k_cache: Any, v_cache: Any, meta: Any, scale: float) -> str:
            return "attention, decode-only steps" if meta.is_decode else "attention, steps with prompt tokens"

        try:
            self._wrap(llama, "_linear", "linear layers")
            self._wrap(attention.AttentionBackend, "__call__", attention_kind)
            for fn in ("rms_norm", "rotary_and_cache", "silu_and_mul"):
                self._wrap(fused_ops, fn, "norms, rotary + KV write, SwiGLU")
            self._wrap(type(self.model), "forward", "forward pass")
            # a step whose layers run in one C call (`layer_driver`) passes none of the seams above
            # but the LM head's: the driver's own clocks around each kernel give its parts instead
            self._undo.append(layer_driver.clock_into(self.seconds, self.calls))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        while self._undo:
            self._undo.pop()()


def split_of_run(ts: TimeSplit, step_stats: list[Any], wall_s: float) -> dict[str, Any]:
    """The run's wall time by category (`CATEGORIES`): the seams' seconds, the engine's step clock
    (`StepStats`: schedule / prepare / sample) and what is left of the forward pass and of the run."""
    s = ts.seconds
    inside = {k: s.get(k, 0.0) for k in CATEGORIES[:4]}
    forward = sum(st.forward_time for st in step_stats)  # the engine's clock around the model call
    out = dict(inside)
    # embedding, rotary tables, indexing, the Python between operators, and the runner around the call
    out["rest of the forward pass"] = max(0.0, forward - sum(inside.values()))
    out["sampling and bookkeeping"] = sum(st.sample_time for st in step_stats)
    out["scheduling"] = sum(st.schedule_time for st in step_stats)
    out["input preparation"] = sum(st.prepare_time for st in step_stats)
    engine = sum(st.step_time for st in step_stats)
    out["outside the engine"] = max(0.0, wall_s - engine)
    return {"wall_s": wall_s, "seconds": out, "shares": {k: v / wall_s for k, v in out.items()} if wall_s else {},
            "calls": dict(ts.calls), "engine_forward_s": forward, "model_forward_s": s.get("forward pass", 0.0)}
