"""The vLLM project's own router in front of two servers, end to end: two `python -m inflight.serve`
workers and `vllm-router --policy cache_aware` (the `router` extra, a Rust binary) on free loopback
ports; completions and chats, streamed and whole, sent through the router with the `openai` client.
The router adds vLLM's and SGLang's extension fields to every request (`no_stop_trim`,
`separate_reasoning`, ...) and asks each worker for `/v1/completions/render` and `/tokenize`
before forwarding (both a 404 here: it then routes on the text); every request must succeed, with
the answer a worker gives directly. Everything is stopped by its PID; every wait is bounded."""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from serve_helpers import START_TIMEOUT_S, WAIT_S, ServerProcess  # noqa: E402

ROUTER = shutil.which("vllm-router", path=str(Path(sys.executable).parent)) or shutil.which("vllm-router")
pytestmark = pytest.mark.skipif(ROUTER is None, reason="vllm-router is not installed (pip install 'inflight[router]')")
PROMPTS = ["def add(a, b):", "class Stack:\n    def push(self, x):", "def fib(n):"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _workers(n: int) -> list[ServerProcess]:
    """`n` servers, started at the same time (each loads the model)."""
    out: list = [None] * n
    errors: list = []

    def start(i: int) -> None:
        try:
            out[i] = ServerProcess("--num-blocks", "32", "--max-num-seqs", "4")
        except Exception as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(START_TIMEOUT_S)
    if errors or None in out:
        for w in out:
            if w is not None:
                w.stop()
        raise RuntimeError(f"a worker did not start: {errors}")
    return out


class Router:
    def __init__(self, workers: list[ServerProcess], log: Path):
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log.open("w")
        self.proc = subprocess.Popen([ROUTER, "--host", "127.0.0.1", "--port", str(self.port), "--worker-urls",
                                      *(w.base for w in workers), "--policy", "cache_aware", "--log-level", "warning",
                                      "--prometheus-port", str(_free_port()), "--worker-startup-timeout-secs", "60"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                if urllib.request.urlopen(self.base + "/health", timeout=5).status == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("vllm-router did not start:\n" + Path(self.log.name).read_text()[-3000:])
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(WAIT_S)
        self.log.close()


def test_vllm_router_in_front_of_two_servers(tmp_path):
    workers = _workers(2)
    router = None
    try:
        router = Router(workers, tmp_path / "router.log")
        via = openai.OpenAI(base_url=router.base + "/v1", api_key="x", timeout=WAIT_S, max_retries=0)
        direct = openai.OpenAI(base_url=workers[0].base + "/v1", api_key="x", timeout=WAIT_S, max_retries=0)
        model, sent = workers[0].model, 0
        for prompt in PROMPTS:
            want = direct.completions.create(model=model, prompt=prompt, max_tokens=12).choices[0].text
            whole = via.completions.create(model=model, prompt=prompt, max_tokens=12)
            streamed = list(via.completions.create(model=model, prompt=prompt, max_tokens=12, stream=True))
            assert whole.choices[0].text == "".join(c.choices[0].text for c in streamed if c.choices) == want
            messages = [{"role": "user", "content": prompt}]
            chat = via.chat.completions.create(model=model, messages=messages, max_tokens=8)
            chunks = list(via.chat.completions.create(model=model, messages=messages, max_tokens=8, stream=True))
            assert chat.choices[0].message.content == "".join(c.choices[0].delta.content or "" for c in chunks
                                                              if c.choices)
            assert chat.usage.completion_tokens == 8 and chunks[-1].choices[0].finish_reason == "length"
            sent += 4
        served = sum(w.metric("request_success_total") for w in workers) - len(PROMPTS)  # (less the direct ones)
        assert served == sent, f"{served} requests reached the workers, {sent} were sent"
        assert sum(w.metric("request_success_total", finished_reason="error") for w in workers) == 0
    finally:
        if router is not None:
            router.stop()
        for w in workers:
            w.stop()
