"""The server attacked by someone who did not write it: hostile and odd input, bursts past the
back-pressure bound, clients that vanish mid-upload, a model that raises, and the bookkeeping that
must come out whole afterwards. The app runs in this process on a uvicorn thread with a real
loopback socket (`InProcessServer`), so each test can also check what the server kept: nothing
logged as an error, no request, collector or block left once the clients are done."""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from serve_helpers import WAIT_S, InProcessServer, parse_response, read_until, tiny_engine  # noqa: E402

PROMPT = "def add(a, b):"


def _engine(tiny, **kw):
    return tiny_engine(tiny, **{"num_blocks": 16, "max_batch_size": 4, **kw})


@pytest.fixture(scope="module")
def server(tiny):
    srv = InProcessServer(_engine(tiny))
    yield srv
    srv.stop()


@pytest.fixture(autouse=True)
def _nothing_escaped(request):
    """After every test: no exception escaped the app (uvicorn logged none) and nothing is left behind."""
    yield
    if "server" in request.fixturenames:
        srv = request.getfixturevalue("server")
        errors, srv.errors[:] = list(srv.errors), []
        srv.wait_clean()
        assert not errors, [f"{r.getMessage()} {r.exc_info[1]!r}" for r in errors]


def _error(status_body: tuple[int, dict, bytes]) -> tuple[int, dict]:
    status, _, raw = status_body
    body = json.loads(raw)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, raw
    return status, body["error"]


# -- protocol and input ------------------------------------------------------------------------------
@pytest.mark.parametrize("body, words", [
    (b"[" * 100_000, "nested too deeply"),                                   # RecursionError in json.loads
    (b'{"prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "nested too deeply"),
    (b'{"prompt": "x", "model": "\\ud800"}', "lone UTF-16 surrogate"),              # not encodable as UTF-8
    (b'{"\\udfff": 1}', "lone UTF-16 surrogate"),
    (b'{"prompt": "a\\ud800b", "max_tokens": 2}', "lone UTF-16 surrogate"),
    (json.dumps({"prompt": "x", "stop": [f"s{i}" for i in range(65)]}).encode(), "at most 64 stop strings"),
    (json.dumps({"prompt": "x", "stop_token_ids": [5] * 1025}).encode(), "at most 1024 stop_token_ids"),
    (b'{"prompt": "x", "logprobs": 21}', "between 0 and 20 alternatives"),
    (b'{"prompt": "x", "echo": "yes"}', "echo must be a boolean"),
    (b'{"prompt": "x", "presence_penalty": 0.5}', "presence_penalty=0.5 is not supported"),
], ids=["deep list", "deep prompt", "surrogate model", "surrogate field", "surrogate prompt", "65 stops",
        "1025 stop ids", "logprobs", "echo", "presence_penalty"])
def test_hostile_bodies_get_a_400_that_names_the_problem(server, body, words):
    status, err = _error(server.request("POST", "/v1/completions", body))
    assert status == 400 and words in err["message"], err


CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("path, body, param, words", [
    ("/v1/completions", {"prompt": "x", "max_tokens": "4"}, "max_tokens", "max_tokens must be an int"),
    ("/v1/completions", {"prompt": "x", "stop": ["a", 5]}, "stop", "stop[1] must be a string"),
    ("/v1/completions", {"prompt": [1, 99999]}, "prompt", "vocabulary"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, "top_p", "top_p must be > 0"),
    ("/v1/completions", {"prompt": "x", "user": {"id": 5}}, "user", "user must be a string"),
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": "3"}, "max_completion_tokens",
     "max_completion_tokens must be an int"),
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 600}, "max_completion_tokens",
     "exceed the model's context"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 600}]}, "messages",
     "longer than the model's context"),
], ids=["max_tokens", "stop item", "token id", "top_p", "user", "max_completion_tokens type",
        "max_completion_tokens size", "chat prompt"])
