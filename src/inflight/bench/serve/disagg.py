"""`python -m inflight.bench.serve.disagg`: colocated against disaggregated serving, on the same cores,
under a mix of long prompts (prefill-heavy) and long generations (decode-heavy).

    python -m inflight.bench.serve.disagg --rates 1 2 4 --duration 15 --output results/disagg_cpu.json
    python -m inflight.bench.serve.disagg --quick

- colocated: two engines (`python -m inflight.serve.disagg colocated`), each doing prefill and decode,
  requests alternating between them;
- disaggregated: one prefill engine and one decode engine (`... prefill` / `... decode`), the KV of
  every prompt pushed from the first to the second over loopback TCP (`inflight.engine.kv_transfer`).

Both arrangements get the same processes, threads and request stream. Recorded per kind of request:
TTFT and inter-token latency (p50/p99), goodput at the SLO; for disaggregation, the KV bytes per
token and the transfer time (the prefill's reply to the KV's arrival at the decode side, both on
this machine's clock). The point (DistServe, Splitwise): in a colocated engine a long prompt's
prefill shares a step with every running decode, so their inter-token latency spikes; apart, the
decode engine never runs a prefill. A pure socket client and process starter: no engine code.
"""
from __future__ import annotations

import argparse
import random
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from inflight.bench.serve.process import stop_process
from inflight.serve.frames import recv_frame, send_frame

__all__ = ["Role", "start_role", "MixedRequest", "mixed_workload", "run_arrangement", "main"]

_WORDS = ("def", "return", "self", "if", "else", "for", "in", "import", "value", "name", "path", "items", "None",
          "True", "len", "list", "dict", "key", "data", "result", "args", "line", "open", "with", "as", "not")
BOS = 256  # the tiny model's end-of-text, which its tokenizer puts first


class Role:
    """One `python -m inflight.serve.disagg ROLE` process, ready; `stop()` ends it by its PID."""

    def __init__(self, role: str, args: list[str], log_dir: Path):
        from inflight.threads import environment_for_child

        self.log = Path(log_dir) / f"disagg-{role}-{time.monotonic_ns()}.log"
        self.proc = subprocess.Popen([sys.executable, "-m", "inflight.serve.disagg", role, "--port", "0", *args],
                                     stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                     env=environment_for_child(PYTHONUNBUFFERED="1"))
        deadline = time.monotonic() + 300
        while not (m := re.search(r"at (\S+):(\d+)", self.log.read_text())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{role} did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)
        self.addr = (m.group(1), int(m.group(2)))

    def stop(self) -> None:
        stop_process(self.proc, 30)


def start_role(role: str, args: list[str] = (), log_dir: Path | None = None) -> Role:
    return Role(role, list(args), Path(log_dir or "/tmp"))


@dataclass
class MixedRequest:
    kind: str                 # "long_prompt" or "long_output"
    prompt_token_ids: list[int]
    max_tokens: int
    at: float                 # seconds from the start


def mixed_workload(rate: float, duration: float, *, long_prompt: int = 384, long_prompt_output: int = 8,
                   short_prompt: int = 24, long_output: int = 96, share_long_prompt: float = 0.5,
                   seed: int = 0) -> list[MixedRequest]:
    """Poisson arrivals at `rate` per second for `duration` seconds; each request is either a long
    prompt with a short answer or a short prompt with a long answer."""
    rng = random.Random(seed)
    out, t = [], rng.expovariate(rate)
    while t < duration:
        lp = rng.random() < share_long_prompt
        n = long_prompt if lp else short_prompt
        text = " ".join(rng.choice(_WORDS) for _ in range(n)).encode()[:n - 1]
        out.append(MixedRequest("long_prompt" if lp else "long_output", [BOS, *text],
                                long_prompt_output if lp else long_output, t))
        t += rng.expovariate(rate)
    return out


