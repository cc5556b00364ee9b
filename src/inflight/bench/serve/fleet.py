"""Several servers behind a real router, as processes on loopback: `n` replicas of
`python -m inflight.serve` (or any command that serves the OpenAI API) and `vllm-router` (the vLLM
project's Rust router, the `router` extra) in front of them.

    with Fleet(2, policy="cache_aware", server_args=["--enable-prefix-caching"]) as fleet:
        fleet.router_url           # send requests here
        fleet.kill(0)              # SIGKILL one replica (a crash), fleet.restart(0) brings it back
        fleet.workers()            # what the router believes: [{url, is_healthy, load}, ...]

Everything listens on 127.0.0.1 only. Every wait is bounded (`timeout`), every process is stopped
by its PID (SIGTERM, then SIGKILL), also when the block raises or the interpreter exits (`atexit`),
so nothing is left behind. It starts processes and speaks HTTP: it imports no engine code.
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

from inflight.bench.serve.process import ServerHandle, free_port, start_inflight, stop_process

__all__ = ["Fleet", "router_executable", "POLICIES", "scrape"]

#: the router policies the chapter compares (vllm-router's names)
POLICIES = ("round_robin", "power_of_two", "cache_aware", "consistent_hash")
ROUTER_READY_S = 60.0


def router_executable() -> str | None:
    """The `vllm-router` next to this interpreter (a venv's bin), else on PATH; None if absent."""
    return shutil.which("vllm-router", path=str(Path(sys.executable).parent)) or shutil.which("vllm-router")


def scrape(base_url: str, timeout: float = 10.0) -> dict[str, float]:
    """A server's Prometheus samples `{name{labels}: value}` (histogram buckets left out)."""
    import httpx

    out: dict[str, float] = {}
    for line in httpx.get(base_url + "/metrics", timeout=timeout).text.splitlines():
        if line and not line.startswith("#") and "_bucket" not in line:
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def _sum(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k.split("{")[0] == name)


class Fleet:
    """`n` replicas and a `vllm-router` on loopback (see the module docstring).

    `server_args` go to every `python -m inflight.serve`; `router_args` to the router (after the
    policy). Replicas start at the same time (each loads its model); `timeout` bounds every start."""

    def __init__(self, n: int, *, policy: str = "cache_aware", server_args: Sequence[str] = (),
                 router_args: Sequence[str] = (), log_dir: Path | None = None, timeout: float = 300.0):
        if type(n) is not int or n < 1:
            raise ValueError(f"a fleet needs at least one replica, got n={n!r}")
        if router_executable() is None:
            raise RuntimeError("vllm-router is not installed: pip install 'inflight[router]'")
        self.policy, self.server_args, self.timeout = policy, list(server_args), timeout
        self.log_dir = Path(log_dir or os.environ.get("TMPDIR", "/tmp"))
        self.replicas: list[ServerHandle | None] = [None] * n
        self.router: subprocess.Popen | None = None
        atexit.register(self.stop)
        try:
            self._start_replicas(range(n))
            self.router_args = list(router_args)
            self._start_router(policy)
        except BaseException:
            self.stop()
            raise

    # -- starting --------------------------------------------------------------------------------
    def _start_replicas(self, which, ports: dict[int, int] | None = None) -> None:
        errors: list[BaseException] = []

        def start(i: int) -> None:
            args = list(self.server_args)
            if ports and i in ports:
                args += ["--port", str(ports[i])]  # (after start_inflight's --port 0: the last one wins)
            try:
                self.replicas[i] = start_inflight(args, log_dir=self.log_dir)
            except BaseException as exc:  # noqa: BLE001 - re-raised below, in the caller's thread
                errors.append(exc)

        threads = [threading.Thread(target=start, args=(i,), daemon=True) for i in which]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.timeout)
        if errors or any(self.replicas[i] is None for i in which):
            raise RuntimeError(f"a replica did not start: {errors or 'timed out'}")

    def _start_router(self, policy: str) -> None:
        self.policy = policy
        self.router_port = free_port()
        self.router_url = f"http://127.0.0.1:{self.router_port}"
        self.router_log = self.log_dir / f"vllm-router-{os.getpid()}-{self.router_port}.log"
        self.router = subprocess.Popen(
            [router_executable(), "--host", "127.0.0.1", "--port", str(self.router_port), "--worker-urls",
             *(r.base_url for r in self.replicas), "--policy", policy, "--log-level", "warning",
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
             "--worker-startup-timeout-secs", str(int(self.timeout)), *self.router_args],
            stdout=self.router_log.open("w"), stderr=subprocess.STDOUT)
        self._wait_router()

    def set_policy(self, policy: str, router_args: Sequence[str] | None = None) -> None:
        """A new router with `policy` (and `router_args`, if given, instead of the fleet's) in front of
        the same replicas (their caches stay as they are)."""
        self._stop_router()
        if router_args is not None:
            self.router_args = list(router_args)
        self._start_router(policy)

    def _wait_router(self) -> None:
        import httpx

        deadline = time.monotonic() + min(self.timeout, ROUTER_READY_S)
        while time.monotonic() < deadline:
            if self.router.poll() is not None:
                break
            try:
                if httpx.get(self.router_url + "/health", timeout=5).status_code == 200 and \
                        all(w["is_healthy"] for w in self.workers()):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("vllm-router did not become ready:\n" + self.router_log.read_text()[-3000:])

    # -- looking ---------------------------------------------------------------------------------
    @property
    def urls(self) -> list[str]:
        return [r.base_url for r in self.replicas if r is not None]

    def workers(self) -> list[dict]:
        """The router's view of its workers (`GET /workers`): url, is_healthy, load, ..."""
        import httpx

        return httpx.get(self.router_url + "/workers", timeout=5).json()["workers"]

    def replica_metrics(self) -> list[dict[str, float]]:
        """Per replica (in order): prefix-cache queried and hit tokens, requests finished, prompt and
        generated tokens, from its own /metrics (None for a replica that is down)."""
        out = []
        for r in self.replicas:
            try:
                s = scrape(r.base_url)
            except Exception:  # noqa: BLE001 - a dead replica answers nothing
                out.append(None)
                continue
            out.append({"prefix_cache_query_tokens": _sum(s, "inflight:prefix_cache_queries_total"),
                        "prefix_cache_hit_tokens": _sum(s, "inflight:prefix_cache_hits_total"),
                        "requests": _sum(s, "inflight:request_success_total"),
                        "prompt_tokens": _sum(s, "inflight:prompt_tokens_total"),
                        "generation_tokens": _sum(s, "inflight:generation_tokens_total")})
        return out

    # -- faults ----------------------------------------------------------------------------------
    def kill(self, i: int) -> None:
        """SIGKILL replica `i` (a crash: nothing finishes, connections drop)."""
        r = self.replicas[i]
        if r is not None and r.proc.poll() is None:
            r.proc.send_signal(signal.SIGKILL)
            r.proc.wait(30)

    def restart(self, i: int) -> None:
        """Start replica `i` again on its old port, so that the router's health check finds it."""
        old = self.replicas[i]
        port = int(old.base_url.rsplit(":", 1)[1])
        old.stop()
        self.replicas[i] = None
        self._start_replicas([i], ports={i: port})

    # -- stopping --------------------------------------------------------------------------------
    def stop(self) -> None:
        """The router, then every replica, each by its PID; bounded; safe to call twice."""
        self._stop_router()
        for r in self.replicas:
            if r is not None:
                r.stop(timeout=30)
        atexit.unregister(self.stop)

    def _stop_router(self) -> None:
        if self.router is not None:
            stop_process(self.router, 15)

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
