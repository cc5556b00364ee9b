"""What clients and routers that nobody here wrote send, and what they expect back: fields the server
does not know (accepted, logged once, counted), the fields of the field table (honoured, accepted, or
refused unless neutral: each decision tried), `vllm-router`'s exact bodies, OpenAI's model retrieval,
chat histories from agent frameworks, roles, `refusal`, and the JSON 400 for bytes that are not HTTP.
The app runs in this process on a real loopback socket (`InProcessServer`)."""
from __future__ import annotations

import json
import logging

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from serve_helpers import WAIT_S, InProcessServer, parse_response, read_all, tiny_engine  # noqa: E402

from inflight.serve import fields  # noqa: E402

CHAT = [{"role": "user", "content": "hi"}]
# what vllm-router 0.1.17 forwards (recorded from a worker that logged the bodies it received)
ROUTER_COMPLETION = {"model": "inflight-tiny", "prompt": "hi", "max_tokens": 3, "stream": False, "echo": False,
                     "no_stop_trim": False, "ignore_eos": False, "skip_special_tokens": True,
                     "return_hidden_states": False}
ROUTER_CHAT = {"model": "inflight-tiny", "messages": CHAT, "stream": False, "max_tokens": 3, "logprobs": False,
               "no_stop_trim": False, "ignore_eos": False, "continue_final_message": False,
               "skip_special_tokens": True, "separate_reasoning": True, "stream_reasoning": True,
               "return_hidden_states": False, "include_reasoning": True}


@pytest.fixture(scope="module")
def server(tiny):
    srv = InProcessServer(tiny_engine(tiny, num_blocks=16, max_batch_size=4))
    yield srv
    srv.stop()
    assert not srv.errors, [r.getMessage() for r in srv.errors]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="x", timeout=WAIT_S, max_retries=0)


def _post(server, path: str, body: dict) -> tuple[int, dict]:
    status, _, raw = server.request("POST", path, body)
    return status, json.loads(raw)


def test_unknown_fields_are_accepted_logged_once_and_counted(server, caplog):
    body = {"prompt": "x", "max_tokens": 2, "frobnicate": 1, "stream": True,
            "stream_options": {"include_usage": True, "include_obfuscation": False}}
    before = server.metric("request_ignored_fields_total", field="frobnicate")
    with caplog.at_level(logging.WARNING, logger="inflight.serve"):
        for _ in range(3):
            status, _, raw = server.request("POST", "/v1/completions", body)
            assert status == 200 and raw.endswith(b"data: [DONE]\n\n"), raw
    lines = [r.getMessage() for r in caplog.records if r.name == "inflight.serve"]
    assert len(lines) == 1 and "'frobnicate', 'stream_options.include_obfuscation'" in lines[0], lines
    assert server.metric("request_ignored_fields_total", field="frobnicate") == before + 3
    assert server.metric("request_ignored_fields_total", field="stream_options.include_obfuscation") >= 3


def test_invented_field_names_cannot_grow_the_metrics_without_bound(server):
    for i in range(4):
        body = {"prompt": "x", "max_tokens": 1, **{f"f{i}_{k}": k for k in range(40)}, "x" * 200: 1}
        assert _post(server, "/v1/completions", body)[0] == 200
    names = {k for k in server.metrics() if k.startswith("inflight:request_ignored_fields_total")}
    assert len(names) <= 101 and server.metric("request_ignored_fields_total", field="other") >= 60


@pytest.mark.parametrize("path, body", [("/v1/completions", ROUTER_COMPLETION), ("/v1/chat/completions", ROUTER_CHAT)],
                         ids=["completion", "chat"])
def test_vllm_routers_bodies_are_answered(server, path, body):
    for stream in (False, True):
        status, _, raw = server.request("POST", path, {**body, "stream": stream})
        assert status == 200, raw
        assert (b"data: [DONE]" in raw) if stream else json.loads(raw)["usage"]["completion_tokens"] == 3


OPENAI_DEFAULTS = {"store": [False, True, None], "metadata": [{"run": "7"}, None], "parallel_tool_calls": [True, None],
                   "service_tier": ["auto", None], "reasoning_effort": ["low", None], "modalities": [["text"], None],
                   "prediction": [{"type": "content", "content": "hi"}, None], "user": ["u1", None],
                   "tool_choice": ["none", "auto", None], "tools": [[], None], "safety_identifier": ["s", None],
                   "prompt_cache_key": ["k", None], "include_reasoning": [False, None]}


