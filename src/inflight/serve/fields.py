"""Every request field the server knows, decided one by one: what OpenAI's API does with it, what
vLLM does, and what this server does (`FIELDS`, the one table; chapter 9 shows it, from here).

A field is in one of three states here:

- **honoured**: the server does what it asks (`temperature`, `stop`, `skip_special_tokens`, ...);
- **accepted**: any well-typed value is fine because none asks anything of the answer (`user`,
  `store`, `metadata`, a reasoning switch on a model that does not reason);
- **neutral only**: the server cannot do what the field asks, so it accepts only the values that
  ask for nothing — the ones clients send as defaults (`logprobs: null`, `n: 1`, `tools: []`) —
  and answers any other value with a 400 that names the field. Refusing beats ignoring: a client
  that asked for 3 completions, a JSON schema or an image must hear that it will not get them.

Fields the table does not know are accepted and *reported* (a log line and the
`inflight:request_ignored_fields_total` counter), as vLLM accepts and logs them: routers and
frameworks add fields of their own to every request (`vllm-router` adds SGLang's `no_stop_trim`).

Every known field is typed (`Param.type`, a Python annotation): pydantic checks values strictly
against it (`"4"` is not an int, `true` is not a number) and writes the OpenAPI schema from it.
A value rule beyond the type is `Param.check`; a new field, or a field this server learns to
honour, is one row here (and, for a new sampling field, one argument of `SamplingParams`).
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from pydantic import BaseModel, ConfigDict

from inflight.checks import show
from inflight.engine.sampling import MAX_LOGPROBS

__all__ = ["Param", "FIELDS", "HONOURED", "ACCEPTED", "NEUTRAL_ONLY", "fields_for", "field_table", "Open",
           "ChatMessage", "ContentPart", "StreamOptions", "neutral_check"]

HONOURED, ACCEPTED, NEUTRAL_ONLY = "honoured", "accepted", "neutral only"
COMPLETIONS, CHAT = "completions", "chat"
BOTH = (COMPLETIONS, CHAT)


class Open(BaseModel):
    """A request object: values checked strictly by type; fields it does not declare are kept (and
    reported as ignored), as OpenAI's API and vLLM allow."""

    model_config = ConfigDict(extra="allow", strict=True)


class StreamOptions(Open):
    include_usage: Optional[bool] = None
    continuous_usage_stats: Optional[bool] = None  # vLLM's: running token counts in every chunk


class ContentPart(Open):
    """One part of a message's content: `{"type": "text", "text": ...}` (an image or audio part is
    refused by name)."""

    type: str
    text: Optional[str] = None


