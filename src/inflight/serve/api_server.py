"""The OpenAI-compatible HTTP API over an `AsyncEngine` (vLLM's `vllm/entrypoints/openai/api_server.py`
and `serving_completion.py` / `serving_chat.py`), on FastAPI.

One handler per request, all on one event loop: it checks the request (bad input: 400 with the
engine's own message, before anything is queued), refuses it at once with 503 + Retry-After when
the waiting queue is full, then hands it to the engine loop and either streams its deltas as
Server-Sent Events or waits for the whole answer. A client that goes away aborts its request:

- streaming: Starlette cancels the response's task when the client disconnects (or writing to it
  fails); the cancellation reaches `AsyncEngine.generate`, whose `finally` sends the abort;
- not streaming: the handler races the answer against the connection's `http.disconnect` message
  and cancels the wait when the client leaves first (vLLM's `with_cancellation`).
"""
from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from inflight import checks
from inflight.serve import protocol
from inflight.serve.async_engine import AsyncEngine, EngineDeadError
from inflight.serve.metrics import CONTENT_TYPE, ServerMetrics
from inflight.serve.protocol import RequestError

__all__ = ["build_app", "OpenAIServing", "DEFAULT_MAX_BODY_BYTES", "RETRY_AFTER_S"]

DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: far above any prompt the context can hold
RETRY_AFTER_S = 1