@dataclass
class Seen:
    kind: str
    ok: bool = False
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    transfer_s: float | None = None
    kv_bytes: int | None = None
    prompt_len: int = 0
    tokens: list[int] = field(default_factory=list)
    error: str = ""


def _connect(addr) -> socket.socket:
    s = socket.create_connection(addr, timeout=300)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _stream(conn: socket.socket, seen: Seen, start: float, last: float) -> None:
    while True:
        head, _ = recv_frame(conn)
        if "error" in head:
            raise RuntimeError(head["error"])
        now = time.perf_counter()
        if head.get("tokens"):
            if not seen.tokens:
                seen.ttft = now - start
            else:
                seen.itl.append(now - last)
                seen.itl.extend([0.0] * (len(head["tokens"]) - 1))
            seen.tokens += head["tokens"]
            last = now
        if "kv_received" in head:
            seen.transfer_s, seen.kv_bytes = head["kv_received"], head["kv_bytes"]
        if head.get("finished"):
            seen.latency = now - start
            return


def _colocated(servers, i: int, req: MixedRequest, rid: str, seen: Seen) -> None:
    start = time.perf_counter()
    with _connect(servers[i % len(servers)]) as c:
        send_frame(c, {"op": "generate", "request_id": rid, "prompt_token_ids": req.prompt_token_ids,
                       "max_tokens": req.max_tokens})
        _stream(c, seen, start, start)


def _disaggregated(prefill, decode, req: MixedRequest, rid: str, seen: Seen) -> None:
    start = time.perf_counter()
    with _connect(decode) as d, _connect(prefill) as p:
        send_frame(d, {"op": "expect", "request_id": rid, "max_tokens": req.max_tokens})
        send_frame(p, {"op": "prefill", "request_id": rid, "prompt_token_ids": req.prompt_token_ids})
        head, _ = recv_frame(p)
        if "error" in head:
            raise RuntimeError(head["error"])
        now = time.perf_counter()
        seen.ttft, seen.tokens = now - start, [head["first_token"]]
        prefill_done = head["time"]
        _stream(d, seen, start, now)
        if seen.transfer_s is not None:
            seen.transfer_s -= prefill_done


def run_arrangement(arrangement: str, addrs: dict, reqs: list[MixedRequest], seed: int = 0) -> list[Seen]:
    """Send `reqs` at their times (a thread each) to a colocated pair (`addrs["servers"]`) or a
    prefill/decode pair (`addrs["prefill"]`, `addrs["decode"]`); what each client saw."""
    seen = [Seen(r.kind, prompt_len=len(r.prompt_token_ids)) for r in reqs]
    t0 = time.perf_counter()

    def one(i: int) -> None:
        r, s = reqs[i], seen[i]
        time.sleep(max(0.0, t0 + r.at - time.perf_counter()))
        try:
            if arrangement == "colocated":
                _colocated(addrs["servers"], i, r, f"{seed}-{i}", s)
            else:
                _disaggregated(addrs["prefill"], addrs["decode"], r, f"{seed}-{i}", s)
            s.ok = len(s.tokens) == r.max_tokens
            if not s.ok:
                s.error = f"{len(s.tokens)} tokens of {r.max_tokens}"
        except Exception as exc:  # noqa: BLE001 - a failed request is a result
            s.error = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return seen


def _pct(xs, q) -> float | None:
    return float(np.percentile(np.asarray(xs) * 1000, q)) if len(xs) else None


