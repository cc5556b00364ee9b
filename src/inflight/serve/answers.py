"""Writing a request's answer from its stream of deltas: streamed as Server-Sent Events, or whole
(vLLM's `serving_completion.py` / `serving_chat.py`, the part after the engine).

A request may ask for `n` choices (`SamplingParams.n`: `n` samples of one prefill): each choice is
written under its `index`, in chunks of its own as its sample moves, and `usage` counts every
sample's tokens (the prompt once). With `logprobs`, each chunk carries its tokens'
log-probabilities (`inflight.serve.logprob_format`); with `echo` (completions), each choice begins
with the prompt — and with its tokens' log-probabilities when `logprobs` is set.
"""
from __future__ import annotations

from typing import Any, AsyncIterator

from fastapi.responses import JSONResponse

from inflight.serve import protocol, responses
from inflight.serve.async_engine import EngineDeadError, RequestStream
from inflight.serve.logprob_format import chat_logprobs, completion_logprobs
from inflight.serve.output_collector import StreamDelta
from inflight.serve.protocol import RequestError

__all__ = ["Answer", "stream_answer", "whole_answer"]


def _parts(delta: StreamDelta) -> list[tuple[int, StreamDelta]]:
    """The delta of each choice that moved, by index (one request of n samples, or a single one)."""
    return sorted(delta.samples.items()) if delta.samples is not None else [(0, delta)]


class Answer:
    """How to write one request's answer: its id, model, creation time, endpoint, prompt, number of
    choices, and the log-probabilities and echo it asked for; it keeps each choice's text offset."""

    def __init__(self, rid: str, model: str, created: int, chat: bool, prompt_ids: list[int],
                 req: protocol.GenerationRequest, n: int, tokenizer: Any):
        self.rid, self.model, self.created, self.chat = rid, model, created, chat
        self.prompt_ids, self.n, self.k, self.tokenizer = prompt_ids, n, req.logprobs, tokenizer
        self.prompt_tokens = len(prompt_ids)
        self.echo = None
        if req.echo:
            self.echo = req.prompt if isinstance(req.prompt, str) else tokenizer.decode(prompt_ids)
        self.offsets = [0] * n  # where each choice's next token's text starts (legacy text_offset)

    def logprobs(self, index: int, token_ids: list[int], entries: list | None) -> Any:
        """The log-probabilities of these tokens of choice `index`, in the endpoint's shape (None if not asked)."""
        if self.k is None or entries is None:
            return None
        if self.chat:
            return chat_logprobs(token_ids, entries, self.k, self.tokenizer)
        out, self.offsets[index] = completion_logprobs(token_ids, entries, self.k, self.tokenizer, self.offsets[index])
        return out

    def echoed(self, index: int, prompt_logprobs: list | None) -> tuple[str, Any]:
        """The prompt that begins choice `index` (with echo), and its tokens' log-probabilities."""
        return self.echo, self.logprobs(index, self.prompt_ids, prompt_logprobs)

    def chunk(self, index: int, text: str | None, finish: str | None, usage: dict | None = None, role: bool = False,
              logprobs: Any = None) -> str:
        if self.chat:
            return responses.sse(responses.chat_object(self.rid, self.model, self.created, text, finish, usage,
                                                       chunk=True, role=role, index=index, logprobs=logprobs))
        return responses.sse(responses.completion_object(self.rid, self.model, self.created, text, finish, usage,
                                                         chunk=True, index=index, logprobs=logprobs))


async def stream_answer(deltas: RequestStream, a: Answer, req: protocol.GenerationRequest) -> AsyncIterator[str]:
    """The SSE body: each choice's role first (chat), its echo (completions), a chunk per delta of a
    choice with text, log-probabilities or an ending, the usage chunk if asked, [DONE]."""
    completion, first, failed = 0, True, None
    try:
        if a.chat:
            for i in range(a.n):
                yield a.chunk(i, "", None, role=True)
        async for delta in deltas:
            if first and a.echo is not None:
                for i in range(a.n):
                    text, lp = a.echoed(i, delta.prompt_logprobs)
                    yield a.chunk(i, text, None, logprobs=lp)
            first = False
            for i, d in _parts(delta):
                completion += len(d.token_ids)
                if d.finish_reason == "error":
                    failed = d.error
                    break
                lp = a.logprobs(i, d.token_ids, d.logprobs)
                if d.text or d.finished or lp:
                    running = responses.usage(a.prompt_tokens, completion) if req.continuous_usage else None
                    yield a.chunk(i, d.text if d.text or not a.chat else None, d.finish_reason, running, logprobs=lp)
            if failed is not None:
                yield responses.sse(responses.error_body(f"the request failed: {failed}", "internal_server_error"))
                break
        if req.include_usage:
            yield a.chunk(0, None, None, responses.usage(a.prompt_tokens, completion))
    except (EngineDeadError, ValueError, TypeError) as exc:  # the loop died, or refused the request
        yield responses.sse(responses.error_body(str(exc), "internal_server_error"))
    finally:
        deltas.close()  # (cancelled or failed before the end: this aborts the request)
    yield responses.SSE_DONE


async def whole_answer(deltas: RequestStream, a: Answer) -> JSONResponse:
    """A whole (non-streamed) answer: every choice, in index order (RequestError with a 500 if the
    request failed on the way)."""
    texts = [[] for _ in range(a.n)]
    tokens: list[list[int]] = [[] for _ in range(a.n)]
    entries: list[list] = [[] for _ in range(a.n)]
    finish: list[str | None] = [None] * a.n
    prompt = None
    try:
        async for delta in deltas:
            prompt = prompt or delta.prompt_logprobs
            for i, d in _parts(delta):
                if d.finish_reason == "error":
                    raise RequestError(f"the request failed: {d.error}", status=500, type="internal_server_error")
                texts[i].append(d.text)
                tokens[i] += d.token_ids
                entries[i] += d.logprobs or []
                finish[i] = d.finish_reason or finish[i]
    except (EngineDeadError, ValueError, TypeError) as exc:  # the loop died, or refused the request
        raise RequestError(str(exc), status=500, type="internal_server_error") from None
    finally:
        deltas.close()
    usage = responses.usage(a.prompt_tokens, sum(map(len, tokens)))
    choices = [_choice(a, i, "".join(texts[i]), tokens[i], entries[i], finish[i], prompt) for i in range(a.n)]
    make = responses.chat_object if a.chat else responses.completion_object
    return JSONResponse(make(a.rid, a.model, a.created, None, None, usage, choices=choices))


def _choice(a: Answer, i: int, text: str, tokens: list[int], entries: list, finish: str | None,
            prompt: list | None) -> dict:
    if a.chat:
        return responses.chat_choice(i, text, finish, a.logprobs(i, tokens, entries))
    lp = None
    if a.echo is not None:
        head, lp = a.echoed(i, prompt)
        text = head + text
    more = a.logprobs(i, tokens, entries)
    if lp is not None and more is not None:
        lp = {key: lp[key] + more[key] for key in lp}
    return responses.completion_choice(i, text, finish, lp if lp is not None else more)