class ChatMessage(Open):
    """One chat message. An assistant's `content` may be null (agent frameworks send one after a
    tool call); `tool_calls` may only be empty (this server calls no tools)."""

    role: str
    content: Optional[Union[str, list[ContentPart]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    tool_call_id: Optional[str] = None
    refusal: Optional[str] = None


class ResponseFormat(Open):
    type: str
    json_schema: Optional[dict[str, Any]] = None


@dataclass(frozen=True)
class Param:
    """One request field: its name, type and endpoints, what this server does with it (`does`:
    HONOURED, ACCEPTED or NEUTRAL_ONLY, with the `neutral` values), OpenAI's and vLLM's behaviour
    and this server's in words, an extra value rule (`check(value)` raises ValueError with the
    reason), whether it goes to `SamplingParams` under its own name (`sampling`), and the bounds the
    engine enforces, written into the OpenAPI schema for clients to read (`bounds`, JSON Schema
    keywords: documentation of the engine's checks, which stay the ones that refuse)."""

    name: str
    type: Any
    does: str
    openai: str
    vllm: str
    ours: str
    endpoints: tuple[str, ...] = BOTH
    neutral: tuple = ()
    check: Callable[[Any], None] | None = None
    sampling: bool = False
    required: bool = False
    bounds: dict | None = None

    def here(self) -> str:
        """What this server does with the field, in words (the table's last column, the schema's description)."""
        return {HONOURED: self.ours, ACCEPTED: f"accepted: {self.ours}",
                NEUTRAL_ONLY: f"only {' or '.join(json.dumps(v) for v in self.neutral)}: {self.ours}"}[self.does]


def _p(name, type_, does, openai, vllm, ours, **kw) -> Param:
    return Param(name, type_, does, openai, vllm, ours, **kw)


def _same(value: Any, neutral: Any) -> bool:
    """`value == neutral`, where a bool and a number are never the same (`logprobs: 0` asks for something)."""
    return isinstance(value, bool) == isinstance(neutral, bool) and value == neutral


def neutral_check(param: Param) -> Callable[[Any], None]:
    """The rule of a NEUTRAL_ONLY field: one of its neutral values, or a ValueError saying what it asks for."""
    def check(value: Any) -> None:
        if not any(_same(value, v) for v in param.neutral):
            allowed = " or ".join(json.dumps(v) for v in param.neutral)
            raise ValueError(f"{param.name}={show(value)} is not supported by this server: {param.ours} (it accepts "
                             f"only {allowed}, which ask for nothing)")
    return check


_NUM, _INT, _BOOL, _STR = Optional[float], Optional[int], Optional[bool], Optional[str]
_STOP = Optional[Union[str, list[str]]]
_PROMPT = Union[str, list[int], list[str], list[list[int]]]
_TOOL_CHOICE = Optional[Union[str, dict[str, Any]]]
_OPEN = "honours it"
_VLLM = "honours it"
_NOT_OPENAI, _NOT_VLLM = "not in OpenAI's API", "ignores it (logged)"
_SG = "not in OpenAI's API (SGLang's; vllm-router sends it)"

#: The table. Order: what every request uses, then OpenAI's optional fields, then vLLM's and
#: SGLang's extensions.
FIELDS: tuple[Param, ...] = (
    _p("model", _STR, HONOURED, "required", "optional; another name is a 404", "optional; another name is a 404"),
    _p("prompt", _PROMPT, HONOURED, "a string, tokens, or a batch of them", _VLLM,
       "one prompt per request: a batch of several is a 400", endpoints=(COMPLETIONS,), required=True),
    _p("messages", list[ChatMessage], HONOURED, "required", _VLLM,
       "roles the chat template knows; text content only", endpoints=(CHAT,), required=True, bounds={"minItems": 1}),
    _p("max_tokens", _INT, HONOURED, "deprecated for chat, still honoured", _VLLM, "honoured", sampling=True,
       bounds={"minimum": 1}),
    _p("max_completion_tokens", _INT, HONOURED, _OPEN, _VLLM, "honoured, wins over max_tokens", endpoints=(CHAT,),
       bounds={"minimum": 1}),
    _p("temperature", _NUM, HONOURED, _OPEN, _VLLM, "honoured", sampling=True, bounds={"minimum": 0}),
    _p("top_p", _NUM, HONOURED, _OPEN, _VLLM, "honoured", sampling=True, bounds={"exclusiveMinimum": 0, "maximum": 1}),
    _p("seed", _INT, HONOURED, _OPEN, _VLLM, "honoured: the same seed, the same answer", sampling=True,
       bounds={"minimum": -2**63, "maximum": 2**64 - 1}),
    _p("stop", _STOP, HONOURED, _OPEN, _VLLM, "honoured (at most 64)", sampling=True,
       bounds={"minLength": 1, "maxItems": 64}),
    _p("stream", _BOOL, HONOURED, _OPEN, _VLLM, "honoured"),
    _p("stream_options", Optional[StreamOptions], HONOURED, "include_usage", "adds continuous_usage_stats",
       "both honoured; only with stream"),
    _p("user", _STR, ACCEPTED, "an end-user id, for abuse reports", "ignores it", "nothing to do"),
    _p("n", _INT, HONOURED, "n choices", "n choices", "n samples of one prefill, sharing its KV blocks (at most "
       "max_num_seqs, and what the pool holds side by side)", sampling=True, bounds={"minimum": 1}),
    _p("logprobs", _INT, HONOURED, "log-probabilities of each token and the top k (0-5)", "the top k (0-20)",
       "the top k, at most 20, raw (before temperature and top_p)", endpoints=(COMPLETIONS,),
       bounds={"minimum": 0, "maximum": MAX_LOGPROBS}),
    _p("logprobs", _BOOL, HONOURED, "log-probabilities of each token", _VLLM,
       "honoured: raw (before temperature and top_p)", endpoints=(CHAT,)),
    _p("top_logprobs", _INT, HONOURED, "the top k (0-20) with logprobs", _VLLM, "honoured (0-20, needs logprobs)",
       endpoints=(CHAT,), bounds={"minimum": 0, "maximum": MAX_LOGPROBS}),
    _p("echo", _BOOL, HONOURED, "completions: the prompt before the answer (with logprobs: its tokens' too)",
       _VLLM, "honoured, the prompt's log-probabilities with logprobs", endpoints=(COMPLETIONS,)),
    _p("best_of", _INT, NEUTRAL_ONLY, "completions: best of n", "V1: only 1", "it samples one completion",
       endpoints=(COMPLETIONS,), neutral=(None, 1)),
    _p("suffix", _STR, NEUTRAL_ONLY, "completions: text after the insertion", "refuses it (400)", "it does not insert",
       endpoints=(COMPLETIONS,), neutral=(None, "")),
    _p("logit_bias", Optional[dict[str, float]], NEUTRAL_ONLY, _OPEN, _VLLM, "it does not bias tokens",
       neutral=(None, {})),
    _p("frequency_penalty", _NUM, NEUTRAL_ONLY, _OPEN, _VLLM, "it applies no penalties", neutral=(None, 0)),
    _p("presence_penalty", _NUM, NEUTRAL_ONLY, _OPEN, _VLLM, "it applies no penalties", neutral=(None, 0)),
    _p("response_format", Optional[ResponseFormat], NEUTRAL_ONLY, "JSON mode, a JSON schema", "guided decoding",
       "it does not constrain the output", neutral=(None, {"type": "text"})),
    _p("tools", Optional[list[dict[str, Any]]], NEUTRAL_ONLY, "tool definitions", "with a tool parser",
       "it calls no tools", endpoints=(CHAT,), neutral=(None, [])),
    _p("tool_choice", _TOOL_CHOICE, NEUTRAL_ONLY, "none / auto / required / a tool", _VLLM,
       "it calls no tools", endpoints=(CHAT,), neutral=(None, "none", "auto")),
    _p("parallel_tool_calls", _BOOL, ACCEPTED, "with tools", "ignores it", "means nothing without tools",
       endpoints=(CHAT,)),
    _p("functions", Optional[list[dict[str, Any]]], NEUTRAL_ONLY, "deprecated tools", _NOT_VLLM,
       "it calls no functions", endpoints=(CHAT,), neutral=(None, [])),
    _p("function_call", _TOOL_CHOICE, NEUTRAL_ONLY, "deprecated tool_choice", _NOT_VLLM,
       "it calls no functions", endpoints=(CHAT,), neutral=(None, "none", "auto")),
    _p("modalities", Optional[list[str]], NEUTRAL_ONLY, '["text"] or with "audio"', _NOT_VLLM,
       "it writes text only", endpoints=(CHAT,), neutral=(None, ["text"])),
    _p("audio", Optional[dict[str, Any]], NEUTRAL_ONLY, "audio output", _NOT_VLLM, "it writes text only",
       endpoints=(CHAT,), neutral=(None,)),
    _p("web_search_options", Optional[dict[str, Any]], NEUTRAL_ONLY, "web search", _NOT_VLLM,
       "it does not search the web", endpoints=(CHAT,), neutral=(None,)),
    _p("prediction", Optional[dict[str, Any]], ACCEPTED, "predicted output: faster, same answer", _NOT_VLLM,
       "the answer is the same without it", endpoints=(CHAT,)),
    _p("store", _BOOL, ACCEPTED, "keep a copy for OpenAI's dashboard", _NOT_VLLM, "keeps nothing",
       endpoints=(CHAT,)),
    _p("metadata", Optional[dict[str, str]], ACCEPTED, "tags for stored completions", _NOT_VLLM, "keeps nothing",
       endpoints=(CHAT,)),
    _p("service_tier", _STR, ACCEPTED, "a processing tier", _NOT_VLLM, "one tier", endpoints=(CHAT,)),
    _p("reasoning_effort", _STR, ACCEPTED, "for reasoning models", "accepts low, medium, high",
       "the model does not reason", endpoints=(CHAT,)),
    _p("prompt_cache_key", _STR, ACCEPTED, "a prompt-caching hint", _NOT_VLLM, "prefix caching needs no key",
       endpoints=(CHAT,)),
    _p("safety_identifier", _STR, ACCEPTED, "an end-user id", _NOT_VLLM, "nothing to do", endpoints=(CHAT,)),
    # vLLM's extensions (`vllm bench serve`, vllm-router and LangChain's VLLMOpenAI send some of them)
    _p("stop_token_ids", Optional[list[int]], HONOURED, _NOT_OPENAI, _VLLM, "honoured (at most 1024)",
       sampling=True, bounds={"maxItems": 1024}),
    _p("ignore_eos", _BOOL, HONOURED, _NOT_OPENAI, _VLLM, "honoured", sampling=True),
    _p("priority", _INT, HONOURED, _NOT_OPENAI, "with --scheduling-policy priority", "honoured (lower first)",
       sampling=True, bounds={"minimum": -2**63, "maximum": 2**63 - 1}),
    _p("skip_special_tokens", _BOOL, HONOURED, _NOT_OPENAI, _VLLM, "honoured", sampling=True),
    _p("add_generation_prompt", _BOOL, HONOURED, _NOT_OPENAI, _VLLM, "honoured", endpoints=(CHAT,)),
    _p("continue_final_message", _BOOL, HONOURED, _NOT_OPENAI, _VLLM, "honoured", endpoints=(CHAT,)),
    _p("add_special_tokens", _BOOL, NEUTRAL_ONLY, _NOT_OPENAI, _VLLM, "it adds the model's own (BOS first)",
       endpoints=(COMPLETIONS,), neutral=(None, True)),
    _p("add_special_tokens", _BOOL, NEUTRAL_ONLY, _NOT_OPENAI, _VLLM, "the chat template adds them",
       endpoints=(CHAT,), neutral=(None, False)),
    _p("top_k", _INT, NEUTRAL_ONLY, _NOT_OPENAI, _VLLM, "it samples with temperature and top_p",
       neutral=(None, -1, 0)),
    _p("min_p", _NUM, NEUTRAL_ONLY, _NOT_OPENAI, _VLLM, "it samples with temperature and top_p", neutral=(None, 0)),
    _p("repetition_penalty", _NUM, NEUTRAL_ONLY, _NOT_OPENAI, _VLLM, "it applies no penalties",
       neutral=(None, 1)),
    _p("min_tokens", _INT, NEUTRAL_ONLY, _NOT_OPENAI, _VLLM, "it cannot hold back the end", neutral=(None, 0)),
    _p("include_stop_str_in_output", _BOOL, NEUTRAL_ONLY, _NOT_OPENAI, _VLLM, "the text ends before a stop string",
       neutral=(None, False)),
    _p("use_beam_search", _BOOL, NEUTRAL_ONLY, _NOT_OPENAI, _VLLM, "it does not search beams", neutral=(None, False)),
    _p("guided_json", Optional[Union[str, dict[str, Any]]], NEUTRAL_ONLY, _NOT_OPENAI, _VLLM,
       "it does not constrain the output", neutral=(None,)),
    _p("guided_regex", _STR, NEUTRAL_ONLY, _NOT_OPENAI, _VLLM, "it does not constrain the output", neutral=(None,)),
    _p("guided_choice", Optional[list[str]], NEUTRAL_ONLY, _NOT_OPENAI, _VLLM, "it does not constrain the output",
       neutral=(None,)),
    _p("chat_template", _STR, NEUTRAL_ONLY, _NOT_OPENAI, _VLLM, "it uses the model's own template",
       endpoints=(CHAT,), neutral=(None,)),
    _p("cache_salt", _STR, NEUTRAL_ONLY, _NOT_OPENAI, _VLLM, "its prefix cache has no salts", neutral=(None,)),
    _p("include_reasoning", _BOOL, ACCEPTED, _NOT_OPENAI, "with a reasoning parser",
       "the model writes no reasoning", endpoints=(CHAT,)),
    # SGLang's, which vllm-router (adapted from SGLang's router) adds to every request
    _p("separate_reasoning", _BOOL, ACCEPTED, _SG, _NOT_VLLM, "the model writes no reasoning", endpoints=(CHAT,)),
    _p("stream_reasoning", _BOOL, ACCEPTED, _SG, _NOT_VLLM, "the model writes no reasoning", endpoints=(CHAT,)),
    _p("no_stop_trim", _BOOL, NEUTRAL_ONLY, _SG, _NOT_VLLM, "the text ends before a stop string",
       neutral=(None, False)),
    _p("return_hidden_states", _BOOL, NEUTRAL_ONLY, _SG, _NOT_VLLM, "it returns text, not hidden states",
       neutral=(None, False)),
)


@functools.cache
def fields_for(endpoint: str) -> dict[str, Param]:
    """The table's rows for one endpoint ("completions" or "chat"), by name (one dict per endpoint,
    made once: read it, don't change it)."""
    return {p.name: p for p in FIELDS if endpoint in p.endpoints}


def field_table() -> tuple[list[str], list[list[str]]]:
    """(header, rows) of `FIELDS` for a chapter's table."""
    where = {BOTH: "both", (COMPLETIONS,): "completions", (CHAT,): "chat"}
    rows = [[p.name, where[p.endpoints], p.openai, p.vllm, p.here()] for p in FIELDS]
    return ["field", "endpoint", "OpenAI", "vLLM", "this server"], rows
