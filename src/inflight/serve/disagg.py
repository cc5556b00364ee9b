"""`python -m inflight.serve.disagg ROLE`: engines in their own processes for prefill/decode
disaggregation, speaking length-prefixed frames over loopback TCP (`inflight.serve.frames`).

    python -m inflight.serve.disagg decode --port 0               # prints: inflight-disagg: decode at HOST:PORT
    python -m inflight.serve.disagg prefill --port 0 --decode HOST:PORT
    python -m inflight.serve.disagg colocated --port 0           # one engine doing both (the baseline)

The request protocol (a client, e.g. `inflight.bench.serve.disagg`, drives it, as vLLM's disagg proxy does):

1. the client tells the decode instance to expect a request: `{"op": "expect", "request_id", "max_tokens"}`,
   and keeps that connection open: the tokens will come back on it;
2. it sends the prompt to the prefill instance: `{"op": "prefill", "request_id", "prompt_token_ids"}`.
   The prefill engine runs it with `max_tokens=1` and answers `{"first_token", "time"}` at once
   (the client's first token); its KV connector pushes the request's KV to the decode instance
   (`{"op": "kv"}` + `KVPayload.to_bytes()`) — a push, like vLLM's P2P-NCCL and Mooncake connectors;
3. the decode instance, holding both the expectation and the KV, adds the request
   (`LLMEngine.add_prefilled_request`) and streams `{"tokens", "finished"}` frames until it ends.

`colocated` serves `{"op": "generate", "request_id", "prompt_token_ids", "max_tokens"}` itself and
streams the same frames. Greedy decoding with `ignore_eos`; one engine loop per process on its own
thread; every socket on 127.0.0.1 unless told otherwise. SIGTERM ends the process.
"""
from __future__ import annotations

import argparse
import queue
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable

from inflight.serve.frames import recv_frame, send_frame

__all__ = ["EngineLoop", "main"]


