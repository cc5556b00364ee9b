"""`n` choices and log-probabilities over HTTP, driven by the `openai` client (a client no one here
wrote): choices with `index`, streamed chunks carrying it, usage counting every sample's tokens;
`logprobs` in completions (OpenAI's legacy lists, `echo` with the prompt's) and in chat
(`logprobs: true` + `top_logprobs`), whole and streamed, equal to the engine's own; bad values a
400 naming the field. The app runs in this process on a real loopback socket (`InProcessServer`)."""
from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from serve_helpers import WAIT_S, InProcessServer, tiny_engine  # noqa: E402

from inflight import LLMEngine, SamplingParams, checks  # noqa: E402

PROMPT = "def add(a, b):"
CHAT = [{"role": "user", "content": "Write a function."}]


@pytest.fixture(scope="module")
def server(tiny):
    srv = InProcessServer(tiny_engine(tiny, num_blocks=48, max_batch_size=8))
    yield srv
    srv.stop()
    assert not srv.errors, [r.getMessage() for r in srv.errors]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="x", timeout=WAIT_S, max_retries=0)


def offline(tiny, prompt, **kw):
    model, tok = tiny
    return LLMEngine(model, tokenizer=tok, block_size=16, num_blocks=48).generate(
        [prompt], SamplingParams(**kw), use_tqdm=False)[0]


def prompt_ids(tiny, prompt):
    """The prompt's token ids as the server makes them (the model's BOS first)."""
    return checks.prompt(prompt, tiny[0].config.vocab_size, tiny[1])


def _by_index(chunks, chat=False):
    texts = {}
    for c in chunks:
        for ch in c.choices:
            piece = (ch.delta.content or "") if chat else ch.text
            texts[ch.index] = texts.get(ch.index, "") + piece
    return texts


def test_n_choices_whole_and_streamed(server, client, tiny):
    kw = dict(model=server.model, prompt=PROMPT, max_tokens=12, n=4, temperature=1.0, seed=7,
              extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw)
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    assert whole.usage.completion_tokens == 4 * 12 and whole.usage.prompt_tokens == len(prompt_ids(tiny, PROMPT))
    engine = offline(tiny, PROMPT, n=4, max_tokens=12, temperature=1.0, seed=7, ignore_eos=True)
    assert [c.text for c in whole.choices] == [o.text for o in engine.outputs]
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert _by_index(chunks) == {c.index: c.text for c in whole.choices}, "each chunk carries its choice's index"
    assert all(len(c.choices) <= 1 for c in chunks)
    assert chunks[-1].usage.completion_tokens == 48 and not chunks[-1].choices
    ends = [(ch.index, ch.finish_reason) for c in chunks for ch in c.choices if ch.finish_reason]
    assert sorted(ends) == [(i, "length") for i in range(4)]


def test_greedy_choices_equal_each_other_and_n1(server, client):
    one = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=10)
    many = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=10, n=3)
    assert [c.text for c in many.choices] == [one.choices[0].text] * 3


def test_chat_n_whole_and_streamed(server, client):
    kw = dict(model=server.model, messages=CHAT, max_tokens=8, n=3, temperature=1.0, seed=2)
    whole = client.chat.completions.create(**kw)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    roles = [ch.index for c in chunks for ch in c.choices if ch.delta.role == "assistant"]
    assert roles == [0, 1, 2], "every choice opens with the assistant's role"
    assert _by_index(chunks, chat=True) == {c.index: c.message.content for c in whole.choices}
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens, "the same seeded samples"
    assert 3 <= whole.usage.completion_tokens <= 3 * 8, "every sample's tokens are counted"


def test_completion_logprobs_are_the_engines_and_greedy_is_the_top(server, client, tiny):
    out = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=10, logprobs=3)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 10
    assert "".join(lp.tokens) == out.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(10)]
    for value, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert value == max(top.values()) and len(top) <= 3  # greedy: the token is the most likely
    engine = offline(tiny, PROMPT, max_tokens=10, logprobs=3).outputs[0]
    assert lp.token_logprobs == pytest.approx([e[t].logprob for t, e in zip(engine.token_ids, engine.logprobs)],
                                              abs=1e-5)


def test_sampled_logprobs_list_the_token_besides_the_top_k(server, client):
    out = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=30, logprobs=1, temperature=3.0,
                                    seed=9)
    lp = out.choices[0].logprobs
    assert any(v < max(top.values()) for v, top in zip(lp.token_logprobs, lp.top_logprobs)), "some unlikely token"
    assert all(tok in top for tok, top in zip(lp.tokens, lp.top_logprobs))


def test_streamed_logprobs_add_up_to_the_whole_answer(server, client):
    kw = dict(model=server.model, prompt=PROMPT, max_tokens=9, logprobs=2, n=2, temperature=1.0, seed=4)
    whole = client.completions.create(**kw)
    got = {}
    for c in client.completions.create(**kw, stream=True):
        for ch in c.choices:
            if ch.logprobs is not None:
                g = got.setdefault(ch.index, {"tokens": [], "token_logprobs": [], "text_offset": []})
                for key in g:
                    g[key] += getattr(ch.logprobs, key)
    for c in whole.choices:
        assert got[c.index]["tokens"] == c.logprobs.tokens
        assert got[c.index]["token_logprobs"] == pytest.approx(c.logprobs.token_logprobs, abs=1e-6)
        assert got[c.index]["text_offset"] == c.logprobs.text_offset, "offsets run on from chunk to chunk"


