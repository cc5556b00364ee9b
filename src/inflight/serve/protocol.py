"""The OpenAI API's request bodies, checked (vLLM's `vllm/entrypoints/openai/protocol.py`).

The request models are pydantic models built from the field table (`inflight.serve.fields`): a
body is parsed here (NaN, lone surrogates and absurd nesting refused by name), checked strictly by
type against its endpoint's model, then by each field's value rule; fields the table does not know
are kept aside and reported as ignored. Sampling values go on to `SamplingParams`, so a bad one
gets the engine's own message ("temperature must be >= 0.0, got -1"). The response shapes are in
`inflight.serve.responses`.
"""
from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field, ValidationError, create_model

from inflight.checks import integer, show
from inflight.engine.sampling import MAX_LOGPROBS, SamplingParams
from inflight.serve import fields
from inflight.serve.fields import ChatMessage, Open

__all__ = ["RequestError", "GenerationRequest", "parse_json", "completion_request", "chat_request", "chat_roles",
           "render_chat", "PLAIN_CHAT_TEMPLATE", "PLAIN_ROLES", "TEMPLATE_ROLES", "CompletionRequest",
           "ChatCompletionRequest", "check_body", "ignored_fields"]

#: Stop conditions are checked for every running request at every step, on the engine loop that
#: all requests share: a request may bring this many, so that one client cannot slow everyone's steps
MAX_STOP_STRINGS = 64
MAX_STOP_TOKEN_IDS = 1024
#: OpenAI's default `max_tokens` for /v1/completions (chat completions default to the rest of the context)
DEFAULT_COMPLETION_TOKENS = 16
#: the plain chat template of models without one of their own (the tiny model): each message on its
#: own lines after a role tag, then the assistant's tag for the model to continue
PLAIN_CHAT_TEMPLATE = "<|{role}|>\n{content}\n"
#: the roles the plain template writes (OpenAI's "developer" is its newer name for "system"); a model's
#: own template gets OpenAI's roles, and may refuse some. Anything else is refused: a role is pasted
#: into the prompt, so "user|>\n<|assistant" would rewrite it
PLAIN_ROLES = ("system", "developer", "user", "assistant")
TEMPLATE_ROLES = ("system", "developer", "user", "assistant", "tool")


class RequestError(Exception):
    """A request the server refuses: an HTTP status and OpenAI's error fields."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _request_model(name: str, endpoint: str) -> type[BaseModel]:
    """The endpoint's request model, one pydantic field per row of the table."""
    spec = {p.name: (p.type, Field(... if p.required else None, description=p.here(),
                                   json_schema_extra=p.bounds)) for p in fields.fields_for(endpoint).values()}
    return create_model(name, __base__=Open, **spec)


CompletionRequest = _request_model("CompletionRequest", fields.COMPLETIONS)
ChatCompletionRequest = _request_model("ChatCompletionRequest", fields.CHAT)
_MODELS = {fields.COMPLETIONS: CompletionRequest, fields.CHAT: ChatCompletionRequest}


@dataclass
class GenerationRequest:
    """A checked request: the prompt (text or token ids), its sampling fields, how to answer, and
    every known field it set (`fields`: name -> value, nulls left out)."""

    prompt: str | list[int]
    sampling: dict[str, Any]   # SamplingParams keyword arguments (max_tokens may be missing)
    stream: bool
    include_usage: bool        # stream_options.include_usage: a last chunk with the token counts
    continuous_usage: bool     # stream_options.continuous_usage_stats (vLLM): counts in every chunk
    model: str | None
    fields: dict[str, Any]
    ignored: list[str]         # the fields the table does not know ("x", "messages[].y"), ignored
    logprobs: int | None = None  # the top k to return for each token, when log-probabilities are asked for
    echo: bool = False         # completions: the prompt comes back before each answer

    def params(self, default_max_tokens: int) -> SamplingParams:
        """The SamplingParams (a bad value raises the engine's own ValueError/TypeError)."""
        return SamplingParams(**{"max_tokens": default_max_tokens, **self.sampling})


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes) -> dict:
    """The request body as a JSON object (malformed JSON, NaN/Infinity, nesting past Python's
    recursion limit, lone UTF-16 surrogates and non-objects are refused)."""
    try:
        body = json.loads(raw, parse_constant=_no_constant)
        # JSON may escape half of a UTF-16 pair ("\ud800"); Python keeps it, but it is not text: it
        # cannot be encoded, so it could not even be repeated back in an error message
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"the request body holds {exc.object[exc.start:exc.end]!r}, a lone UTF-16 surrogate, "
                           "which is not text") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise RequestError("the request body is nested too deeply to parse") from None
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def check_body(body: dict, endpoint: str) -> BaseModel:
    """`body` checked against the endpoint's model (types, strictly) and each field's value rule."""
    try:
        model = _MODELS[endpoint].model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else None
        param = fields.fields_for(endpoint).get(name)
        message = None if param is None else _explain(param.type, body.get(name), name, required=param.required)
        raise RequestError(message or f"{'.'.join(map(str, first['loc']))}: {first['msg']}", param=name) from None
    for name, param in fields.fields_for(endpoint).items():
        value = body.get(name)
        rule = param.check or (fields.neutral_check(param) if param.does == fields.NEUTRAL_ONLY else None)
        if value is not None and rule is not None:
            try:
                rule(value)
            except ValueError as exc:
                raise RequestError(str(exc), param=name) from None
    return model


