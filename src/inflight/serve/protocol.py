"""The OpenAI API's request and response shapes (vLLM's `vllm/entrypoints/openai/protocol.py`, without pydantic).

Requests are plain JSON objects checked here field by field. Sampling fields go straight to
`SamplingParams`, so a bad value gets the engine's own message ("temperature must be >= 0.0, got
-1"); unknown fields, wrong types and non-JSON numbers (NaN) are refused by name. Responses are the
dicts OpenAI's API returns, which the `openai` client parses.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from inflight.engine.sampling import SamplingParams

__all__ = ["RequestError", "GenerationRequest", "parse_json", "completion_request", "chat_request",
           "render_chat", "PLAIN_CHAT_TEMPLATE", "error_body", "usage", "completion_object", "chat_object",
           "sse", "SSE_DONE"]

# the request fields each endpoint takes: OpenAI's, plus vLLM's extensions (ignore_eos, priority,
# stop_token_ids, stream_options.continuous_usage_stats)
_SAMPLING = {"max_tokens", "temperature", "top_p", "seed", "stop", "stop_token_ids", "ignore_eos", "priority"}
_COMMON = _SAMPLING | {"model", "stream", "stream_options", "n", "user"}
COMPLETION_FIELDS = _COMMON | {"prompt"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens"}
#: OpenAI's default `max_tokens` for /v1/completions (chat completions default to the rest of the context)
DEFAULT_COMPLETION_TOKENS = 16
#: the plain chat template of models without one of their own (the tiny model): each message on its
#: own lines after a role tag, then the assistant's tag for the model to continue
PLAIN_CHAT_TEMPLATE = "<|{role}|>\n{content}\n"


class RequestError(Exception):
    """A request the server refuses: an HTTP status and OpenAI's error fields."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type, code

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


@dataclass
class GenerationRequest:
    """A checked request: the prompt (text or token ids), its sampling fields, how to answer."""

    prompt: str | list[int]
    sampling: dict[str, Any]   # SamplingParams keyword arguments (max_tokens may be missing)
    stream: bool
    include_usage: bool        # stream_options.include_usage: a last chunk with the token counts
    continuous_usage: bool     # stream_options.continuous_usage_stats (vLLM): counts in every chunk
    model: str | None

    def params(self, default_max_tokens: int) -> SamplingParams:
        """The SamplingParams (a bad value raises the engine's own ValueError/TypeError)."""
        return SamplingParams(**{"max_tokens": default_max_tokens, **self.sampling})


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | int | None = None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes) -> dict:
    """The request body as a JSON object (malformed JSON, NaN/Infinity and non-objects are refused)."""
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _common(body: dict, allowed: set[str], served_model: str) -> tuple[dict, bool, bool, bool, str | None]:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise RequestError(f"unknown field(s) {', '.join(map(repr, unknown))}; this endpoint takes "
                           f"{', '.join(sorted(allowed))}", param=unknown[0])
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(f"model must be a string, got {type(model).__name__}", param="model")
    if model is not None and model != served_model:
        raise RequestError(f"The model `{model}` does not exist (this server serves `{served_model}`).",
                           param="model", status=404, type="NotFoundError", code="model_not_found")
    n = body.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise RequestError(f"n must be 1 (one completion per request), got {n!r}", param="n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"stream must be a boolean, got {type(stream).__name__}", param="stream")
    options = body.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}:
        raise RequestError("stream_options must be an object with include_usage and/or continuous_usage_stats",
                           param="stream_options")
    if options and not stream:
        raise RequestError("stream_options is only allowed when stream is true", param="stream_options")
    for key in options:
        if not isinstance(options[key], bool):
            raise RequestError(f"stream_options.{key} must be a boolean", param="stream_options")
    sampling = {k: body[k] for k in _SAMPLING if k in body and body[k] is not None}
    return sampling, stream, bool(options.get("include_usage")), bool(options.get("continuous_usage_stats")), model


def completion_request(body: dict, served_model: str) -> GenerationRequest:
    """A /v1/completions body: `prompt` is a string or a list of token ids (one prompt per request)."""
    sampling, stream, usage_, continuous, model = _common(body, COMPLETION_FIELDS, served_model)
    if "prompt" not in body:
        raise RequestError("prompt is required", param="prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise RequestError(f"a batch of {len(prompt)} prompts: send one prompt per request", param="prompt")
    if not isinstance(prompt, (str, list)):
        raise RequestError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}",
                           param="prompt")
    return GenerationRequest(prompt, sampling, stream, usage_, continuous, model)


def chat_request(body: dict, served_model: str) -> tuple[GenerationRequest, list[dict]]:
    """A /v1/chat/completions body, and its messages as [{"role", "content"}] with string contents."""
    sampling, stream, usage_, continuous, model = _common(body, CHAT_FIELDS, served_model)
    if "max_completion_tokens" in body and body["max_completion_tokens"] is not None:
        sampling.setdefault("max_tokens", body["max_completion_tokens"])
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a string role", param="messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise RequestError(f"messages[{i}].content: only text parts are supported", param="messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string, got {type(content).__name__}",
                               param="messages")
        out.append({"role": m["role"], "content": content})
    return GenerationRequest("", sampling, stream, usage_, continuous, model), out


def render_chat(messages: list[dict], tokenizer: Any) -> str | list[int]:
    """The prompt of a chat: the tokenizer's own chat template where it has one (token ids), else
    `PLAIN_CHAT_TEMPLATE` (text)."""
    template = getattr(getattr(tokenizer, "hf", None), "chat_template", None)
    if template:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return "".join(PLAIN_CHAT_TEMPLATE.format(**m) for m in messages) + "<|assistant|>\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_object(request_id: str, model: str, created: int, text: str | None, finish_reason: str | None,
                      usage_: dict | None = None, chunk: bool = False) -> dict:
    """A text completion, or one of its stream chunks (`text` is then the new text)."""
    out = {"id": request_id, "object": "text_completion", "created": created, "model": model,
           "choices": [] if text is None else [{"index": 0, "text": text, "logprobs": None,
                                                "finish_reason": finish_reason}]}
    if usage_ is not None or not chunk:
        out["usage"] = usage_
    return out


def chat_object(request_id: str, model: str, created: int, content: str | None, finish_reason: str | None,
                usage_: dict | None = None, chunk: bool = False, role: bool = False) -> dict:
    """A chat completion, or one of its stream chunks (`content` is then the new text; `role` marks
    the first chunk, which carries the assistant's role)."""
    if chunk:
        delta = {} if content is None and not role else {"role": "assistant", "content": content or ""} if role \
            else {"content": content}
        choices = [] if content is None and finish_reason is None and not role else \
            [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
        out = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
               "choices": choices}
        if usage_ is not None:
            out["usage"] = usage_
        return out
    return {"id": request_id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "logprobs": None,
                         "finish_reason": finish_reason}], "usage": usage_}


def sse(obj: dict) -> str:
    """One Server-Sent Event carrying `obj`, as OpenAI writes them."""
    return f"data: {json.dumps(obj, separators=(',', ':'), allow_nan=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def now() -> int:
    return int(time.time())