def test_a_refused_field_is_named_in_param(server, path, body, param, words):
    """OpenAI's `param` says which field was wrong, also when the engine's own check refused it,
    and under the name the client used."""
    status, err = _error(server.request("POST", path, body))
    assert status == 400 and err["param"] == param and words in err["message"], err


def test_max_completion_tokens_wins_over_max_tokens(server):
    """OpenAI deprecated max_tokens for max_completion_tokens; a client that sends both means the new
    one (as vLLM reads them)."""
    status, _, raw = server.request("POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2,
                                                                    "max_completion_tokens": 5, "ignore_eos": True})
    assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 5, raw


def test_a_chat_the_models_template_refuses_is_a_400_with_its_words(tiny):
    """A real checkpoint's chat template (jinja) may refuse a conversation, as Llama 2's does when
    roles do not alternate; that is the client's mistake, not a server error."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from inflight import LLMEngine
    from inflight.model.tokenizer import HFTokenizer

    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())  # 256 bytes + </s>: the tiny model's vocabulary size
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    bpe.train_from_iterator(["def f(x):\n"], tokenizers.trainers.BpeTrainer(
        vocab_size=257, special_tokens=["</s>"], initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="</s>")
    hf.chat_template = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}"
                        "{% endif %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}assistant: ")
    srv = InProcessServer(LLMEngine(tiny[0], tokenizer=HFTokenizer(hf), block_size=16, num_blocks=16))
    try:
        one = [{"role": "user", "content": "hi"}]
        status, _, raw = srv.request("POST", "/v1/chat/completions", {"messages": one, "max_tokens": 2})
        assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 2, raw
        status, err = _error(srv.request("POST", "/v1/chat/completions", {"messages": one * 2, "max_tokens": 2}))
        assert status == 400 and err["param"] == "messages" and "roles must alternate" in err["message"], err
        srv.wait_clean()
    finally:
        srv.stop()
    assert not srv.errors, [r.getMessage() for r in srv.errors]


def test_unknown_paths_and_methods_get_openai_errors(server):
    status, err = _error(server.request("GET", "/v1/completions"))
    assert status == 405 and "Method Not Allowed" in err["message"]
    status, err = _error(server.request("POST", "/v1/embeddings", {"input": "x"}))
    assert status == 404 and "Not Found" in err["message"]


def test_fields_sent_with_their_neutral_value_are_accepted(server):
    """Clients (LangChain, `vllm bench serve`, …) send OpenAI's optional fields with values that
    change nothing; those must not be refused as unknown."""
    neutral = {"logprobs": None, "echo": False, "best_of": 1, "suffix": None, "logit_bias": {},
               "frequency_penalty": 0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "n": None,
               "stream": None, "top_k": -1, "min_tokens": 0}
    status, _, raw = server.request("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 3, **neutral})
    assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 3, raw
    chat = {"logprobs": False, "top_logprobs": None, "tools": None, "response_format": {"type": "text"}}
    status, _, raw = server.request("POST", "/v1/chat/completions",
                                    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **chat})
    assert status == 200, raw


def test_a_chat_without_max_tokens_gets_what_the_pool_can_hold(server):
    """The `openai` client sends no max_tokens by default; on a pool smaller than the context the
    answer must fit the pool, not be refused as one that could never finish."""
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="x", timeout=WAIT_S, max_retries=0)
    out = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "hi"}])
    assert out.choices[0].finish_reason in ("stop", "length") and out.usage.completion_tokens >= 1
    assert out.usage.prompt_tokens + out.usage.completion_tokens <= 16 * 16 + 1


def test_a_client_that_leaves_mid_upload_is_not_a_server_error(server):
    for _ in range(3):
        s = server.connect()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 500\r\n\r\n{\"prompt\": \"abc\", ")
        s.close()
    time.sleep(1.0)  # (the autouse check then finds nothing logged)
    assert server.request("GET", "/health")[0] == 200


def test_a_huge_chunked_upload_is_cut_off_with_413(server):
    s = server.connect()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
              b"Content-Type: application/json\r\n\r\n")
    piece = b"a" * 65536
    try:
        for _ in range(40):
            s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
    except OSError:
        pass  # (the server answered and closed while we were still sending)
    status, err = _error(parse_response(read_until(s, b"}}")))  # (the upload is unfinished: no close to wait for)
    s.close()
    assert status == 413 and "over the limit" in err["message"]


# -- streaming correctness ---------------------------------------------------------------------------
@pytest.mark.parametrize("prompt, seed", [("# 日本語\n", 3), ("déf ü(x):", 7)])
def test_sampled_multibyte_text_is_the_same_streamed_whole_and_offline(server, tiny, prompt, seed):
    """Seeded sampling at a high temperature makes the byte-level model write multi-byte characters
    and invalid bytes; a stop string cut from that text straddles them."""
    from inflight import SamplingParams

    kw = {"max_tokens": 40, "temperature": 4.0, "seed": seed}
    alone = _engine(tiny).generate([prompt], SamplingParams(**kw), use_tqdm=False)[0].text
    assert any(ord(c) > 127 for c in alone)  # (the case this test is about)
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="x", timeout=WAIT_S, max_retries=0)
    stop = next(alone[i:i + 2] for i in range(3, len(alone)) if ord(alone[i]) > 127)
    for extra, want, reason in (({}, alone, "length"), ({"stop": [stop]}, alone[:alone.index(stop)], "stop")):
        whole = client.completions.create(model=server.model, prompt=prompt, **kw, **extra)
        chunks = list(client.completions.create(model=server.model, prompt=prompt, stream=True, **kw, **extra))
        assert whole.choices[0].text == "".join(c.choices[0].text for c in chunks) == want
        assert whole.choices[0].finish_reason == chunks[-1].choices[0].finish_reason == reason


# -- back-pressure -----------------------------------------------------------------------------------
def test_a_burst_cannot_overshoot_max_waiting(tiny):
    """Twelve requests arrive together while the engine is busy in a step: with --max-waiting 2
    exactly two are queued and ten refused (each handler must count the ones admitted just before it)."""
    engine = _engine(tiny, max_batch_size=1)
    gate, step = threading.Event(), engine.step
    engine.step = lambda: (gate.wait(WAIT_S), step())[1]
    srv = InProcessServer(engine, max_waiting=2)
    try:
        body = json.dumps({"prompt": PROMPT, "max_tokens": 4, "stream": True}).encode()
        socks = [srv.connect() for _ in range(12)]
        req = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" \
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        for s in socks:
            s.sendall(req)
        codes = [read_until(s, b"\r\n").split(b" ")[1] for s in socks]
        assert sorted(codes) == [b"200"] * 2 + [b"503"] * 10, codes
        gate.set()
        for s in socks:  # (the two queued ones are aborted as their clients leave)
            s.close()
        srv.wait_clean()
    finally:
        gate.set()
        srv.stop()
    assert not srv.errors


# -- the command line --------------------------------------------------------------------------------
@pytest.mark.parametrize("args, words", [
    (["--max-waiting", "0"], "--max-waiting must be >= 1"),        # (served, and refused every request)
    (["--max-body-bytes", "0"], "--max-body-bytes must be >= 1"),  # (served, and answered every request 413)
    (["--api-key="], "--api-key must not be empty"),               # (served, behind a key no client sends)
    (["--port", "99999"], "--port must be between 0 and 65535"),   # (OverflowError traceback)
    (["--host", "256.1.1.1"], "cannot listen on 256.1.1.1:0"),     # (socket.gaierror traceback)
    (["--num-blocks", "0"], "num_blocks must be >= 1"),            # (the engine's own words, without a traceback)
], ids=["max-waiting", "max-body-bytes", "api-key", "port", "host", "num-blocks"])
def test_a_server_that_could_serve_nothing_does_not_start(args, words):
    import subprocess
    import sys

    from serve_helpers import ROOT

    proc = subprocess.run([sys.executable, "-m", "inflight.serve", "--port", "0", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=WAIT_S)
    assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "serving" not in proc.stdout