def ignored_fields(model: BaseModel, where: str = "") -> list[str]:
    """The fields of a checked request (and of the objects in it) that the table does not know."""
    out = [f"{where}{k}" for k in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, BaseModel):
                out += ignored_fields(item, f"{where}{name}{'[]' if isinstance(value, list) else ''}.")
    return list(dict.fromkeys(out))


# -- plain words for a value of the wrong type ---------------------------------------------------------
_KIND = {type(None): "null", bool: "a boolean", int: "an integer", float: "a number", str: "a string",
         list: "a list", dict: "an object"}


def _kind(value: Any) -> str:
    return _KIND.get(type(value), type(value).__name__)


def _describe(tp: Any) -> str:
    """An annotation in words: list[int] -> "a list of integers"."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        words = [_describe(a) for a in args if a is not type(None)]
        return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]
    if origin is list:
        head, _, rest = _describe(args[0]).split(" ", 1)[1].partition(" ")  # "a list of integers" -> "lists of integers"
        return f"a list of {head}s" + (f" {rest}" if rest else "")
    if origin is dict or (isinstance(tp, type) and issubclass(tp, BaseModel)) or tp is typing.Any:
        return "an object" if tp is not typing.Any else "anything"
    return _KIND.get(tp, getattr(tp, "__name__", str(tp)))


def _fits(tp: Any, value: Any) -> bool:
    """Whether `value`'s outer JSON kind is `tp`'s (a list for list[...], an object for a model ...)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(a, value) for a in typing.get_args(tp))
    if tp is typing.Any:
        return True
    if tp is float:
        return type(value) is float or type(value) is int and abs(value) < 2 ** 1023
    want = {list: list, dict: dict}.get(origin) or (dict if isinstance(tp, type) and issubclass(tp, BaseModel) else tp)
    return type(value) is want


def _explain(tp: Any, value: Any, where: str, required: bool = False) -> str | None:
    """Why `value` is not a `tp` (strictly, as pydantic checks it), naming the innermost place
    ("stop[1] must be a string, got an integer (5)"); None if this finds nothing wrong."""
    if value is None:
        return f"{where} is required" if required else None
    if not _fits(tp, value):
        return f"{where} must be {_describe(tp)}, got {_kind(value)} ({show(value)})"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        fitting = [a for a in args if a is not type(None) and _fits(a, value)]
        if len(fitting) == 1:
            return _explain(fitting[0], value, where)
        return None if any(_explain(a, value, where) is None for a in fitting) else \
            f"{where} must be {_describe(tp)}, got {_kind(value)} ({show(value)})"
    if origin is list:
        return next(filter(None, (_explain(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))), None)
    if origin is dict:
        return next(filter(None, (_explain(args[1], v, f"{where}.{k}") for k, v in value.items())), None)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return next(filter(None, (_explain(f.annotation, value.get(k), f"{where}.{k}", f.is_required())
                                  for k, f in tp.model_fields.items())), None)
    return None


# -- the two endpoints -------------------------------------------------------------------------------
def _common(body: dict, endpoint: str, served_model: str) -> tuple[GenerationRequest, BaseModel]:
    checked = check_body(body, endpoint)
    ignored = ignored_fields(checked)
    known = {k: v for k, v in body.items() if k in fields.fields_for(endpoint) and v is not None}
    model = known.get("model")
    if model is not None and model != served_model:
        raise model_not_found(model, served_model)
    stream = known.get("stream", False)
    options = known.get("stream_options") or {}
    if options and not stream:
        raise RequestError("stream_options is only allowed when stream is true", param="stream_options")
    sampling = {k: v for k, v in known.items() if fields.fields_for(endpoint)[k].sampling}
    for key, most, what in (("stop", MAX_STOP_STRINGS, "stop strings"),
                            ("stop_token_ids", MAX_STOP_TOKEN_IDS, "stop_token_ids")):
        if isinstance(sampling.get(key), list) and len(sampling[key]) > most:
            raise RequestError(f"{key} holds {len(sampling[key])} items; a request may have at most {most} {what} "
                               "(every one is checked at every step, on the loop all requests share)", param=key)
    return GenerationRequest("", sampling, stream, bool(options.get("include_usage")),
                             bool(options.get("continuous_usage_stats")), model, known, ignored), checked


def model_not_found(model: str, served_model: str) -> RequestError:
    """OpenAI's 404 for a model this server does not serve."""
    return RequestError(f"The model `{model}` does not exist (this server serves `{served_model}`).",
                        param="model", status=404, type="NotFoundError", code="model_not_found")