def test_echo_returns_the_prompt_and_its_logprobs(server, client, tiny):
    out = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=1, echo=True, logprobs=1)
    choice = out.choices[0]
    ids = prompt_ids(tiny, PROMPT)
    assert choice.text.startswith(PROMPT) and len(choice.logprobs.tokens) == len(ids) + 1
    assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.top_logprobs[0] is None
    engine = offline(tiny, PROMPT, max_tokens=1, prompt_logprobs=1)
    want = [None] + [e[t].logprob for t, e in zip(ids[1:], engine.prompt_logprobs[1:])]
    assert choice.logprobs.token_logprobs[:len(ids)] == pytest.approx(want, abs=1e-5)
    # what lm-evaluation-harness reads for a log-likelihood: the continuation's tokens after the context
    assert math.isfinite(sum(choice.logprobs.token_logprobs[1:len(ids)]))
    plain = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=3, echo=True)
    assert plain.choices[0].text.startswith(PROMPT) and plain.choices[0].logprobs is None
    chunks = list(client.completions.create(model=server.model, prompt=PROMPT, max_tokens=3, echo=True, stream=True))
    assert "".join(ch.text for c in chunks for ch in c.choices) == plain.choices[0].text


def test_chat_logprobs_whole_and_streamed(server, client):
    kw = dict(model=server.model, messages=CHAT, max_tokens=6, logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kw)
    content = whole.choices[0].logprobs.content
    assert "".join(t.token for t in content) == whole.choices[0].message.content and len(content) == 6
    for t in content:
        assert len(t.top_logprobs) == 2 and t.logprob == t.top_logprobs[0].logprob  # greedy: the top one
        assert t.bytes == list(t.token.encode()) and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
    streamed = [t for c in client.chat.completions.create(**kw, stream=True) for ch in c.choices
                if ch.logprobs is not None for t in ch.logprobs.content]
    assert [(t.token, round(t.logprob, 5)) for t in streamed] == [(t.token, round(t.logprob, 5)) for t in content]
    bare = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=3, logprobs=True)
    assert all(t.top_logprobs == [] for t in bare.choices[0].logprobs.content)
    assert client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=3).choices[0].logprobs is None


@pytest.mark.parametrize("path, body, param, words", [
    ("/v1/completions", {"n": 0}, "n", "n must be >= 1"),
    ("/v1/completions", {"n": 9}, "n", "more than max_batch_size (8)"),
    ("/v1/completions", {"n": 8, "max_tokens": 200, "ignore_eos": True}, "n", "more than the whole pool"),
    ("/v1/completions", {"n": "2"}, "n", "n must be an integer"),
    ("/v1/completions", {"logprobs": 21}, "logprobs", "between 0 and 20"),
    ("/v1/completions", {"logprobs": True}, "logprobs", "logprobs must be an integer"),
    ("/v1/completions", {"echo": 1}, "echo", "echo must be a boolean"),
    ("/v1/chat/completions", {"logprobs": 2}, "logprobs", "logprobs must be a boolean"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "between 0 and 20"),
    ("/v1/chat/completions", {"n": 9}, "n", "more than max_batch_size"),
])
def test_bad_values_are_400s_naming_the_field(server, path, body, param, words):
    base = {"prompt": "x"} if path.endswith("/completions") and "chat" not in path else {"messages": CHAT}
    status, _, raw = server.request("POST", path, {**base, "max_tokens": 4, **body})
    err = json.loads(raw)["error"]
    assert status == 400 and err["param"] == param and words in err["message"], err


def test_a_chat_of_n_samples_defaults_to_what_they_can_hold_together(server, client):
    out = client.chat.completions.create(model=server.model, messages=CHAT, n=8, temperature=1.0, seed=1,
                                         extra_body={"ignore_eos": True})
    assert len(out.choices) == 8 and {c.finish_reason for c in out.choices} == {"length"}
    server.wait_idle()
    assert server.engine.allocator.num_used == 0


def test_answers_with_choices_and_logprobs_are_their_documented_models():
    """The shapes with several choices and log-probabilities validate against the models
    /openapi.json describes them with (which forbid keys they do not declare)."""
    from inflight.serve import responses as r

    legacy = {"tokens": ["a", "b"], "token_logprobs": [None, -0.5], "top_logprobs": [None, {"b": -0.5, "c": -1.0}],
              "text_offset": [0, 1]}
    chat = [{"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": [{"token": "a", "logprob": -0.1,
                                                                              "bytes": [97]}]}]
    u = r.usage(3, 4)
    cases = [(r.CompletionResponse, r.completion_object("c", "m", 1, None, None, u, choices=[
                 r.completion_choice(0, "ab", "length", legacy), r.completion_choice(1, "x", "stop")])),
             (r.CompletionChunk, r.completion_object("c", "m", 1, "b", None, chunk=True, index=3, logprobs=legacy)),
             (r.ChatCompletionResponse, r.chat_object("c", "m", 1, None, None, u, choices=[
                 r.chat_choice(0, "a", "stop", chat), r.chat_choice(1, "b", "length")])),
             (r.ChatCompletionChunk, r.chat_object("c", "m", 1, "a", None, chunk=True, index=2, logprobs=chat)),
             (r.ChatCompletionChunk, r.chat_object("c", "m", 1, "", None, chunk=True, role=True, index=1))]
    for model, obj in cases:
        model.model_validate(obj, strict=True)
        assert json.loads(r.sse(obj).removeprefix("data: ")) == obj
