"""The OpenAI-compatible HTTP API over an `AsyncEngine` (vLLM's `vllm/entrypoints/openai/api_server.py`
and `serving_completion.py` / `serving_chat.py`), on FastAPI.

One handler per request, all on one event loop: it checks the request (bad input: 400 with the
engine's own message, before anything is queued), refuses it at once with 503 + Retry-After when
the waiting queue is full, then hands it to the engine loop and either streams its deltas as
Server-Sent Events or waits for the whole answer. The request is queued (`AsyncEngine.add_request`)
in the same instant it is admitted, so that the next handler's admission already counts it; its
stream is closed however the response ends, and closing aborts a request that has not finished.
A client that goes away therefore aborts its request:

- streaming: Starlette cancels the response's task when the client disconnects (or writing to it
  fails), and the response closes the request's stream — also when the client left before the
  body began;
- not streaming: the handler races the answer against the connection's `http.disconnect` message
  and cancels the wait when the client leaves first (vLLM's `with_cancellation`).

Every error, also a path or method that does not exist, has OpenAI's shape. Fields a request
carries that the server does not know are accepted and reported (a log line, once per distinct set
of names, and the `inflight:request_ignored_fields_total` counter), as vLLM accepts and logs them.
`/openapi.json` describes every endpoint's request and response bodies (`inflight.serve.openapi`).
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from inflight import checks
from inflight.engine.liveness import samples_room
from inflight.serve import openapi, protocol, responses
from inflight.serve.answers import Answer, stream_answer, whole_answer
from inflight.serve.async_engine import AsyncEngine, RequestStream
from inflight.serve.metrics import CONTENT_TYPE, ServerMetrics
from inflight.serve.protocol import RequestError

__all__ = ["build_app", "OpenAIServing", "DEFAULT_MAX_BODY_BYTES", "RETRY_AFTER_S"]

DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: far above any prompt the context can hold
RETRY_AFTER_S = 1
#: distinct sets of ignored field names logged (a router adds the same ones to every request: one line)
MAX_LOGGED_FIELD_SETS = 100
logger = logging.getLogger("inflight.serve")


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

    app = FastAPI(title="inflight", summary="An OpenAI-compatible server over the inflight engine",
                  version=_version(), lifespan=lifespan, docs_url=None, redoc_url=None)
    created = responses.now()

    if api_key is not None:
        app.add_middleware(_RequireApiKey, key=api_key)

    _error_handlers(app)

    @app.get("/health", response_class=Response, responses=openapi.HEALTH)
    async def health() -> Response:
        if engine.is_running:
            return Response(status_code=200)
        return _error(RequestError(f"the engine loop is not running ({engine.dead or 'shutting down'})",
                                   status=503, type="service_unavailable"))

    _model_routes(app, responses.model_card(model_name, created, engine.engine.max_model_len))

    @app.get("/metrics", response_class=Response, responses=openapi.METRICS)
    async def prometheus() -> Response:
        return Response(metrics.render(engine.snapshot), media_type=CONTENT_TYPE)

    serving = OpenAIServing(engine, model_name, max_waiting, max_body_bytes, metrics)

    @app.post("/v1/completions", **openapi.generation(chat=False))
    async def completions(request: Request) -> Response:
        return await serving.create(request, chat=False)

    @app.post("/v1/chat/completions", **openapi.generation(chat=True))
    async def chat_completions(request: Request) -> Response:
        return await serving.create(request, chat=True)

    openapi.install(app, protocol.chat_roles(engine.engine.tokenizer))
    app.state.engine, app.state.metrics = engine, metrics
    return app


def _error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape: no such path or method, and a bug (logged, never a traceback out)."""

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:  # no such path, or method
        # (with Starlette's headers: a 405 says which methods the path allows, as RFC 9110 asks)
        return _error(RequestError(str(exc.detail), status=exc.status_code, type="invalid_request_error"),
                      exc.headers)

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> Response:  # a bug: logged, never a traceback out
        return _error(RequestError(f"internal server error ({type(exc).__name__})", status=500,
                                   type="internal_server_error"))


def _model_routes(app: FastAPI, card: dict) -> None:
    """/v1/models, and /v1/models/{model} for the one model `card` describes."""

    @app.get("/v1/models", responses=openapi.MODELS)
    async def models() -> Response:
        return JSONResponse({"object": "list", "data": [card]})

    # (answered here, not redirected: a client given a base URL ending in "/" asks for "/v1/models/")
    app.add_api_route("/v1/models/", models, methods=["GET"], include_in_schema=False)

    @app.get("/v1/models/{model:path}", responses=openapi.MODEL)
    async def retrieve_model(model: str) -> Response:  # (`openai`'s client.models.retrieve)
        if model != card["id"]:
            return _error(protocol.model_not_found(model, card["id"]))
        return JSONResponse(card)


def _version() -> str:
    from inflight import __version__

    return __version__


