"""Real servers for the serving tests: `python -m inflight.serve` in a subprocess on a free loopback
port (port 0: the system picks one, so tests running at the same time never collide), raw HTTP
over sockets, and the server's own /metrics. `InProcessServer` is the same app on a uvicorn thread
of the test's own process (still a real loopback socket), for tests that must look inside: the
engine's requests, the loop's per-request state, errors uvicorn logged. Every wait is generous and
polls: the tests assert behaviour, never timing, and must hold on two heavily loaded cores."""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 240
WAIT_S = 120


class HTTPServerClient:
    """Raw HTTP to a server at `self.host:self.port` (`self.model` is the name it serves)."""

    host: str
    port: int

    # -- HTTP ------------------------------------------------------------------------------------
    def connect(self) -> socket.socket:
        return socket.create_connection((self.host, self.port), timeout=WAIT_S)

    def post_raw(self, path: str, body: bytes, headers: dict | None = None) -> socket.socket:
        """Send a POST and return the open socket (the caller reads, or hangs up)."""
        s = self.connect()
        head = [f"POST {path} HTTP/1.1", f"Host: {self.host}", "Content-Type: application/json",
                f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in (headers or {}).items())]
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        return s

    def request(self, method: str, path: str, body: dict | bytes | None = None,
                headers: dict | None = None) -> tuple[int, dict, bytes]:
        """One whole HTTP exchange (Connection: close): (status, headers, body)."""
        data = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
        s = self.connect()
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}", "Connection: close",
                "Content-Type: application/json", f"Content-Length: {len(data)}",
                *(f"{k}: {v}" for k, v in (headers or {}).items())]
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        raw = read_all(s)
        s.close()
        return parse_response(raw)

    def metrics(self) -> dict[str, float]:
        """The server's Prometheus samples, {'name{labels}': value} (histogram buckets left out)."""
        status, _, body = self.request("GET", "/metrics")
        assert status == 200
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#") and "_bucket" not in line:
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def metric(self, name: str, **labels: str) -> float:
        want = [f'{k}="{v}"' for k, v in labels.items()]
        return sum(v for k, v in self.metrics().items()
                   if k.split("{")[0] == f"inflight:{name}" and all(w in k for w in want))

    def wait_until(self, predicate, what: str, timeout: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting until {what}; metrics: {self.metrics()}")
            time.sleep(0.1)

    def wait_idle(self) -> None:
        """Until nothing runs or waits and the KV pool is whole again."""
        self.wait_until(lambda: self.metric("num_requests_running") == 0 and self.metric("num_requests_waiting") == 0
                        and self.metric("kv_cache_usage_perc") == 0, "the server is idle with an empty pool")


class ServerProcess(HTTPServerClient):
    """`python -m inflight.serve ARGS --port 0`, started and ready (its URL read from its output)."""

    def __init__(self, *args: str):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "inflight.serve", "--port", "0", *args], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        self.output: list[str] = []
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the server exited before it was ready:\n" + "".join(self.output))
            self.output.append(line)
            m = re.search(r"serving (\S+) at (http://\S+)/v1", line)
            if m:
                self.model, self.base = m.group(1), m.group(2)
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start in time:\n" + "".join(self.output))
        self.host, self.port = self.base.removeprefix("http://").rsplit(":", 1)
        self.port = int(self.port)
        # keep reading what it writes (log lines): a pipe nobody reads fills up and stops the server
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = WAIT_S) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self._reader.join(timeout)

    def cpu_seconds(self) -> float:
        """User + system CPU time the server process has used so far (Linux /proc)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class InProcessServer(HTTPServerClient):
    """The server's app over `engine` (an `LLMEngine`), served by uvicorn on a thread of this process
    on a free loopback port. `aengine` and `prom` are its `AsyncEngine` and `ServerMetrics`;
    `errors` collects what uvicorn logs at ERROR (an exception that escaped the app)."""

    def __init__(self, engine, *, model_name: str = "inflight-tiny", loop: str = "thread", stream_interval: int = 1,
                 **app_kw):
        import uvicorn

        from inflight.serve.api_server import build_app
        from inflight.serve.async_engine import AsyncEngine
        from inflight.serve.framing import json_400_protocol
        from inflight.serve.metrics import ServerMetrics

        self.model, self.engine = model_name, engine
        self.prom = ServerMetrics(model_name, getattr(getattr(engine, "speculator", None), "k", None))
        self.aengine = AsyncEngine(engine, loop=loop, observer=self.prom, stream_interval=stream_interval)
        app = build_app(self.aengine, self.prom, model_name=model_name, **app_kw)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(256)
        self.host, self.port = sock.getsockname()
        self.base = f"http://{self.host}:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=10,
                                                    http=json_400_protocol()))
        self.errors: list[logging.LogRecord] = []
        self._log = _Collect(self.errors)
        logging.getLogger("uvicorn.error").addHandler(self._log)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the in-process server did not start: {self.errors}")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(WAIT_S)
        logging.getLogger("uvicorn.error").removeHandler(self._log)

    def loop_state(self) -> dict[str, int]:
        """What the engine and the loop still hold for requests (all zero once every request is over)."""
        ae, cpu = self.aengine, self.engine.scheduler.cpu_allocator
        return {"engine requests": len(self.engine.requests), "blocks used": self.engine.allocator.num_used,
                "swap blocks used": 0 if cpu is None else cpu.num_used,
                "collectors": len(ae._collectors), "sent": len(ae._sent), "metrics per request": len(self.prom._seen),
                "commands": len(ae._commands)}

    def wait_clean(self) -> None:
        """Until every request is over and nothing of them is left (see `loop_state`)."""
        deadline = time.monotonic() + WAIT_S
        while any(self.loop_state().values()):
            if time.monotonic() > deadline:
                raise AssertionError(f"state left behind: {self.loop_state()}")
            time.sleep(0.05)


class _Collect(logging.Handler):
    def __init__(self, out: list):
        super().__init__(logging.ERROR)
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        self.out.append(record)


def read_all(s: socket.socket) -> bytes:
    chunks = []
    while True:
        b = s.recv(65536)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def parse_response(raw: bytes) -> tuple[int, dict, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:] if ":" in l)}
    if headers.get("transfer-encoding") == "chunked":
        body = dechunk(body)
    return status, headers, body


def dechunk(body: bytes) -> bytes:
    out, rest = [], body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out.append(rest[:size])
        rest = rest[size + 2:]
    return b"".join(out)


def read_until(s: socket.socket, marker: bytes, limit: int = 1 << 20) -> bytes:
    """Read from `s` until `marker` has arrived (or the connection closes)."""
    data = b""
    while marker not in data and len(data) < limit:
        b = s.recv(4096)
        if not b:
            break
        data += b
    return data


def tiny_engine(tiny, **kw):
    """An `LLMEngine` over the `tiny` fixture's model: blocks of 16, a pool of 32 unless `kw` says
    otherwise (small, so that tests reach a full pool and preemption quickly)."""
    from inflight import LLMEngine

    model, tok = tiny
    return LLMEngine(model, tokenizer=tok, **{"block_size": 16, "num_blocks": 32, **kw})