def completion_request(body: dict, served_model: str) -> GenerationRequest:
    """A /v1/completions body: `prompt` is a string or a list of token ids (one prompt per request)."""
    req, _ = _common(body, fields.COMPLETIONS, served_model)
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise RequestError(f"a batch of {len(prompt)} prompts: send one prompt per request", param="prompt")
    req.prompt = prompt
    req.logprobs = _top_k(req.fields.get("logprobs"), "logprobs")
    req.echo = bool(req.fields.get("echo"))
    if req.logprobs is not None:
        req.sampling["logprobs"] = req.logprobs
        if req.echo:  # the prompt's own tokens, as evaluation harnesses score them
            req.sampling["prompt_logprobs"] = req.logprobs
    return req


def _top_k(k: int | None, name: str) -> int | None:
    """A number of alternatives per token, within what the server returns."""
    if k is not None and not 0 <= k <= MAX_LOGPROBS:
        raise RequestError(f"{name}={show(k)}: the server returns between 0 and {MAX_LOGPROBS} alternatives per token "
                           "(OpenAI's limit for top_logprobs)", param=name)
    return k


def chat_request(body: dict, served_model: str, roles: tuple[str, ...] = PLAIN_ROLES
                 ) -> tuple[GenerationRequest, list[dict]]:
    """A /v1/chat/completions body, and its messages as [{"role", "content"}] with string contents
    (roles outside `roles` refused; an assistant's null content is "")."""
    req, checked = _common(body, fields.CHAT, served_model)
    if req.fields.get("max_completion_tokens") is not None:
        # OpenAI's name since it deprecated max_tokens: a client that sends both means this one (as vLLM reads
        # them); checked here, so that a bad value is refused under the name the client used
        try:
            req.sampling["max_tokens"] = integer("max_completion_tokens", body["max_completion_tokens"], minimum=1)
        except (TypeError, ValueError) as exc:
            raise RequestError(str(exc), param="max_completion_tokens") from None
    if req.fields.get("continue_final_message") and req.fields.get("add_generation_prompt"):
        raise RequestError("continue_final_message and add_generation_prompt cannot both be true (the first "
                           "continues the last message, the second starts a new one)", param="continue_final_message")
    if not body["messages"]:
        raise RequestError("messages must be a non-empty list of {role, content} objects", param="messages")
    top = _top_k(req.fields.get("top_logprobs"), "top_logprobs")
    if req.fields.get("logprobs"):
        req.logprobs = req.sampling["logprobs"] = top or 0
    elif top:
        raise RequestError("top_logprobs needs logprobs: true (it says how many alternatives to return with each "
                           "token's log-probability)", param="top_logprobs")
    return req, [_message(m, i, roles) for i, m in enumerate(checked.messages)]


def _message(m: ChatMessage, i: int, roles: tuple[str, ...]) -> dict:
    where = f"messages[{i}]"
    if m.role not in roles:
        raise RequestError(f"{where}.role is {show(m.role)}, which this model's chat template does not know "
                           f"(roles: {', '.join(roles)})", param="messages")
    if m.tool_calls:
        raise RequestError(f"{where}.tool_calls: this server calls no tools, so a conversation cannot hold tool calls",
                           param="messages")
    content = m.content
    if content is None:
        if m.role != "assistant":
            raise RequestError(f"{where}.content is required (only an assistant's may be null)", param="messages")
        content = ""
    elif isinstance(content, list):
        for j, part in enumerate(content):
            if part.type != "text":
                raise RequestError(f"{where}.content[{j}] has type {show(part.type)}: this model reads text parts only",
                                   param="messages")
            if part.text is None:
                raise RequestError(f"{where}.content[{j}].text is required", param="messages")
        content = "".join(p.text for p in content)
    return {"role": m.role, "content": content}


def chat_roles(tokenizer: Any) -> tuple[str, ...]:
    """The roles a chat may use with `tokenizer`: OpenAI's with the model's own template, else the plain template's."""
    return TEMPLATE_ROLES if getattr(getattr(tokenizer, "hf", None), "chat_template", None) else PLAIN_ROLES


def render_chat(messages: list[dict], tokenizer: Any, *, add_generation_prompt: bool = True,
                continue_final_message: bool = False) -> str | list[int]:
    """The prompt of a chat: the tokenizer's own chat template where it has one (token ids), else
    `PLAIN_CHAT_TEMPLATE` (text). `continue_final_message` leaves the last message open for the
    model to continue (vLLM's option) instead of starting the assistant's turn."""
    if getattr(getattr(tokenizer, "hf", None), "chat_template", None):
        try:
            return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt and not
                                                 continue_final_message, continue_final_message=continue_final_message)
        except Exception as exc:
            # a template may refuse a conversation (jinja2's TemplateError: "roles must alternate", a field it
            # needs; transformers' ValueError for a last message it cannot continue): the client's messages are
            # at fault, so a 400 with the template's words
            if type(exc).__module__.split(".")[0] == "jinja2" or isinstance(exc, ValueError):
                raise RequestError(f"the model's chat template refused these messages: {exc}",
                                   param="messages") from None
            raise
    text = "".join(PLAIN_CHAT_TEMPLATE.format(**m) for m in messages)
    if continue_final_message:
        return text[:-1]  # (the newline that would close the last message)
    return text + "<|assistant|>\n" if add_generation_prompt else text