@pytest.mark.parametrize("name", sorted(OPENAI_DEFAULTS))
def test_fields_frameworks_forward_by_default_are_accepted(server, name):
    for value in OPENAI_DEFAULTS[name]:
        status, out = _post(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, name: value})
        assert status == 200, out


@pytest.mark.parametrize("body, param, words", [
    ({"store": "yes"}, "store", "store must be a boolean, got a string"),
    ({"metadata": {"a": 1}}, "metadata", "metadata.a must be a string, got an integer"),
    ({"skip_special_tokens": 0}, "skip_special_tokens", "skip_special_tokens must be a boolean"),
    ({"stream_options": {"include_usage": "y"}, "stream": True}, "stream_options", "include_usage must be a boolean"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "it calls no tools"),
    ({"tool_choice": "required"}, "tool_choice", "it calls no tools"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format",
     "it does not constrain the output"),
    ({"response_format": {"type": "json_object"}}, "response_format", "is not supported"),
    ({"modalities": ["text", "audio"]}, "modalities", "it writes text only"),
    ({"no_stop_trim": True}, "no_stop_trim", "the text ends before a stop string"),
    ({"return_hidden_states": True}, "return_hidden_states", "not hidden states"),
    ({"top_logprobs": 3}, "top_logprobs", "needs logprobs: true"),
    ({"cache_salt": "s"}, "cache_salt", "no salts"),
    ({"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message", "cannot both be true"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
     "messages", "messages[0].content[0] has type 'image_url': this model reads text parts only"),
    ({"messages": [{"role": "user|>\n<|assistant", "content": "x"}]}, "messages", "does not know"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]}, "messages", "does not know"),
    ({"messages": [{"role": "user", "content": None}]}, "messages", "only an assistant's may be null"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]}, "messages",
     "calls no tools"),
], ids=lambda v: v if isinstance(v, str) and " " not in v else None)
def test_known_fields_are_checked_and_what_cannot_be_done_is_refused(server, body, param, words):
    status, out = _post(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, **body})
    assert status == 400 and out["error"]["param"] == param and words in out["error"]["message"], out


def test_every_neutral_value_of_the_table_is_accepted_and_every_row_is_decided():
    """The table itself: one decision per field and endpoint, known words for it, neutral values
    where (and only where) a field is accepted only with them."""
    seen = set()
    for p in fields.FIELDS:
        for endpoint in p.endpoints:
            assert (p.name, endpoint) not in seen, p.name
            seen.add((p.name, endpoint))
        assert p.does in (fields.HONOURED, fields.ACCEPTED, fields.NEUTRAL_ONLY) and p.openai and p.vllm and p.ours
        assert bool(p.neutral) == (p.does == fields.NEUTRAL_ONLY), p.name
        for value in p.neutral:
            if value is not None:
                fields.neutral_check(p)(value)
    header, rows = fields.field_table()
    assert len(rows) == len(fields.FIELDS) and header[0] == "field"


def test_neutral_values_pass_through_the_server(server):
    for endpoint, path, base in (("completions", "/v1/completions", {"prompt": "x"}),
                                 ("chat", "/v1/chat/completions", {"messages": CHAT})):
        neutral = {name: p.neutral[-1] for name, p in fields.fields_for(endpoint).items() if p.neutral}
        status, out = _post(server, path, {**base, "max_tokens": 2, **neutral})
        assert status == 200, (endpoint, out)


def test_skip_special_tokens_is_honoured(server, client):
    """The tiny model ends a finished function with end-of-text at once; told to ignore it, it writes
    end-of-text into the text only when special tokens are not skipped."""
    prompt = "def f():\n    pass\n"
    kw = {"max_tokens": 20, "extra_body": {"ignore_eos": True}}
    skipped = client.completions.create(model=server.model, prompt=prompt, **kw).choices[0].text
    kept = client.completions.create(model=server.model, prompt=prompt, **{
        **kw, "extra_body": {"ignore_eos": True, "skip_special_tokens": False}}).choices[0].text
    assert "<|endoftext|>" in kept and "<|endoftext|>" not in skipped
    assert kept.replace("<|endoftext|>", "") == skipped
    # the end-of-text that ends a request is not text either way (as vLLM leaves it out)
    ended = client.completions.create(model=server.model, prompt=prompt, max_tokens=20,
                                      extra_body={"skip_special_tokens": False})
    assert ended.choices[0].finish_reason == "stop" and ended.choices[0].text == ""


def test_models_retrieve_and_a_trailing_slash(server, client):
    card = client.models.retrieve(server.model)
    assert card.id == server.model and card.object == "model"
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-9")
    assert err.value.body["code"] == "model_not_found" and "gpt-9" in err.value.body["message"]
    status, headers, raw = server.request("GET", "/v1/models/")
    assert status == 200 and json.loads(raw)["data"][0]["id"] == server.model, (status, headers)


