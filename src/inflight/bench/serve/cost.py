"""`python -m inflight.bench.serve.cost`: what the server costs over the engine alone, in one run.

The same requests (greedy, fixed output lengths) go, round after round, to the offline engine
(`LLMEngine.generate`, in a fresh process of its own each round: `inflight.bench.protocol.fair`) and over HTTP
with streaming to `python -m inflight.serve` in its own process — once with the engine loop on its
own thread (the default) and once as an asyncio task on the event loop (`--engine-loop task`); the
three take turns, the order rotating from round to round, and the report gives medians and ranges:

- saturation: every request at once; output tokens per second, the server's over the engine's;
- low load: one request at a time; median TTFT as the client sees it against the engine's own
  (arrival to first token inside the engine), the difference being what HTTP, the event loop and
  the hand-over to the engine loop add.

`--model-size HIDDEN,LAYERS` runs the same measurement on a Llama of random weights that size (with the
tiny model's tokenizer), both sides loading the same checkpoint: the server's cost is a fixed amount of
Python per streamed chunk, so what it weighs depends on what a token costs the model.

Both sides use the same engine settings and `inflight.threads`' thread policy; the load generator
(`inflight.bench.serve`) shares the cores with the server, as a client on the same machine does.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import inflight  # noqa: F401  (before torch: the OpenMP wait policy)
from inflight.bench.serve.loadgen import random_requests, run_benchmark
from inflight.bench.serve.process import run_record, save_result, start_inflight

__all__ = ["main", "offline_throughput", "offline_ttfts", "offline_measure", "turn_order"]


def _engine(model: Any, tok: Any, max_num_seqs: int):
    from inflight import LLMEngine

    return LLMEngine(model, tokenizer=tok, block_size=16, max_batch_size=max_num_seqs)


def offline_throughput(model: Any, tok: Any, reqs: list, max_num_seqs: int) -> float:
    """Output tokens per second of `generate` over every request at once."""
    from inflight import SamplingParams

    engine = _engine(model, tok, max_num_seqs)
    params = [SamplingParams(max_tokens=r.output_len, ignore_eos=True) for r in reqs]
    t0 = time.perf_counter()
    outs = engine.generate([r.prompt for r in reqs], params, use_tqdm=False)
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0)


def offline_ttfts(model: Any, tok: Any, reqs: list, max_num_seqs: int) -> list[float]:
    """The engine's own TTFT (arrival to first token) of each request run alone."""
    from inflight import SamplingParams

    engine = _engine(model, tok, max_num_seqs)
    return [engine.generate([r.prompt], SamplingParams(max_tokens=r.output_len, ignore_eos=True),
                            use_tqdm=False)[0].ttft for r in reqs]


def offline_measure(model: Any, tok: Any, sat: list, low: list, max_num_seqs: int) -> dict[str, float]:
    """The offline engine's two figures, after a warm-up (kernels built, caches warm): tokens/s with
    every request at once, median TTFT one at a time (ms)."""
    offline_throughput(model, tok, sat[:4], max_num_seqs)
    offline_ttfts(model, tok, low[:1], max_num_seqs)
    return {"value": offline_throughput(model, tok, sat, max_num_seqs),
            "ttft_ms": 1e3 * statistics.median(offline_ttfts(model, tok, low, max_num_seqs))}


def _offline_command(args) -> tuple[str, ...]:
    """This program with --offline and the same workload: one offline measurement in a fresh process."""
    cmd = ["{python}", "-m", "inflight.bench.serve.cost", "--offline", "--num-prompts", str(args.num_prompts),
           "--input-len", str(args.input_len), "--output-len", str(args.output_len), "--max-num-seqs",
           str(args.max_num_seqs), "--low-load-prompts", str(args.low_load_prompts)]
    return tuple(cmd + (["--quick"] if args.quick else []) + (["--model-size", args.model_size] if args.model_size else []))


def turn_order(names: list[str], turn: int) -> list[str]:
    """`names` rotated by `turn`: round after round each runs first in turn."""
    return names[turn % len(names):] + names[:turn % len(names)]


def _round(offline: Any, servers: dict, sat: list, low: list, turn: int) -> dict:
    """One round: the offline engine (a fresh process, `inflight.bench.protocol.fair`) and each server, in the
    order `turn_order` gives, so that none always runs right after the same one."""
    from inflight.bench.protocol import fair

    row: dict[str, Any] = {}
    for name in turn_order(["offline", *servers], turn):
        if name == "offline":
            res = fair.run_process(offline, offline.settings[0])
            row["offline_tok_s"], row["offline_ttft_ms"] = res["value"], res["ttft_ms"]
            continue
        r = run_benchmark(servers[name].base_url, sat, disable_tqdm=True)
        assert r["completed"] == len(sat), r["errors"][:3]
        lo = run_benchmark(servers[name].base_url, low, max_concurrency=1, disable_tqdm=True)
        row[f"{name}_tok_s"], row[f"{name}_ttft_ms"] = r["output_throughput"], lo["median_ttft_ms"]
    for mode in servers:
        row[f"{mode}_over_offline"] = row[f"{mode}_tok_s"] / row["offline_tok_s"]
        row[f"{mode}_ttft_extra_ms"] = row[f"{mode}_ttft_ms"] - row["offline_ttft_ms"]
    return row