class OpenAIServing:
    """/v1/completions and /v1/chat/completions (vLLM's `OpenAIServingCompletion` and `OpenAIServingChat`)."""

    def __init__(self, engine: AsyncEngine, model_name: str, max_waiting: int | None, max_body_bytes: int,
                 metrics: ServerMetrics | None = None):
        self.engine, self.llm, self.model_name = engine, engine.engine, model_name
        self.max_waiting, self.max_body_bytes, self.metrics = max_waiting, max_body_bytes, metrics
        self._logged: set[frozenset] = set()  # the sets of ignored field names already logged

    async def create(self, request: Request, chat: bool) -> Response:
        arrival = time.perf_counter()
        try:
            body = protocol.parse_json(await _read_body(request, self.max_body_bytes))
            req, ids, params = self.check(body, chat)
            self.report_ignored(req.ignored, chat)
            _admit(self.engine, self.max_waiting)
        except RequestError as exc:
            return _error(exc)
        except ClientDisconnect:  # gone before its body was whole: nobody to answer
            return Response(status_code=499)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        shape = Answer(rid, self.model_name, responses.now(), chat, ids, req, params.n, self.llm.tokenizer)
        # queued now, with no await since the admission check: a burst of handlers each count the ones before
        deltas = self.engine.add_request(ids, params, rid, arrival)
        if req.stream:
            return _EventStream(deltas, stream_answer(deltas, shape, req))
        try:
            answer = await _unless_disconnected(request, whole_answer(deltas, shape))
        except RequestError as exc:  # (it failed on the way)
            return _error(exc)
        finally:
            deltas.close()
        return answer if answer is not None else Response(status_code=499)  # (nobody is listening any more)

    def check(self, body: dict, chat: bool) -> tuple[protocol.GenerationRequest, list[int], Any]:
        """(request, prompt ids, SamplingParams), or RequestError with the engine's own message."""
        llm = self.llm
        try:
            if chat:
                req, messages = protocol.chat_request(body, self.model_name, protocol.chat_roles(llm.tokenizer))
                req.prompt = protocol.render_chat(
                    messages, llm.tokenizer, add_generation_prompt=req.fields.get("add_generation_prompt", True),
                    continue_final_message=req.fields.get("continue_final_message", False))
            else:
                req = protocol.completion_request(body, self.model_name)
            ids = checks.prompt(req.prompt, llm.config.vocab_size, llm.tokenizer)
            # a chat's default is the rest of the context, or of the pool where that is smaller (a request
            # holds at most prompt + max_tokens - 1 tokens of KV: inflight.engine.liveness.max_kv_tokens),
            # for each of its n samples side by side (a bad n is refused below, by the engine's check)
            room = samples_room(max(req.sampling.get("n", 1), 1), len(ids), llm.max_model_len, llm.num_blocks,
                                llm.block_size)
            default = room if chat else protocol.DEFAULT_COMPLETION_TOKENS
            want = req.sampling.get("max_tokens", default)
            # a prompt that fits but leaves no room for max_tokens is refused, as vLLM does (the engine would cut
            # it short); a prompt too long by itself gets the engine's own message from check_request
            if type(want) is int and len(ids) <= llm.max_model_len < len(ids) + want:
                raise ValueError(f"max_tokens={want} and the prompt's {len(ids)} tokens exceed the model's "
                                 f"context of {llm.max_model_len} tokens")
            ids, params = llm.check_request(ids, req.params(max(default, 1)))
        except (ValueError, TypeError) as exc:
            raise RequestError(str(exc), param=_param(str(exc), body, chat)) from None
        return req, ids, params

    def report_ignored(self, names: list[str], chat: bool) -> None:
        """Count the fields a request carried that the server does not know, and log each new set of them."""
        if not names:
            return
        if self.metrics is not None:
            self.metrics.fields_ignored(names)
        key = frozenset(names)
        if key not in self._logged and len(self._logged) < MAX_LOGGED_FIELD_SETS:
            self._logged.add(key)
            logger.warning("The following fields were present in a request to %s but ignored (this server does not "
                           "know them; counted in inflight:request_ignored_fields_total): %s",
                           "/v1/chat/completions" if chat else "/v1/completions",
                           ", ".join(checks.show(n, 64) for n in names[:20]) + (" ..." if len(names) > 20 else ""))


def _param(message: str, body: dict, chat: bool) -> str | None:
    """The request field an engine message is about, for OpenAI's `param`: the engine's messages
    begin with the argument they name ("max_tokens must be ...", "stop[0] is ..."); a chat's prompt
    is its messages, and its max_tokens may have come as max_completion_tokens."""
    word = re.match(r"[a-z_]*", message).group(0)
    if chat and word not in body:
        word = {"prompt": "messages", "max_tokens": "max_completion_tokens"}.get(word, word)
    return word if word in body else None


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


def _error(exc: RequestError, headers: dict | None = None) -> Response:
    if exc.status == 503:
        headers = {**(headers or {}), "Retry-After": str(RETRY_AFTER_S)}
    # (ASCII-escaped: a message that quotes the client's input must not fail to encode)
    return Response(json.dumps(exc.body()), status_code=exc.status, headers=headers, media_type="application/json")


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


class _EventStream(StreamingResponse):
    """A Server-Sent Events response that closes its request's stream however the response ends:
    finished, failed, or cancelled because the client left — also before the body began, when
    Starlette never starts the body's generator (whose own `finally` would close it)."""

    def __init__(self, deltas: RequestStream, body: AsyncIterator[str]):
        super().__init__(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.deltas = deltas

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.deltas.close()


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
