"""The cost of one decode step at batch 1, with and without CUDA graphs (issue 14, target 4: <= 3 ms
for a SmolLM2-135M shape on a modern GPU).

At batch 1 a small model is launch-bound: its step time is the CPU's time to issue a few hundred
kernels, not the GPU's time to run them. Each engine here holds one request and steps it; a step
is `LLMEngine.step()` whole (scheduling, input preparation, forward, sampling), timed after the
prefill and a few warm-up steps; the median over `steps` steps is reported. On a CPU only the
eager engine runs (CUDA graphs are for CUDA).
"""
from __future__ import annotations

import statistics
import time
from typing import Any


__all__ = ["decode_step_times", "decode_step_report", "TARGET_MS"]

TARGET_MS = 3.0
_WARMUP = 5


def _median_step_ms(model: Any, steps: int, prompt_len: int, enforce_eager: bool) -> tuple[float, list[int]]:
    """Median ms of `steps` decode steps of one request, and the batch sizes the engine captured."""
    from inflight.engine.llm_engine import LLMEngine
    from inflight.engine.sampling import SamplingParams

    max_len = prompt_len + steps + _WARMUP + 2
    engine = LLMEngine(model, block_size=16, num_blocks=-(-max_len // 16) + 1, max_batch_size=1,
                       max_model_len=max_len, enforce_eager=enforce_eager, stats_window=None)
    engine.add_request(list(range(1, prompt_len + 1)), SamplingParams(max_tokens=steps + _WARMUP + 1, ignore_eos=True))
    for _ in range(1 + _WARMUP):  # the prefill, then warm-up decodes
        engine.step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        engine.step()  # the runner synchronises the device after its forward: the step is done here
        times.append(time.perf_counter() - t)
    graphs = engine.runner.graphs
    return statistics.median(times) * 1e3, sorted(graphs.graphs) if graphs is not None else []


def decode_step_times(model: Any, steps: int = 50, prompt_len: int = 32) -> dict[str, Any]:
    """Batch-1 decode step time of the engine, eager and (on CUDA) replaying CUDA graphs."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    eager_ms, _ = _median_step_ms(model, steps, prompt_len, enforce_eager=True)
    out: dict[str, Any] = {"device": str(model.device), "dtype": str(model.dtype), "steps": steps,
                           "prompt_len": prompt_len, "eager_ms": eager_ms, "target_ms": TARGET_MS}
    if model.device.type != "cuda":
        out.update(graphs_ms=None, note="CUDA graphs are captured on CUDA only")
        return out
    graphs_ms, captured = _median_step_ms(model, steps, prompt_len, enforce_eager=False)
    out.update(graphs_ms=graphs_ms, captured_batch_sizes=captured, speedup=eager_ms / graphs_ms,
               met=bool(captured) and graphs_ms <= TARGET_MS)
    return out


def decode_step_report(res: dict[str, Any]) -> str:
    line = f"batch-1 decode step ({res['dtype']}, {res['device']}): eager {res['eager_ms']:.2f} ms"
    if res.get("graphs_ms") is None:
        return f"{line}; {res.get('note', 'no CUDA graphs')}"
    return (f"{line}, CUDA graphs {res['graphs_ms']:.2f} ms ({res['speedup']:.1f}x); target <= {res['target_ms']:g} ms: "
            f"{'met' if res['met'] else 'NOT met'}")
