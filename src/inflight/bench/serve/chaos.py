"""`python -m inflight.bench.serve.chaos`: the server under misbehaving clients.

Streamed requests arrive as a Poisson process; a share of the clients hang up at a random moment
(before their first token or mid-stream), a share send bad requests (malformed JSON, unknown
fields, wrong types, impossible lengths), and one client reads very slowly. Afterwards:

- no request hung: every client got its answer, its error or its hang-up within the timeout;
- no block leaked: the pool is whole (KV usage 0, nothing running or waiting) on /metrics;
- every stream that completed is token-for-token (as text) what the engine gives the same greedy
  request alone;
- memory stayed flat: the server's resident memory at the end against after the first tenth.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import inflight  # noqa: F401  (before torch: the OpenMP wait policy)
from inflight.bench.serve.loadgen import SampleRequest, arrival_times, random_requests
from inflight.bench.serve.client import send_request, stream_payload
from inflight.bench.serve.process import run_record, save_result, start_inflight

__all__ = ["main", "BAD_BODIES"]

BAD_BODIES = [b"{not json", b'{"prompt": "x", "max_tokens": NaN}', b'{"prompt": "x", "frobnicate": 1}',
              b'{"prompt": "x", "max_tokens": "4"}', b'{"prompt": "x", "max_tokens": -1}',
              b'{"prompt": "x", "temperature": -2}', b'{"prompt": "x", "max_tokens": 100000}', b'[]']


async def _chaos(base: str, reqs: list[SampleRequest], args, rng: random.Random, rss) -> tuple[list, list]:
    import httpx

    url = base + "/v1/completions"
    times = arrival_times(len(reqs), args.request_rate, seed=args.seed)
    kinds = ["bad" if rng.random() < args.bad_share else "hangup" if rng.random() < args.hangup_share else "ok"
             for _ in reqs]
    kinds[len(reqs) // 3] = "slow"
    samples: list[tuple[float, int]] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout), limits=limits) as client:
        async def one(i: int, req: SampleRequest, start: float):
            await asyncio.sleep(max(0.0, start + times[i] - time.perf_counter()))
            kind = kinds[i]
            try:
                if kind == "bad":
                    r = await client.post(url, content=rng.choice(BAD_BODIES), headers={"Content-Type": "application/json"})
                    return kind, r.status_code, None
                payload = stream_payload("inflight-tiny", req.prompt, req.output_len)
                hang = rng.randint(0, req.output_len - 1) if kind == "hangup" else None
                res = await asyncio.wait_for(send_request(client, url, payload, hang_up_after_chunks=hang,
                                                          read_delay_s=0.2 if kind == "slow" else 0.0), args.timeout)
                return kind, res.status, res
            except (asyncio.TimeoutError, httpx.TimeoutException):
                return kind, "hung", None

        async def sample_memory():
            while True:
                samples.append((time.perf_counter(), rss()))
                await asyncio.sleep(1.0)

        sampler = asyncio.ensure_future(sample_memory())
        start = time.perf_counter()
        results = await asyncio.gather(*(one(i, r, start) for i, r in enumerate(reqs)))
        sampler.cancel()
    return results, samples


def _references(reqs: list[SampleRequest]) -> list[str]:
    """The text each greedy request gives run alone through the engine (one at a time)."""
    from inflight import LLMEngine, SamplingParams, load_tiny

    model, tok = load_tiny()
    engine = LLMEngine(model, tokenizer=tok, block_size=16)
    return [engine.generate([r.prompt], SamplingParams(max_tokens=r.output_len, ignore_eos=True), use_tqdm=False)[0].text
            for r in reqs]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inflight.bench.serve.chaos", description=__doc__.splitlines()[0])
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--request-rate", type=float, default=15.0)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=48)
    p.add_argument("--hangup-share", type=float, default=0.2)
    p.add_argument("--bad-share", type=float, default=0.05)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--quick", action="store_true", help="a smoke run: 40 requests")
    args = p.parse_args(argv)
    if args.quick:
        args.num_prompts, args.output_len = 40, 16
    from inflight.threads import LoadWatch

    reqs = random_requests(args.num_prompts, args.input_len, args.output_len, range_ratio=0.5, seed=args.seed)
    rng = random.Random(args.seed)
    srv = start_inflight([])
    try:
        with LoadWatch() as watch:
            results, memory = asyncio.run(_chaos(srv.base_url, reqs, args, rng, srv.rss_bytes))
        metrics = _metrics(srv.base_url)
    finally:
        code = srv.stop()
    refs = _references(reqs)
    report = _judge(results, reqs, refs, metrics, memory)
    report.update({**run_record("inflight.bench.serve.chaos", argv, watch),
                   "settings": vars(args) | {"output": str(args.output)}, "server_exit_code": code})
    print(json.dumps({k: v for k, v in report.items() if k not in ("load", "memory_mib")}, indent=1))
    save_result(report, args.output)
    return 0 if report["passed"] else 1


def _metrics(base: str) -> dict:
    import httpx

    text = httpx.get(base + "/metrics", timeout=60).text
    want = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")
    return {w: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() for w in want
            if line.startswith(f"inflight:{w}{{")}


def _judge(results: list, reqs: list, refs: list[str], metrics: dict, memory: list) -> dict:
    counts = {k: sum(r[0] == k for r in results) for k in ("ok", "hangup", "bad", "slow")}
    hung = [i for i, r in enumerate(results) if r[1] == "hung"]
    bad_ok = sum(r[0] == "bad" and r[1] == 400 for r in results)
    complete = [(i, r[2]) for i, r in enumerate(results) if r[0] in ("ok", "slow") and r[2] is not None]
    wrong = [i for i, res in complete if not res.success or res.generated_text != refs[i]]
    rss = [m for _, m in memory]
    tenth = rss[max(1, len(rss) // 10)] if len(rss) > 1 else (rss[0] if rss else 0)
    growth = (rss[-1] - tenth) / tenth if rss and tenth else 0.0
    report = {"requests": len(results), "kinds": counts, "hung": len(hung), "bad_refused_with_400": bad_ok,
              "completed_streams": len(complete), "completed_streams_differing_from_alone": len(wrong),
              "pool_at_end": metrics, "rss_mib_after_first_tenth": tenth / 2**20, "rss_mib_at_end": (rss[-1] if rss else 0) / 2**20,
              "rss_growth": growth, "memory_mib": [m / 2**20 for m in rss]}
    report["passed"] = (not hung and not wrong and bad_ok == counts["bad"] and metrics.get("kv_cache_usage_perc") == 0
                        and metrics.get("num_requests_running") == 0 and metrics.get("num_requests_waiting") == 0
                        and growth < 0.05)
    return report


if __name__ == "__main__":
    sys.exit(main())