def build_app(engine: AsyncEngine, metrics: ServerMetrics, *, model_name: str, api_key: str | None = None,
              max_waiting: int | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
              on_ready: Callable[[], None] | None = None) -> FastAPI:
    """The FastAPI app: starts `engine`'s loop on startup (then calls `on_ready`) and shuts it down
    (aborting whatever is in flight) on shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await engine.start()
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            await engine.shutdown()

    app = FastAPI(title="inflight", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    created = protocol.now()

    if api_key is not None:
        app.add_middleware(_RequireApiKey, key=api_key)

    @app.get("/health")
    async def health() -> Response:
        if engine.is_running:
            return Response(status_code=200)
        return _error(RequestError(f"the engine loop is not running ({engine.dead or 'shutting down'})",
                                   status=503, type="service_unavailable"))

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "inflight", "root": model_name,
                                            "max_model_len": engine.engine.max_model_len}]}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(engine.snapshot), media_type=CONTENT_TYPE)

    serving = OpenAIServing(engine, model_name, max_waiting, max_body_bytes)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serving.create(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await serving.create(request, chat=True)

    app.state.engine, app.state.metrics = engine, metrics
    return app


class OpenAIServing:
    """/v1/completions and /v1/chat/completions (vLLM's `OpenAIServingCompletion` and `OpenAIServingChat`)."""

    def __init__(self, engine: AsyncEngine, model_name: str, max_waiting: int | None, max_body_bytes: int):
        self.engine, self.llm, self.model_name = engine, engine.engine, model_name
        self.max_waiting, self.max_body_bytes = max_waiting, max_body_bytes

    async def create(self, request: Request, chat: bool) -> Response:
        arrival = time.perf_counter()
        try:
            body = protocol.parse_json(await _read_body(request, self.max_body_bytes))
            req, ids, params = self.check(body, chat)
            _admit(self.engine, self.max_waiting)
        except RequestError as exc:
            return _error(exc)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        shape = _Shape(rid, self.model_name, protocol.now(), chat, len(ids))
        deltas = self.engine.generate(ids, params, rid, arrival)
        if req.stream:
            return StreamingResponse(_stream(deltas, shape, req), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        answer = await _unless_disconnected(request, _collect(deltas, shape))
        return answer if answer is not None else Response(status_code=499)  # (nobody is listening any more)

    def check(self, body: dict, chat: bool) -> tuple[protocol.GenerationRequest, list[int], Any]:
        """(request, prompt ids, SamplingParams), or RequestError with the engine's own message."""
        llm = self.llm
        try:
            if chat:
                req, messages = protocol.chat_request(body, self.model_name)
                req.prompt = protocol.render_chat(messages, llm.tokenizer)
            else:
                req = protocol.completion_request(body, self.model_name)
            ids = checks.prompt(req.prompt, llm.config.vocab_size, llm.tokenizer)
            default = llm.max_model_len - len(ids) if chat else protocol.DEFAULT_COMPLETION_TOKENS
            want = req.sampling.get("max_tokens", default)
            # a prompt that fits but leaves no room for max_tokens is refused, as vLLM does (the engine would cut
            # it short); a prompt too long by itself gets the engine's own message from check_request
            if type(want) is int and len(ids) <= llm.max_model_len < len(ids) + want:
                raise ValueError(f"max_tokens={want} and the prompt's {len(ids)} tokens exceed the model's "
                                 f"context of {llm.max_model_len} tokens")
            ids, params = llm.check_request(ids, req.params(max(default, 1)))
        except (ValueError, TypeError) as exc:
            raise RequestError(str(exc)) from None
        return req, ids, params


class _RequireApiKey:
    """ASGI middleware: /v1 endpoints need `Authorization: Bearer KEY` (as `vllm serve --api-key`).
    Plain ASGI, not Starlette's BaseHTTPMiddleware, which would sit between a stream and its client."""

    def __init__(self, app: Any, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1") and \
                dict(scope["headers"]).get(b"authorization") != self.expected:
            response = _error(RequestError("invalid or missing API key (send 'Authorization: Bearer KEY')",
                                           status=401, type="authentication_error", code="invalid_api_key"))
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _admit(engine: AsyncEngine, max_waiting: int | None) -> None:
    if not engine.is_running:
        raise RequestError(f"the engine loop is not running ({engine.dead or 'shutting down'})", status=503,
                           type="service_unavailable")
    if max_waiting is not None and engine.num_waiting() >= max_waiting:
        raise RequestError(f"the server is full: {max_waiting} requests are already waiting; retry later",
                           status=503, type="service_unavailable", code="queue_full")


def _error(exc: RequestError) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if exc.status == 503 else None
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) past `limit` bytes — by its Content-Length, or while it streams in."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(f"the request body is {declared} bytes, over the limit of {limit}", status=413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(f"the request body is over the limit of {limit} bytes", status=413)
        chunks.append(chunk)
    return b"".join(chunks)


class _Shape:
    """How to write one request's answer: its id, model, creation time, endpoint and prompt size."""

    def __init__(self, rid: str, model: str, created: int, chat: bool, prompt_tokens: int):
        self.rid, self.model, self.created, self.chat, self.prompt_tokens = rid, model, created, chat, prompt_tokens

    def chunk(self, text: str | None, finish: str | None, usage: dict | None = None, role: bool = False) -> str:
        if self.chat:
            return protocol.sse(protocol.chat_object(self.rid, self.model, self.created, text, finish, usage,
                                                     chunk=True, role=role))
        return protocol.sse(protocol.completion_object(self.rid, self.model, self.created, text, finish, usage,
                                                       chunk=True))


async def _stream(deltas: AsyncIterator, shape: _Shape, req: protocol.GenerationRequest) -> AsyncIterator[str]:
    """The SSE body: a chunk per delta with text (or an ending), the usage chunk if asked, [DONE]."""
    completion = 0
    try:
        if shape.chat:
            yield shape.chunk("", None, role=True)
        async for delta in deltas:
            completion += len(delta.token_ids)
            if delta.finish_reason == "error":
                yield protocol.sse(protocol.error_body(f"the request failed: {delta.error}", "internal_server_error"))
                break
            if delta.text or delta.finished:
                running = protocol.usage(shape.prompt_tokens, completion) if req.continuous_usage else None
                yield shape.chunk(delta.text if delta.text or not shape.chat else None, delta.finish_reason, running)
        if req.include_usage:
            yield shape.chunk(None, None, protocol.usage(shape.prompt_tokens, completion))
    except (EngineDeadError, ValueError, TypeError) as exc:  # the loop died, or refused the request
        yield protocol.sse(protocol.error_body(str(exc), "internal_server_error"))
    finally:
        await deltas.aclose()  # (cancelled or failed before the end: this aborts the request)
    yield protocol.SSE_DONE


async def _collect(deltas: AsyncIterator, shape: _Shape) -> JSONResponse:
    """A whole (non-streamed) answer."""
    text, completion, finish = [], 0, None
    try:
        async for delta in deltas:
            text.append(delta.text)
            completion += len(delta.token_ids)
            finish = delta.finish_reason
            if finish == "error":
                return _error(RequestError(f"the request failed: {delta.error}", status=500,
                                           type="internal_server_error"))
    except (EngineDeadError, ValueError, TypeError) as exc:  # the loop died, or refused the request
        return _error(RequestError(str(exc), status=500, type="internal_server_error"))
    finally:
        await deltas.aclose()
    usage = protocol.usage(shape.prompt_tokens, completion)
    make = protocol.chat_object if shape.chat else protocol.completion_object
    return JSONResponse(make(shape.rid, shape.model, shape.created, "".join(text), finish, usage))


async def _unless_disconnected(request: Request, work: Any) -> Any:
    """Await `work`, unless the client disconnects first: then cancel it (which aborts the request) and return None."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # (also when this handler is cancelled: nothing is left running)
        gone.cancel()
        if not task.done():
            task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        if asyncio.current_task().cancelling():  # we are being cancelled ourselves
            raise
        return None


async def _disconnected(request: Request) -> None:
    """Return when the client closes the connection (the body has been read: the next message is that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
