"""`python -m inflight.bench.offline.tp`: the same requests at TP = 1 and TP = 2, step by step.

Both sides run the same way — the driver process with the scheduler and sampler, the model in
worker processes (`inflight.engine.executor.MultiprocExecutor`, N = 1 or 2, gloo on a CPU, one
GPU each on CUDA), each worker given `cores // N` threads — so the only difference is the split.
Each decode step's time is split in three, as the workers report it: compute (a worker's step
time less its time inside all-reduces), all-reduce (the time inside `torch.distributed.all_reduce`:
on a CPU, communication *and* waiting for the slower rank), and messaging (the driver's wait less
the workers' time: sending the step and the logits through the pipes). Sides alternate over
`--rounds`, each a fresh set of processes; medians and ranges are printed, and the tokens of the two
sides are checked to be identical. Chapter 10 runs one round of `measure` per side.
"""
from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["StepSplit", "measure", "main"]


@dataclass
class StepSplit:
    """Medians over a run's decode steps (milliseconds), and the run's tokens."""

    tp: int
    steps: int
    step_ms: float
    compute_ms: float
    all_reduce_ms: float
    messaging_ms: float
    all_reduces_per_step: int
    bytes_per_step: int
    num_blocks: int
    kv_bytes_per_block: int
    weight_bytes_per_rank: int
    tokens: list = field(default_factory=list, repr=False)
    workers: list = field(default_factory=list, repr=False)  # what each worker said when it started


def _median(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3 if xs else float("nan")


def measure(tp: int, path: str | Path | None = None, *, batch: int = 8, new_tokens: int = 32,
            device: str | None = None, timeout: float = 120.0) -> StepSplit:
    """Run `batch` requests of `new_tokens` greedy tokens each at TP = `tp` (after a warm-up) and
    split its decode steps' time (see the module docstring)."""
    from inflight.engine.executor import MultiprocExecutor
    from inflight.engine.llm_engine import LLMEngine
    from inflight.engine.sampling import SamplingParams
    from inflight.model.loading import TINY_PATH

    ex = MultiprocExecutor(TINY_PATH if path is None else path, tp, device=device, timeout=timeout)
    try:
        engine = LLMEngine(ex, max_batch_size=batch)
        prompts = [[(7 * i + 3 * j) % 200 + 1 for j in range(12 + i)] for i in range(batch)]
        engine.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)  # warm-up
        engine.runner.history.clear()
        outs = engine.generate(prompts, SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True),
                               use_tqdm=False)
        steps = [t for t in engine.runner.history if t.decode_only and t.num_tokens == batch]
        comm = [statistics.mean(t.comm_seconds) for t in steps]
        return StepSplit(tp, len(steps), _median([t.round_trip for t in steps]),
                         _median([t.seconds - c for t, c in zip(steps, comm)]), _median(comm),
                         _median([t.round_trip - t.seconds for t in steps]),
                         steps[0].all_reduces if steps else 0, steps[0].bytes_all_reduced if steps else 0,
                         engine.num_blocks, engine.kv_cache.bytes_per_block, ex.workers[0][1]["weight_bytes"],
                         [list(o.outputs[0].token_ids) for o in outs], [w[1] for w in ex.workers])
    finally:
        ex.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inflight.bench.offline.tp", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a checkpoint folder (default: the shipped tiny model)")
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--device", default=None)
    p.add_argument("--json", default=None, help="write every run here")
    args = p.parse_args(argv)
    from inflight.threads import machine_load

    load = machine_load()
    runs: dict[int, list[StepSplit]] = {tp: [] for tp in args.tp}
    for _ in range(args.rounds):
        for tp in args.tp:
            runs[tp].append(measure(tp, args.model, batch=args.batch, new_tokens=args.new_tokens, device=args.device))
    first = runs[args.tp[0]][0].tokens
    same = all(r.tokens == first for rs in runs.values() for r in rs)
    print(f"batch {args.batch}, {args.new_tokens} new tokens, {args.rounds} rounds; other programs' runnable "
          f"threads: {load.as_dict()}; tokens identical across TP sizes: {same}")
    print(f"{'TP':>3} {'step ms':>16} {'compute':>8} {'all-reduce':>10} {'messaging':>9} {'reduces':>7} "
          f"{'KV blocks':>9} {'weights/rank':>12}")
    for tp, rs in runs.items():
        med = {k: statistics.median(getattr(r, k) for r in rs) for k in ("step_ms", "compute_ms", "all_reduce_ms",
                                                                        "messaging_ms")}
        lo, hi = min(r.step_ms for r in rs), max(r.step_ms for r in rs)
        print(f"{tp:>3} {med['step_ms']:7.2f} [{lo:.2f}-{hi:.2f}] {med['compute_ms']:8.2f} "
              f"{med['all_reduce_ms']:10.2f} {med['messaging_ms']:9.2f} {rs[0].all_reduces_per_step:>7} "
              f"{rs[0].num_blocks:>9} {rs[0].weight_bytes_per_rank / 2**20:10.1f} MiB")
    if args.json:
        Path(args.json).write_text(json.dumps({"load": load.as_dict(), "args": vars(args), "tokens_identical": same,
                                               "runs": {tp: [asdict(r) | {"tokens": None, "workers": None} for r in rs]
                                                        for tp, rs in runs.items()}}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