def summarize(seen: list[Seen], duration: float, slo_ms: dict[str, float]) -> dict:
    out: dict = {"requests": len(seen), "failed": sum(not s.ok for s in seen),
                 "errors": sorted({s.error for s in seen if s.error})[:5]}
    good = 0
    for s in seen:
        tp = (s.latency - s.ttft) / (len(s.tokens) - 1) if len(s.tokens) > 1 else 0.0
        good += s.ok and s.ttft * 1000 <= slo_ms["ttft"] and tp * 1000 <= slo_ms["tpot"]
    out["goodput_req_s"] = good / duration
    for kind in ("long_prompt", "long_output"):
        ks = [s for s in seen if s.kind == kind and s.ok]
        itl = [x for s in ks for x in s.itl]
        out[kind] = {"n": len(ks), "p50_ttft_ms": _pct([s.ttft for s in ks], 50),
                     "p99_ttft_ms": _pct([s.ttft for s in ks], 99), "p50_itl_ms": _pct(itl, 50),
                     "p99_itl_ms": _pct(itl, 99)}
    tr = [s for s in seen if s.ok and s.transfer_s is not None]
    if tr:
        out["kv_bytes_per_token"] = tr[0].kv_bytes / (tr[0].prompt_len)
        out["p50_transfer_ms"] = _pct([s.transfer_s for s in tr], 50)
        out["p50_transfer_ms_long_prompt"] = _pct([s.transfer_s for s in tr if s.kind == "long_prompt"], 50)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inflight.bench.serve.disagg", description=__doc__.splitlines()[0])
    p.add_argument("--rates", type=float, nargs="+", default=[1.0, 2.0, 4.0], help="requests per second")
    p.add_argument("--duration", type=float, default=15.0, help="seconds of arrivals per rate")
    p.add_argument("--threads", type=int, default=1, help="torch threads per engine process")
    p.add_argument("--slo", nargs=2, type=float, default=[1000.0, 100.0], metavar=("TTFT_MS", "TPOT_MS"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None)
    p.add_argument("--quick", action="store_true", help="a smoke run: one rate, 5 seconds")
    args = p.parse_args(argv)
    if args.quick:
        args.rates, args.duration = [2.0], 5.0
    from inflight.bench.serve.process import run_record, save_result
    from inflight.threads import LoadWatch

    slo = {"ttft": args.slo[0], "tpot": args.slo[1]}
    engine_args = ["--threads", str(args.threads), "--num-blocks", "256"]
    rows, check = [], None
    with LoadWatch() as watch:
        for rate in args.rates:
            reqs = mixed_workload(rate, args.duration, seed=args.seed)
            for arrangement in ("colocated", "disaggregated"):
                procs = []
                try:
                    if arrangement == "colocated":
                        procs = [start_role("colocated", engine_args) for _ in range(2)]
                        addrs = {"servers": [r.addr for r in procs]}
                    else:
                        procs.append(start_role("decode", engine_args))
                        procs.append(start_role("prefill", engine_args + ["--decode", "%s:%d" % procs[0].addr]))
                        addrs = {"decode": procs[0].addr, "prefill": procs[1].addr}
                    t = time.perf_counter()
                    seen = run_arrangement(arrangement, addrs, reqs, args.seed)
                    dur = time.perf_counter() - t
                finally:
                    for r in procs:
                        r.stop()
                row = {"rate": rate, "arrangement": arrangement, "duration_s": dur, **summarize(seen, dur, slo)}
                if check is None:
                    check = {arrangement: [s.tokens for s in seen]}
                elif rate == args.rates[0]:
                    check[arrangement] = [s.tokens for s in seen]
                rows.append(row)
                lp, lo = row["long_prompt"], row["long_output"]
                print(f"rate {rate:>4}: {arrangement:>13}: long prompts TTFT p50 {lp['p50_ttft_ms']} ms; "
                      f"long outputs ITL p50 {lo['p50_itl_ms']} p99 {lo['p99_itl_ms']} ms; goodput "
                      f"{row['goodput_req_s']:.2f} req/s; failed {row['failed']}", flush=True)
    same = check is not None and len(check) == 2 and check["colocated"] == check["disaggregated"]
    result = {**run_record("inflight.bench.serve.disagg", argv, watch), "settings": vars(args), "slo_ms": slo,
              "engine_args": engine_args, "rows": rows, "greedy_tokens_identical_at_first_rate": same}
    print("greedy tokens identical (colocated vs disaggregated, first rate):", same)
    save_result(result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
