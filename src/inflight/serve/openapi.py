"""The server's OpenAPI document (`GET /openapi.json`): every endpoint with its request body (the
request models built from the field table) and its responses (`inflight.serve.responses`).

The handlers read their bodies themselves (the body limit, NaN and lone surrogates must be refused
before anything parses them), so FastAPI cannot see the request models in their signatures: each
route declares its body here (`openapi_extra`, as FastAPI's documentation shows for handlers that
read the request themselves) and `install` adds the models' schemas to the document's components.
A contract tester (schemathesis, in the tests) generates requests from this document and checks
every answer against it.
"""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from inflight.serve import responses
from inflight.serve.protocol import ChatCompletionRequest, CompletionRequest

__all__ = ["HEALTH", "MODELS", "MODEL", "METRICS", "generation", "install"]

_ERROR = {"model": responses.ErrorResponse}
HEALTH = {200: {"description": "The engine loop runs (an empty body)."},
          503: {"description": "The engine loop is not running.", **_ERROR}}
MODELS = {200: {"model": responses.ModelList, "description": "The one model this server serves."}}
MODEL = {200: {"model": responses.ModelCard, "description": "The model."},
         404: {"description": "This server does not serve that model.", **_ERROR}}
METRICS = {200: {"description": "Prometheus' text format (vLLM's metric names under `inflight:`).",
                 "content": {"text/plain": {"schema": {"type": "string"}}}}}


def _events(chunk: str) -> dict:
    """One Server-Sent Event of a stream (Open API 3.1: `schema` describes each event): its data is a
    chunk, an error object, or the closing `[DONE]`."""
    ref = "#/components/schemas/"
    data = {"type": "string", "if": {"const": "[DONE]"}, "else": {
        "contentMediaType": "application/json",
        "contentSchema": {"anyOf": [{"$ref": ref + chunk}, {"$ref": ref + "ErrorResponse"}]}}}
    return {"type": "object", "required": ["data"], "properties": {"data": data, "event": {"type": "string"}}}


def generation(chat: bool) -> dict[str, Any]:
    """The route arguments of /v1/completions or /v1/chat/completions: summary, request body, responses."""
    request = (ChatCompletionRequest if chat else CompletionRequest).__name__
    answer, chunk = (responses.ChatCompletionResponse, "ChatCompletionChunk") if chat else \
        (responses.CompletionResponse, "CompletionChunk")
    return {
        "summary": "Chat completion" if chat else "Text completion",
        "description": "Fields the server does not know are accepted, ignored and reported; every known field is "
                       "checked by type and by its rule (see each field's description).",
        "openapi_extra": {"requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{request}"}}}}},
        "responses": {
            200: {"model": answer, "description": "The answer; with `stream: true`, Server-Sent Events, each "
                  f"`data: ` and a {chunk} object, ending with `data: [DONE]`.",
                  "content": {"text/event-stream": {"schema": _events(chunk)}}},
            400: {"description": "The request is invalid: the message names the field and the problem.", **_ERROR},
            401: {"description": "A key is required (--api-key) and this one is missing or wrong.", **_ERROR},
            404: {"description": "This server does not serve that model.", **_ERROR},
            413: {"description": "The body is larger than --max-body-bytes.", **_ERROR},
            500: {"description": "The request failed in the engine (the others go on).", **_ERROR},
            503: {"description": "The engine loop is not running, or the waiting queue is full (Retry-After).",
                  **_ERROR},
        },
    }


def install(app: FastAPI, roles: tuple[str, ...]) -> None:
    """Make `app.openapi()` return the document with the request models (and the stream chunks) in it;
    `roles` are the chat roles this server's chat template takes."""

    def document() -> dict:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for model in (CompletionRequest, ChatCompletionRequest, responses.CompletionChunk,
                          responses.ChatCompletionChunk):
                schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(schema.pop("$defs", {}))
                schemas[model.__name__] = schema
            for operation in (op for item in doc["paths"].values() for op in item.values()):
                operation["responses"].pop("422", None)  # (FastAPI's, for a path parameter: never answered here)
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            _chat_rules(schemas, roles)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = document


def _chat_rules(schemas: dict, roles: tuple[str, ...]) -> None:
    """The rules `protocol.chat_request` applies to messages, in the schema: the template's roles,
    text parts only, content null only for an assistant, no tool calls."""
    message, part = schemas["ChatMessage"], schemas["ContentPart"]
    message["properties"]["role"]["enum"] = list(roles)
    message["properties"]["tool_calls"]["anyOf"][0]["maxItems"] = 0
    message["if"] = {"properties": {"role": {"const": "assistant"}}}
    message["else"] = {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}}
    part["properties"]["type"]["enum"] = ["text"]
    part["properties"]["text"] = {"type": "string", "title": "Text"}
    part["required"] = ["type", "text"]
