"""The OpenAI API's response bodies: the dicts the server writes (which the `openai` client parses)
and the pydantic models that describe them in the OpenAPI document (`/openapi.json`). The models
forbid extra keys, so a contract tester that checks the server's answers against them (and the
tests that check every builder here against its model) catch a key the description lacks."""
from __future__ import annotations

import json
import time
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict

__all__ = ["ErrorResponse", "CompletionResponse", "ChatCompletionResponse", "CompletionChunk", "ChatCompletionChunk",
           "ModelCard", "ModelList", "error_body", "usage", "completion_object", "completion_choice", "chat_object",
           "chat_choice", "model_card", "sse",
           "SSE_DONE", "now"]

FinishReason = Optional[Literal["stop", "length", "abort", "error"]]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorInfo(_Closed):
    message: str
    type: str
    param: Optional[str]
    code: Optional[Union[str, int]]


class ErrorResponse(_Closed):
    """OpenAI's error object: every error this server answers has this shape."""

    error: ErrorInfo


class Usage(_Closed):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(_Closed):
    """OpenAI's legacy log-probabilities of a completion's tokens (the prompt's too with echo: its
    first token has none)."""

    tokens: list[str]
    token_logprobs: list[Optional[float]]
    top_logprobs: list[Optional[dict[str, float]]]
    text_offset: list[int]


class CompletionChoice(_Closed):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs]
    finish_reason: FinishReason


class CompletionResponse(_Closed):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage]


class CompletionChunk(CompletionResponse):
    """One Server-Sent Event of a streamed completion (`usage` only in the last, or in every one
    with `stream_options.continuous_usage_stats`)."""

    usage: Optional[Usage] = None


class TopLogprob(_Closed):
    token: str
    logprob: float
    bytes: Optional[list[int]]


class TokenLogprob(TopLogprob):
    """One token of a chat answer with its log-probability and the most likely alternatives."""

    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Closed):
    content: Optional[list[TokenLogprob]]
    refusal: None = None


class AssistantMessage(_Closed):
    role: Literal["assistant"]
    content: Optional[str]
    refusal: None  # (OpenAI's schema requires it, nullable: this server never refuses)


class ChatChoice(_Closed):
    index: int
    message: AssistantMessage
    logprobs: Optional[ChatLogprobs]
    finish_reason: FinishReason


class ChatCompletionResponse(_Closed):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Optional[Usage]


class Delta(_Closed):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None


class ChatChunkChoice(_Closed):
    index: int
    delta: Delta
    logprobs: Optional[ChatLogprobs]
    finish_reason: FinishReason


class ChatCompletionChunk(_Closed):
    """One Server-Sent Event of a streamed chat completion (the first carries the role)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None


class ModelCard(_Closed):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    max_model_len: int


class ModelList(_Closed):
    object: Literal["list"]
    data: list[ModelCard]


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | int | None = None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_object(request_id: str, model: str, created: int, text: str | None, finish_reason: str | None,
                      usage_: dict | None = None, chunk: bool = False, index: int = 0, logprobs: dict | None = None,
                      choices: list[dict] | None = None) -> dict:
    """A text completion, or one of its stream chunks (`text` is then the new text) — of choice
    `index`, or of every choice (`choices`, from `completion_choice`)."""
    if choices is None:
        choices = [] if text is None else [completion_choice(index, text, finish_reason, logprobs)]
    out = {"id": request_id, "object": "text_completion", "created": created, "model": model, "choices": choices}
    if usage_ is not None or not chunk:
        out["usage"] = usage_
    return out


def completion_choice(index: int, text: str, finish_reason: str | None, logprobs: dict | None = None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_choice(index: int, content: str | None, finish_reason: str | None, logprobs: list | None = None) -> dict:
    """One choice of a whole chat answer (`logprobs`: its `content` entries, when asked for)."""
    return {"index": index, "message": {"role": "assistant", "content": content, "refusal": None},
            "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
            "finish_reason": finish_reason}


def chat_object(request_id: str, model: str, created: int, content: str | None, finish_reason: str | None,
                usage_: dict | None = None, chunk: bool = False, role: bool = False, index: int = 0,
                logprobs: list | None = None, choices: list[dict] | None = None) -> dict:
    """A chat completion, or one of its stream chunks (`content` is then the new text; `role` marks
    the first chunk of a choice, which carries the assistant's role) — of choice `index`, or of
    every choice (`choices`, from `chat_choice`)."""
    lp = None if logprobs is None else {"content": logprobs, "refusal": None}
    if chunk:
        delta = {} if content is None and not role else {"role": "assistant", "content": content or ""} if role \
            else {"content": content}
        choices = [] if content is None and finish_reason is None and not role and lp is None else \
            [{"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish_reason}]
        out = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
               "choices": choices}
        if usage_ is not None:
            out["usage"] = usage_
        return out
    return {"id": request_id, "object": "chat.completion", "created": created, "model": model,
            "choices": choices if choices is not None else [chat_choice(index, content, finish_reason, logprobs)],
            "usage": usage_}


def model_card(name: str, created: int, max_model_len: int) -> dict:
    """One entry of /v1/models (and the answer of /v1/models/{model})."""
    return {"id": name, "object": "model", "created": created, "owned_by": "inflight", "root": name,
            "max_model_len": max_model_len}


def sse(obj: dict) -> str:
    """One Server-Sent Event carrying `obj`, as OpenAI writes them."""
    return f"data: {json.dumps(obj, separators=(',', ':'), allow_nan=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def now() -> int:
    return int(time.time())