def _rounds(offline: Any, servers: dict, sat: list, low: list, rounds: int) -> tuple[list[dict], Any]:
    """Warm the servers up (the offline process warms itself), then `rounds` rounds; the rows and the
    load watched over them."""
    from inflight.threads import LoadWatch

    for srv in servers.values():  # kernels built, caches warm
        run_benchmark(srv.base_url, sat[:4], disable_tqdm=True)
        run_benchmark(srv.base_url, low[:1], max_concurrency=1, disable_tqdm=True)
    rows = []
    with LoadWatch() as watch:
        for i in range(rounds):
            rows.append(_round(offline, servers, sat, low, i))
            print(f"round {i + 1}: " + ", ".join(f"{k} {v:.3g}" for k, v in rows[-1].items()), flush=True)
    return rows, watch


def _random_model(size: str):
    """(model, tokenizer, checkpoint folder) for --model-size HIDDEN,LAYERS, written once to a cache folder."""
    import tempfile

    from inflight.bench.serve.process import save_random_checkpoint
    from inflight.model.loading import load_pretrained

    try:
        hidden, layers = (int(x) for x in size.split(","))
    except ValueError:
        raise SystemExit(f"--model-size takes HIDDEN,LAYERS (two integers), got {size!r}") from None
    folder = Path(tempfile.gettempdir()) / f"inflight-random-{hidden}x{layers}"
    if not (folder / "model.safetensors").is_file():
        save_random_checkpoint(folder, hidden, layers)
    model, tok = load_pretrained(folder, device="cpu", with_tokenizer=True)
    return model, tok, folder


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inflight.bench.serve.cost", description=__doc__.splitlines()[0])
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--low-load-prompts", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--server-args", default="", help="more flags for both servers, e.g. '--stream-interval 4'")
    p.add_argument("--model-size", default=None, metavar="HIDDEN,LAYERS",
                   help="a random-weight Llama this wide and deep instead of the tiny model, e.g. 1024,16")
    p.add_argument("--output", type=Path, default=None, help="save the results JSON here")
    p.add_argument("--quick", action="store_true", help="a smoke run: 8 short requests, one round")
    p.add_argument("--offline", action="store_true",
                   help="only the offline engine, here, its figures written to $INFLIGHT_RESULT (each round starts one)")
    args = p.parse_args(argv)
    if args.quick:
        args.num_prompts, args.output_len, args.low_load_prompts, args.rounds = 8, 8, 2, 1
    from inflight import load_tiny
    from inflight.threads import configure_threads

    threads = configure_threads()
    flags = ["--max-num-seqs", str(args.max_num_seqs), *args.server_args.split()]
    if args.model_size:
        model, tok, folder = _random_model(args.model_size)
        flags += ["--model", str(folder)]
    else:
        model, tok = load_tiny()
    sat = random_requests(args.num_prompts, args.input_len, args.output_len, seed=0)
    low = random_requests(args.low_load_prompts, args.input_len, 32 if not args.quick else 4, seed=1)
    if args.offline:
        from inflight.bench.protocol.fair import RESULT_VAR

        Path(os.environ[RESULT_VAR]).write_text(json.dumps(offline_measure(model, tok, sat, low, args.max_num_seqs)))
        return 0
    from inflight.bench.protocol import fair

    offline = fair.Contender("offline engine", _offline_command(args))
    servers = {"thread": start_inflight(flags), "task": start_inflight(flags + ["--engine-loop", "task"])}
    try:
        rows, watch = _rounds(offline, servers, sat, low, args.rounds)
    finally:
        for s in servers.values():
            s.stop()
    summary = {k: {"median": statistics.median(r[k] for r in rows), "min": min(r[k] for r in rows),
                   "max": max(r[k] for r in rows)} for k in rows[0]}
    result = {**run_record("inflight.bench.serve.cost", argv, watch), "threads": threads.threads,
              "settings": vars(args) | {"output": str(args.output)},
              "model": {"name": getattr(model, "name_or_path", "tiny"), "parameters": sum(p.numel() for p in model.parameters())},
              "offline_command": " ".join(offline.command).replace("{python}", "python"),
              "orders": [turn_order(["offline", *servers], i) for i in range(args.rounds)],
              "rounds": rows, "summary": summary}
    for mode in servers:
        print(f"{mode} loop: {summary[f'{mode}_over_offline']['median']:.1%} of the offline engine's tokens/s "
              f"(range {summary[f'{mode}_over_offline']['min']:.1%}-{summary[f'{mode}_over_offline']['max']:.1%}); "
              f"median TTFT at low load {summary[f'{mode}_ttft_extra_ms']['median']:+.1f} ms over the engine's own")
    print(f"the offline engine: {1e3 / summary['offline_tok_s']['median']:.2f} ms per output token at saturation "
          f"({result['model']['parameters'] / 1e6:.1f}M parameters)")
    print(f"machine busy during the run: {watch.busy}")
    save_result(result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