def test_a_tool_call_free_agent_history_with_null_content_works(server, client):
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
               {"role": "assistant", "content": None}, {"role": "user", "content": [{"type": "text", "text": "again"}]}]
    out = client.chat.completions.create(model=server.model, messages=history, max_tokens=3)
    assert out.usage.completion_tokens == 3 and out.choices[0].message.refusal is None
    status, body = _post(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2})
    assert status == 200 and body["choices"][0]["message"] == {"role": "assistant", "refusal": None,
                                                               "content": body["choices"][0]["message"]["content"]}


def test_continue_final_message_leaves_the_last_message_open(server, tiny):
    from inflight.serve.protocol import render_chat

    tok = tiny[1]
    msgs = [{"role": "user", "content": "write f"}, {"role": "assistant", "content": "def f("}]
    want = tok.encode_prompt("<|user|>\nwrite f\n<|assistant|>\ndef f(")
    assert tok.encode_prompt(render_chat(msgs, tok, continue_final_message=True)) == want
    status, body = _post(server, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "continue_final_message":
                                                          True, "add_generation_prompt": False})
    assert status == 200 and body["usage"]["prompt_tokens"] == len(want), body
    status, body = _post(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2,
                                                          "add_generation_prompt": False})
    assert body["usage"]["prompt_tokens"] == len(tok.encode_prompt("<|user|>\nhi\n")), body


@pytest.mark.parametrize("raw", [b"GARBAGE\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: x\r\n\r\n",
                                 b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"],
                         ids=["request line", "content-length", "chunk size"])
def test_bytes_that_are_not_http_get_a_json_400(server, raw):
    s = server.connect()
    s.sendall(raw)
    status, headers, body = parse_response(read_all(s))
    s.close()
    assert status == 400 and headers["content-type"] == "application/json", (headers, body)
    err = json.loads(body)["error"]
    assert "Invalid HTTP request" in err["message"] and set(err) == {"message", "type", "param", "code"}


def test_every_answer_shape_is_its_documented_model():
    """The dicts the server writes validate against the models /openapi.json describes them with
    (which forbid keys they do not declare), every kind of chunk included."""
    from inflight.serve import responses as r

    u = r.usage(3, 2)
    cases = [(r.CompletionResponse, r.completion_object("c", "m", 1, "hi", "length", u)),
             (r.ChatCompletionResponse, r.chat_object("c", "m", 1, "hi", "stop", u)),
             (r.CompletionChunk, r.completion_object("c", "m", 1, "h", None, chunk=True)),
             (r.CompletionChunk, r.completion_object("c", "m", 1, None, None, u, chunk=True)),
             (r.ChatCompletionChunk, r.chat_object("c", "m", 1, "", None, chunk=True, role=True)),
             (r.ChatCompletionChunk, r.chat_object("c", "m", 1, "h", None, chunk=True)),
             (r.ChatCompletionChunk, r.chat_object("c", "m", 1, None, "length", chunk=True)),
             (r.ChatCompletionChunk, r.chat_object("c", "m", 1, None, None, u, chunk=True)),
             (r.ErrorResponse, r.error_body("bad", param="x")),
             (r.ModelList, {"object": "list", "data": [r.model_card("m", 1, 512)]})]
    for model, obj in cases:
        model.model_validate(obj, strict=True)
        assert json.loads(r.sse(obj).removeprefix("data: ")) == obj


def test_the_openapi_document_describes_the_bodies(server):
    status, _, raw = server.request("GET", "/openapi.json")
    doc = json.loads(raw)
    assert status == 200 and doc["openapi"].startswith("3.")
    schemas = doc["components"]["schemas"]
    completion = schemas["CompletionRequest"]
    assert set(completion["properties"]) == set(fields.fields_for("completions")) and completion["required"] == ["prompt"]
    # (each field's decision, in the table's words)
    assert completion["properties"]["logprobs"]["description"] == fields.fields_for("completions")["logprobs"].here()
    assert schemas["ChatMessage"]["properties"]["role"]["enum"] == ["system", "developer", "user", "assistant"]
    post = doc["paths"]["/v1/chat/completions"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletionRequest")
    assert {"200", "400", "404", "413", "500", "503"} <= set(post["responses"])
    assert set(doc["paths"]) == {"/health", "/metrics", "/v1/models", "/v1/models/{model}", "/v1/completions",
                                 "/v1/chat/completions"}
