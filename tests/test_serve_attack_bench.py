"""The load generator against a deliberately odd server: Server-Sent Events split anywhere across
reads (inside a JSON object, inside a UTF-8 character), empty deltas and comments, a stream that
ends without its [DONE], one the server aborts, one that stops mid-chunk, one that never answers.
It must count tokens and inter-token gaps right, report every failure as one, and never hang."""
from __future__ import annotations

import asyncio
import json
import socketserver
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")

from inflight.bench.serve import SampleRequest, run_benchmark  # noqa: E402
from inflight.bench.serve.client import send_request, stream_payload  # noqa: E402

TEXT = ["def", " f", "(x", "):", " é", "日", "\n"]


def _event(obj) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


def _chunk(text, n, finish=None, usage=True):
    out = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    if usage:
        out["usage"] = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}
    return out


def _script(kind: str) -> list[bytes]:
    """The SSE body (as pieces written one by one) the odd server sends for a request of `kind`."""
    events = [_chunk(t, i + 1) for i, t in enumerate(TEXT)]
    if kind == "split":  # empty deltas, a comment, then the body cut into 7-byte pieces
        body = b": keep-alive\n\n" + b"".join(_event(e) + _event(_chunk("", i + 1)) for i, e in enumerate(events))
        body += _event(_chunk("", len(TEXT), "length")) + _event({"choices": [], "usage": events[-1]["usage"]})
        body += b"data: [DONE]\n\n"
        return [body[i:i + 7] for i in range(0, len(body), 7)]
    if kind == "no-usage":  # a server that sends no running usage: each chunk with text is one token
        return [_event(_chunk(t, 0, "length" if i == len(TEXT) - 1 else None, usage=False)) for i, t in enumerate(TEXT)] \
            + [b"data: [DONE]\n\n"]
    if kind == "closes-early":  # three tokens, then the body just ends: no finish_reason, no [DONE]
        return [_event(e) for e in events[:3]]
    if kind == "aborted":  # the server gives up on it (shutting down)
        return [_event(e) for e in events[:3]] + [_event(_chunk("", 3, "abort")), b"data: [DONE]\n\n"]
    if kind == "error-event":
        return [_event(events[0]), _event({"error": {"message": "the engine loop died", "type": "x"}}),
                b"data: [DONE]\n\n"]
    if kind == "cut-mid-chunk":  # the connection drops inside an HTTP chunk
        return [_event(events[0]), b"RST"]
    if kind == "silent":  # headers, then nothing at all
        return [b"SLEEP"]
    raise ValueError(kind)


class _OddHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            self._answer(self.request)
        except OSError:  # the client hung up once it had read what it wanted (it may: that is not a failure)
            pass

    def _answer(self, sock) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        if head.startswith(b"GET /v1/models"):  # a server that wants a key the client does not have
            err = b'{"error": {"message": "invalid or missing API key", "type": "authentication_error"}}'
            sock.sendall(b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n%s" % (len(err), err))
            return
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        while len(body) < length:
            body += sock.recv(65536)
        kind = json.loads(body)["prompt"]
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                     b"Connection: close\r\n\r\n")
        for piece in _script(kind):
            if piece == b"SLEEP":
                time.sleep(30)
                return
            if piece == b"RST":
                sock.sendall(b"40\r\ndata: {\"cho")  # a chunk announced as 64 bytes, 15 sent
                return
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            time.sleep(0.002)
        sock.sendall(b"0\r\n\r\n")


@pytest.fixture(scope="module")
def odd_server():
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _OddHandler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _send(base: str, kind: str, timeout: float = 60.0):
    async def go():
        async with httpx.AsyncClient(timeout=httpx.Timeout(timeout)) as client:
            return await send_request(client, base + "/v1/completions", stream_payload("m", kind, 7))

    return asyncio.run(go())


@pytest.mark.parametrize("kind", ["split", "no-usage"])
def test_tokens_and_gaps_are_counted_however_the_events_are_cut(odd_server, kind):
    r = _send(odd_server, kind)
    assert r.success and r.error == "" and r.finish_reason == "length"
    assert r.generated_text == "".join(TEXT) and r.output_len == len(TEXT)
    assert len(r.itl) == len(TEXT) - 1 and all(g >= 0 for g in r.itl) and r.ttft > 0


@pytest.mark.parametrize("kind, words", [
    ("closes-early", "ended before"),       # (counted as a success before: it had tokens)
    ("aborted", "finish_reason 'abort'"),  # (counted as a success before)
    ("error-event", "engine loop died"),
    ("cut-mid-chunk", "RemoteProtocolError"),
])
def test_a_stream_that_did_not_finish_is_a_failure(odd_server, kind, words):
    r = _send(odd_server, kind)
    assert not r.success and words in r.error, r.error


def test_a_server_that_never_answers_is_a_failure_not_a_hang(odd_server):
    t0 = time.monotonic()
    r = _send(odd_server, "silent", timeout=1.0)
    assert not r.success and "Timeout" in r.error and time.monotonic() - t0 < 25


def test_the_benchmark_counts_completed_and_failed_requests(odd_server):
    kinds = ["split", "closes-early", "no-usage", "aborted", "split"]
    r = run_benchmark(odd_server, [SampleRequest(k, 7) for k in kinds], model="m", disable_tqdm=True)
    assert r["completed"] == 3 and r["failed"] == 2
    assert r["total_output_tokens"] == 3 * len(TEXT) and sum(len(i) for i in r["itls"][::2]) == 3 * (len(TEXT) - 1)
    assert [bool(e) for e in r["errors"]] == [False, True, False, True, False]



def _closed_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("kw, words", [
    ({"percentiles": [50, 150]}, "between 0 and 100"),   # (numpy refused it only after the whole run)
    ({"percentiles": [float("nan")]}, "between 0 and 100"),
    ({"max_concurrency": 0}, "max_concurrency must be a positive integer"),  # (0 meant: no limit)
    ({"max_concurrency": -2}, "max_concurrency must be a positive integer"),
    ({"request_rate": float("nan")}, "must be positive"),
    ({"request_rate": float("inf"), "burstiness": -1.0}, "must be positive"),
    ({"requests": []}, "no requests to send"),          # (IndexError in arrival_times, or a run of nothing)
])
def test_bad_benchmark_settings_are_refused_before_a_request_is_sent(kw, words):
    """Against a port where nothing listens: the setting, not the missing server, is what is named."""
    reqs = kw.pop("requests", [SampleRequest("x", 2)])
    with pytest.raises(ValueError, match=words):
        run_benchmark(_closed_port(), reqs, model="m", disable_tqdm=True, **kw)


def test_the_cli_names_a_missing_server_or_a_refused_key_without_a_traceback(odd_server, capsys):
    from inflight.bench.serve import main

    assert main(["--base-url", _closed_port(), "--quick", "--disable-tqdm"]) == 2
    assert "error: cannot reach http://127.0.0.1:" in capsys.readouterr().err
    assert main(["--base-url", odd_server, "--quick", "--disable-tqdm"]) == 2  # (KeyError 'data' before)
    assert "answered HTTP 401" in capsys.readouterr().err
    assert main(["--base-url", odd_server, "--quick", "--metric-percentiles", "50,p99"]) == 2
    assert "could not convert string to float: 'p99'" in capsys.readouterr().err
