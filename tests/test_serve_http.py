"""`python -m inflight.serve` as a client sees it: a real uvicorn server on a free loopback port,
driven by the `openai` client (a client no one here wrote) and by raw HTTP for the SSE bytes,
the errors, and hang-ups before the first token, mid-stream and while waiting for a whole answer."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from serve_helpers import ROOT, WAIT_S, ServerProcess, parse_response, read_all, read_until  # noqa: E402

PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--num-blocks", "16", "--max-num-seqs", "4")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", timeout=WAIT_S, max_retries=0)


def offline(prompt: str, max_tokens: int, **kw) -> str:
    """The same greedy request run by the engine alone, in this process."""
    from inflight import LLMEngine, SamplingParams, load_tiny

    model, tok = load_tiny()
    engine = LLMEngine(model, tokenizer=tok, block_size=16, num_blocks=16)
    return engine.generate([prompt], SamplingParams(max_tokens=max_tokens, **kw), use_tqdm=False)[0].text


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [server.model]
    assert server.request("GET", "/health")[0] == 200


def test_completion_streamed_and_whole_equal_the_engine_alone(server, client):
    whole = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=40)
    stream = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=40, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert whole.choices[0].text == text == offline(PROMPT, 40)
    assert whole.usage.completion_tokens == 40 and whole.choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 40 and not chunks[-1].choices  # the usage chunk comes last
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_stream_with_the_openai_client(server, client):
    stream = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=12, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "length"
    whole = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=12)
    assert whole.choices[0].message.content == "".join(c.choices[0].delta.content or "" for c in chunks)
    assert whole.usage.completion_tokens == 12


def test_stop_strings_end_the_text_before_them(server, client):
    full = offline(PROMPT, 60)
    stop = full.strip()[:3]
    out = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=60, stop=[stop])
    assert out.choices[0].finish_reason == "stop"
    assert out.choices[0].text == full[:full.index(stop)]


def test_sse_bytes(server):
    body = {"model": server.model, "prompt": PROMPT, "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    status, headers, raw = server.request("POST", "/v1/completions", body)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = raw.decode().split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: {") for e in events[:-2])
    counts = [p["usage"]["completion_tokens"] for p in payloads]
    assert counts == sorted(counts) and counts[-1] == 5  # running usage in every chunk, then the total
    assert payloads[-1]["choices"] == [] and all(p["object"] == "text_completion" for p in payloads)


@pytest.mark.parametrize("body, words", [
    (b"{not json", "not valid JSON"),
    (b'{"prompt": "x", "temperature": NaN}', "NaN is not a JSON number"),
    (b'[1, 2]', "must be a JSON object"),
    ({"prompt": "x", "max_tokens": "4"}, "max_tokens must be an int"),
    ({"prompt": "x", "temperature": -1}, "temperature must be >= 0.0"),
    ({"prompt": "x", "stream": "yes"}, "stream must be a boolean"),
    ({"prompt": "x" * 600, "max_tokens": 4}, "longer than the model's context of 512"),
    ({"prompt": "x", "max_tokens": 600}, "exceed the model's context of 512"),
    ({"prompt": "x", "max_tokens": 300, "ignore_eos": True}, "pool"),
    ({"prompt": [1, 2, 99999], "max_tokens": 4}, "vocabulary"),
    ({"prompt": "x", "stop": [""]}, "empty string"),
    ({"prompt": "x", "n": 0}, "n must be >= 1"),
    ({"prompt": "x", "n": 5}, "more than max_batch_size (4)"),
    ({"max_tokens": 4}, "prompt is required"),
])
def test_bad_requests_get_openai_errors_with_the_engines_message(server, body, words):
    status, _, raw = server.request("POST", "/v1/completions", body)
    err = json.loads(raw)["error"]
    assert status == 400, raw
    assert words in err["message"] and set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error"


def test_unknown_model_is_404_and_a_huge_body_413(server):
    status, _, raw = server.request("POST", "/v1/completions", {"model": "gpt-9", "prompt": "x"})
    assert status == 404 and "does not exist" in json.loads(raw)["error"]["message"]
    s = server.connect()  # a body past the limit is refused on its Content-Length, before it is read
    s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {2 << 20}\r\n"
              "Content-Type: application/json\r\n\r\n".encode())
    status, _, raw = parse_response(read_all(s))
    s.close()
    assert status == 413 and "over the limit" in json.loads(raw)["error"]["message"]


def test_bad_requests_do_not_disturb_one_in_flight(server, client):
    stream = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=40, stream=True)
    first = next(iter(stream))
    for _ in range(5):
        assert server.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": -3})[0] == 400
    text = first.choices[0].text + "".join(c.choices[0].text for c in stream if c.choices)
    assert text == offline(PROMPT, 40)


def _long(server, stream: bool) -> bytes:
    return json.dumps({"model": server.model, "prompt": PROMPT, "max_tokens": LONG, "ignore_eos": True,
                       "stream": stream}).encode()


LONG = 230  # tokens: with the prompt, all the fixture's pool (16 blocks of 16) can hold


def _hang_up(server, when: str) -> bool:
    """One client hangs up `when`; True if its request was aborted (False: it had already finished,
    on a machine so busy that the client could not hang up in time — the caller tries again)."""
    server.wait_idle()
    aborted = server.metric("request_success_total", finished_reason="abort")
    finished = server.metric("request_success_total", finished_reason="length")
    blockers = []
    if when == "before the first token":  # four long requests fill the batch (max-num-seqs 4): ours waits
        blockers = [server.post_raw("/v1/completions", _long(server, True)) for _ in range(4)]
        # (in the engine, running or preempted back to waiting: the four outgrow the pool together, so
        # on a quick machine the moment all four run at once can pass between two reads of /metrics)
        server.wait_until(lambda: server.metric("num_requests_running") + server.metric("num_requests_waiting") >= 4,
                          "the batch is full")
    s = server.post_raw("/v1/completions", _long(server, when != "waiting for a whole answer"))
    if when == "mid-stream":
        read_until(s, b"data: {")  # a first chunk has come
    elif when == "before the first token":
        server.wait_until(lambda: server.metric("num_requests_waiting") >= 1, "our request waits")
    else:
        server.wait_until(lambda: server.metric("num_requests_running") >= 1, "our request runs")
    s.close()
    for b in blockers:
        b.close()
    server.wait_until(lambda: server.metric("request_success_total", finished_reason="abort")
                      + server.metric("request_success_total", finished_reason="length")
                      >= aborted + finished + 1 + len(blockers), "every request has ended")
    server.wait_idle()  # the pool is whole again
    return server.metric("request_success_total", finished_reason="abort") == aborted + 1 + len(blockers)


@pytest.mark.parametrize("when", ["before the first token", "mid-stream", "waiting for a whole answer"])
def test_a_client_that_hangs_up_is_aborted_and_its_blocks_come_back(server, when):
    assert any(_hang_up(server, when) for _ in range(4)), "the request was never aborted"
    assert server.request("GET", "/health")[0] == 200


def test_an_idle_server_uses_no_cpu(server):
    server.wait_idle()
    time.sleep(0.5)
    before = server.cpu_seconds()
    time.sleep(3)
    assert server.cpu_seconds() - before < 0.3  # a spinning loop would use ~3 s


def test_load_generator_quick_run_against_the_server(server, tmp_path):
    out = tmp_path / "r.json"
    run = subprocess.run([sys.executable, "-m", "inflight.bench.serve", "--quick", "--base-url", server.base,
                          "--disable-tqdm", "--goodput", "ttft:60000", "--save-result", "--result-filename", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    r = json.loads(out.read_text())
    assert r["completed"] == 8 and r["failed"] == 0 and r["total_output_tokens"] == 64
    assert all(len(itl) == 7 for itl in r["itls"]) and r["request_goodput"] > 0
    assert {"mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_itl_ms", "p99_e2el_ms"} <= set(r)


def test_api_key_back_pressure_and_shutdown():
    srv = ServerProcess("--api-key", "sesame", "--max-waiting", "2", "--max-num-seqs", "1", "--num-blocks", "16")
    try:
        key = {"Authorization": "Bearer sesame"}
        assert srv.request("GET", "/v1/models")[0] == 401
        assert srv.request("GET", "/v1/models", headers={"Authorization": "Bearer nope"})[0] == 401
        assert srv.request("GET", "/v1/models", headers=key)[0] == 200
        body = json.dumps({"prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "stream": True}).encode()
        running = srv.post_raw("/v1/completions", body, key)
        read_until(running, b"data: {")           # it runs (the batch holds one)
        waiting = [srv.post_raw("/v1/completions", body, key) for _ in range(2)]
        srv.wait_until(lambda: srv.metric("num_requests_waiting") == 2, "two requests wait")
        status, headers, raw = srv.request("POST", "/v1/completions", body, key)
        assert status == 503 and headers["retry-after"] == "1" and "full" in json.loads(raw)["error"]["message"]
        # SIGTERM: in-flight streams end (with "abort"), and the server exits cleanly
        srv.proc.send_signal(signal.SIGTERM)
        tail = read_until(running, b"data: [DONE]")
        assert b'"finish_reason":"abort"' in tail and tail.endswith(b"data: [DONE]\n\n") or b"[DONE]" in tail
        assert srv.proc.wait(WAIT_S) in (0, -signal.SIGTERM)  # (uvicorn re-raises the signal it handled)
        for w in waiting:
            w.close()
        running.close()
    finally:
        srv.stop(signal.SIGKILL)


def test_the_command_line_server_reports_ignored_fields_and_answers_bad_framing_in_json(server):
    """`python -m inflight.serve` itself: the log line for fields it does not know reaches its output
    (once per set of names), and bytes uvicorn's parser refuses get OpenAI's JSON error shape."""
    body = {"model": server.model, "prompt": PROMPT, "max_tokens": 2, "x_trace_id": "abc"}
    for _ in range(2):
        assert server.request("POST", "/v1/completions", body)[0] == 200
    deadline = time.monotonic() + WAIT_S
    while not any("x_trace_id" in line for line in server.output) and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = [line for line in server.output if "x_trace_id" in line]
    assert len(lines) == 1 and "ignored" in lines[0], server.output[-5:]
    s = server.connect()
    s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
    status, headers, raw = parse_response(read_all(s))
    s.close()
    assert status == 400 and headers["content-type"] == "application/json"
    assert json.loads(raw)["error"]["type"] == "invalid_request_error"