class EngineLoop:
    """The only thread that touches the engine: it takes commands from a queue, steps while there is
    work, and hands every output to the sink registered for its request (on this thread)."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.commands: queue.Queue = queue.Queue()
        self.sinks: dict[str, Callable] = {}
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[[Any], str], sink: Callable) -> None:
        """`fn(engine)` adds a request and returns its id; `sink(output)` then gets its outputs."""
        self.commands.put((fn, sink))

    def _run(self) -> None:
        eng = self.engine
        while True:
            if not eng.has_unfinished_requests():
                self._take(self.commands.get())
            while True:
                try:
                    self._take(self.commands.get_nowait())
                except queue.Empty:
                    break
            if not eng.has_unfinished_requests():
                continue
            for out in eng.step():
                sink = self.sinks.get(out.request_id)
                if sink is None:
                    continue
                try:
                    sink(out)
                except OSError:  # its client left: stop the request
                    eng.abort_request(out.request_id)
                    self.sinks.pop(out.request_id, None)
                    continue
                if out.finished:
                    self.sinks.pop(out.request_id, None)

    def _take(self, cmd) -> None:
        fn, sink = cmd
        try:
            self.sinks[fn(self.engine)] = sink
        except (ValueError, TypeError) as exc:
            try:
                sink(exc)
            except OSError:
                pass


def _streamer(conn: socket.socket, skip: int = 0, first: dict | None = None) -> Callable:
    """A sink that streams a request's new tokens (after the first `skip`) to `conn`; `first` goes
    along in the first frame."""
    sent, extra = [skip], [first or {}]

    def sink(out) -> None:
        if isinstance(out, Exception):
            send_frame(conn, {"error": str(out), "finished": True})
            return
        new = out.token_ids[sent[0]:]
        if new or out.finished:
            sent[0] += len(new)
            send_frame(conn, {"tokens": new, "finished": out.finished, "finish_reason": out.finish_reason,
                              "time": time.time(), **extra[0]})
            extra[0] = {}
    return sink


def _params(max_tokens: int):
    from inflight.engine.sampling import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def _serve(sock: socket.socket, handle: Callable[[socket.socket, dict, bytearray], None]) -> None:
    """Accept connections forever; each gets a thread that reads frames and calls `handle`."""
    def client(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head, body = recv_frame(conn)
                handle(conn, head, body)
        except (ConnectionError, OSError):
            pass

    while True:
        conn, _ = sock.accept()
        threading.Thread(target=client, args=(conn,), daemon=True).start()


def run_decode(engine: Any, sock: socket.socket) -> None:
    from inflight.engine.kv_transfer import KVPayload

    loop, lock = EngineLoop(engine), threading.Lock()
    expected: dict[str, tuple[socket.socket, int]] = {}
    arrived: dict[str, tuple[KVPayload, float]] = {}

    def start(rid: str) -> None:  # (under the lock) both halves are here
        conn, max_tokens = expected.pop(rid)
        payload, when = arrived.pop(rid)
        loop.submit(lambda eng: eng.add_prefilled_request(payload, _params(max_tokens), request_id=rid),
                    _streamer(conn, skip=len(payload.output_token_ids),
                              first={"kv_received": when, "kv_bytes": payload.nbytes}))

    def handle(conn: socket.socket, head: dict, body: bytearray) -> None:
        rid = str(head.get("request_id"))
        with lock:
            if head["op"] == "expect":
                expected[rid] = (conn, int(head["max_tokens"]))
            elif head["op"] == "kv":
                arrived[rid] = (KVPayload.from_bytes(body), time.time())
                send_frame(conn, {"ok": True, "time": time.time()})
            if rid in expected and rid in arrived:
                start(rid)

    _serve(sock, handle)


class SocketConnector:
    """The prefill side's connector: every finished request's KV is pushed to the decode instance on
    a sender thread (so the engine loop goes on), one frame per request, acknowledged."""

    def __init__(self, decode: tuple[str, int]):
        self.decode = decode
        self.outbox: queue.Queue = queue.Queue()
        threading.Thread(target=self._send, daemon=True).start()

    def wants_kv(self, request_id: str) -> bool:
        return True

    def save(self, payload) -> None:
        self.outbox.put(payload)

    def _send(self) -> None:
        conn = socket.create_connection(self.decode, timeout=120)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            p = self.outbox.get()
            send_frame(conn, {"op": "kv", "request_id": p.request_id}, p.to_bytes())
            recv_frame(conn)


def run_prefill(engine: Any, sock: socket.socket) -> None:
    loop = EngineLoop(engine)

    def handle(conn: socket.socket, head: dict, body: bytearray) -> None:
        def sink(out) -> None:
            if isinstance(out, Exception):
                send_frame(conn, {"error": str(out)})
            elif out.finished:
                send_frame(conn, {"first_token": out.token_ids[0], "time": time.time()})
        rid, ids = str(head["request_id"]), head["prompt_token_ids"]
        loop.submit(lambda eng: eng.add_request(ids, _params(1), request_id=rid), sink)

    _serve(sock, handle)


def run_colocated(engine: Any, sock: socket.socket) -> None:
    loop = EngineLoop(engine)

    def handle(conn: socket.socket, head: dict, body: bytearray) -> None:
        rid, ids, n = str(head["request_id"]), head["prompt_token_ids"], int(head["max_tokens"])
        loop.submit(lambda eng: eng.add_request(ids, _params(n), request_id=rid), _streamer(conn))

    _serve(sock, handle)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inflight.serve.disagg", description=__doc__.splitlines()[0])
    p.add_argument("role", choices=("prefill", "decode", "colocated"))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--decode", default=None, help="HOST:PORT of the decode instance (the prefill role)")
    p.add_argument("--num-blocks", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.role == "prefill" and not args.decode:
        p.error("the prefill role needs --decode HOST:PORT")
    import inflight  # noqa: F401  (before torch: the OpenMP wait policy)
    from inflight.engine.llm_engine import LLMEngine
    from inflight.model.loading import load_tiny
    from inflight.threads import configure_threads

    configure_threads(args.threads)
    model, tok = load_tiny()
    connector = None
    if args.role == "prefill":
        host, port = args.decode.rsplit(":", 1)
        connector = SocketConnector((host, int(port)))
    engine = LLMEngine(model, tokenizer=tok, num_blocks=args.num_blocks, max_batch_size=args.max_num_seqs,
                       max_batched_tokens=args.max_num_batched_tokens, kv_connector=connector)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(1024)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    host, port = sock.getsockname()[:2]
    print(f"inflight-disagg: {args.role} at {host}:{port}", flush=True)
    {"prefill": run_prefill, "decode": run_decode, "colocated": run_colocated}[args.role](engine, sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
