"""`python -m inflight.bench.offline.speculative`: when speculative decoding pays, measured on our engine.

The shipped tiny model completes function signatures greedily (the same tokens with and without
speculation: every process's tokens are checked against the plain engine's, and a run whose tokens
differ gets no figure), at batch sizes 1, 8, 32 and 64, plain and with each method — prompt lookup
(`ngram`) and the shipped draft model (`draft`) — at k = 2 and 4 proposals per step. Each run is a
fresh process (`inflight.bench.protocol.fair`: taking turns, round after round, median and range
of every ratio to the plain engine in the same round). Reported per run: output tokens per second,
speed-up over plain, acceptance rate, tokens per verifying step, and the engine steps taken.

    python -m inflight.bench.offline.speculative            # full grid, saves results/spec_decode_cpu.json
    python -m inflight.bench.offline.speculative --quick    # a smoke run (seconds)
    python -m inflight.bench.offline.speculative --one draft --k 4 --batch 8   # one measurement, printed

On a CPU a decode step of the tiny model is not memory-bound (its 12 MB of weights sit in cache),
so checking k + 1 tokens costs nearly k + 1 times one: expect speed-ups near 1 or below; on a GPU,
where a small batch's step costs the same for 1 or 5 tokens per request, the tokens per step are
the speed-up (chapter 12 derives both).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Sequence

__all__ = ["PROMPTS", "spec_config", "run_once", "collect", "report", "main"]

#: the prompts, cycled to the batch size: function signatures, as the tiny model was trained on
PROMPTS = ["def fibonacci(n):\n", "def is_prime(n):\n", "def read_lines(path):\n", "class Stack:\n    def push(self, item):\n",
           "def parse_args(argv=None):\n", "def __repr__(self):\n", "def get(self, key, default=None):\n",
           "def _check_name(name):\n", "def close(self):\n", "def split_words(text):\n", "def __init__(self, path, mode='r'):\n",
           "def encode(self, value):\n", "def flatten(items):\n", "def run(self, timeout=None):\n",
           "def join_paths(*parts):\n", "def to_bytes(s, encoding='utf-8'):\n"]
METHODS = ("plain", "ngram", "draft")


def spec_config(method: str, k: int) -> dict | None:
    """The `speculative_config` a method name stands for (None for plain decoding)."""
    if method == "plain":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    if method == "draft":
        return {"method": "draft_model", "model": "inflight-tiny-draft", "num_speculative_tokens": k}
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def run_once(model: Any, tokenizer: Any, method: str, k: int, batch: int, max_tokens: int = 96,
             warmup: bool = True) -> dict[str, Any]:
    """One engine, `batch` greedy requests of `max_tokens` tokens each (all at once): tokens per
    second of the whole run, the tokens, the speculation counters, the steps and their mean time."""
    from inflight import LLMEngine, SamplingParams

    engine = LLMEngine(model, tokenizer=tokenizer, max_batch_size=max(batch, 1), speculative_config=spec_config(method, k))
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
    if warmup:  # (first-use costs: the C kernels' load, the allocator's first blocks)
        engine.generate(prompts[:1], SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    steps0 = len(engine.stats)
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    steps = list(engine.stats)[steps0:]
    n = sum(len(o.token_ids) for o in outs)
    st = engine.spec_decode_stats()
    return {"value": n / wall, "tokens": {str(i): o.token_ids for i, o in enumerate(outs)}, "wall_s": wall,
            "output_tokens": n, "steps": len(steps), "mean_step_s": sum(s.forward_time for s in steps) / max(len(steps), 1),
            "acceptance_rate": st.get("spec_acceptance_rate"), "mean_accepted_length": st.get("spec_mean_accepted_length"),
            "accepted_per_pos": st.get("spec_accepted_per_pos"), "proposed_per_pos": st.get("spec_proposed_per_pos"),
            "method": method, "k": k if method != "plain" else 0, "batch": batch, "max_tokens": max_tokens}


def _one(a: argparse.Namespace) -> int:
    import inflight

    model, tok = inflight.load_tiny(device=a.device)
    res = run_once(model, tok, a.one, a.k, a.batch, a.max_tokens)
    out = os.environ.get("INFLIGHT_RESULT")
    if out:
        Path(out).write_text(json.dumps(res))
    else:
        print(json.dumps({k: v for k, v in res.items() if k != "tokens"}, indent=1))
    return 0


def _contender(method: str, k: int, batch: int, max_tokens: int, device: str = "cpu"):
    from inflight.bench.protocol import fair

    name = "plain" if method == "plain" else f"{method} k={k}"
    return fair.Contender(name, ("{python}", "-m", "inflight.bench.offline.speculative", "--one", method, "--k", str(k),
                                 "--batch", str(batch), "--max-tokens", str(max_tokens), "--device", device))


def collect(batches: Sequence[int] = (1, 8, 32, 64), ks: Sequence[int] = (2, 4), rounds: int = 3, max_tokens: int = 96,
            log=print, device: str = "cpu") -> dict[str, Any]:
    """The fair protocol once per batch size: plain and every (method, k), `rounds` rounds each."""
    import tempfile

    from inflight.bench.protocol import fair

    load_start = list(os.getloadavg())
    out: dict[str, Any] = {"batches": {}}
    for b in batches:
        plain = _contender("plain", 0, b, max_tokens, device)
        with tempfile.TemporaryDirectory() as tmp:
            first = fair.run_process(plain, plain.settings[0])
            ref = fair.TokenReference.save(Path(tmp) / "ref.json", first["tokens"], "the plain engine, greedy")
            cs = [plain] + [_contender(m, k, b, max_tokens, device) for m in ("ngram", "draft") for k in ks]
            res = fair.compare(cs, rounds=rounds, search_rounds=0, pairs=[(c.name, "plain") for c in cs[1:]], ref=ref,
                               log=lambda s, b=b: log(f"batch {b}: {s}"))
        res.pop("reference", None)
        out["batches"][str(b)] = res
    out.update(machine={"platform": platform.platform(), "cpu_count": os.cpu_count(), "loadavg_start": load_start,
                        "loadavg_end": list(os.getloadavg())},
               python=sys.version.split()[0], max_tokens=max_tokens, ks=list(ks), rounds=rounds, device=device)
    return out


def report(res: dict[str, Any]) -> str:
    lines = [f"{'batch':>5} {'run':<10} {'tok/s':>8} {'speed-up (range)':>22} {'accept':>7} {'tok/step':>8} {'steps':>6}"]
    for b, r in res["batches"].items():
        s = r["summary"]
        for name, c in s["contenders"].items():
            row = next(row[name] for row in r["rounds"] if row[name]["value"] is not None) if c["median"] else {}
            ratio = s["ratios"].get(f"{name}/plain")
            sp = f"{ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})" if ratio and ratio.get("median") else "1"
            acc = row.get("acceptance_rate")
            mal = row.get("mean_accepted_length")
            lines.append(f"{b:>5} {name:<10} {c['median'] or 0:8.0f} {sp:>22} "
                         f"{'' if acc is None else f'{acc:.2f}':>7} {'' if mal is None else f'{mal:.2f}':>8} {row.get('steps', ''):>6}")
    lines.append(f"all tokens identical to the plain engine's: "
                 f"{all(r['all_tokens_identical'] for r in res['batches'].values())}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inflight.bench.offline.speculative", description=__doc__.split("\n\n")[0])
    p.add_argument("--one", choices=METHODS, help="one measurement in this process (the contender command)")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--ks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--device", default="cpu", help="cpu or cuda (the tiny model and its draft on it)")
    p.add_argument("--quick", action="store_true", help="batches 1 and 8, k = 4, one round, 24 tokens")
    p.add_argument("--output", default="results/spec_decode_cpu.json")
    a = p.parse_args(argv)
    if a.one:
        return _one(a)
    if a.quick:
        a.batches, a.ks, a.rounds, a.max_tokens = [1, 8], [4], 1, 24
    res = collect(a.batches, a.ks, a.rounds, a.max_tokens, device=a.device)
    res["command"] = "python -m inflight.bench.offline.speculative " + " ".join(sys.argv[1:] if argv is None else argv)
    print(report(res))
    Path(a.output).parent.mkdir(parents=True, exist_ok=True)
    Path(a.output).write_text(json.dumps(res, indent=1) + "\n")
    print(f"saved {a.output}")
    return 0 if all(r["all_tokens_identical"] for r in res["batches"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
