"""A request that is not HTTP/1.1 at all gets its 400 in OpenAI's JSON error shape.

uvicorn's HTTP parser (httptools, or h11) refuses bytes it cannot read as a request — a bad request
line, a malformed header, a broken chunked body — before the app ever sees them, and answers with
a plain-text 400 ("Invalid HTTP request received.") of its own. `json_400_protocol()` is uvicorn's
protocol class with that one answer replaced by an OpenAI error object, so that a client's error
handling sees the same shape for every error.

What cannot be made JSON, and is not: a parser error on a connection whose previous response is
still being written (a client pipelining garbage behind a stream) closes the connection, since a
second response cannot be put in the middle of the first (uvicorn would write one there); and
bytes that were never meant as HTTP/1.1 (a TLS handshake on the plain port, HTTP/2's preface) get
the JSON 400 all the same, which such a client cannot read.
"""
from __future__ import annotations

import json
from typing import Any

__all__ = ["json_400_protocol", "FRAMING_ERROR"]

FRAMING_ERROR = ("Invalid HTTP request received: the bytes are not an HTTP/1.1 request this server can read "
                 "(refused by the HTTP parser, before any endpoint saw them)")


def _body() -> bytes:
    return json.dumps({"error": {"message": FRAMING_ERROR, "type": "invalid_request_error", "param": None,
                                 "code": None}}).encode()


def _mid_response(protocol: Any) -> bool:
    cycle = getattr(protocol, "cycle", None)
    return cycle is not None and cycle.response_started and not cycle.response_complete


def json_400_protocol(http: str = "auto") -> type:
    """uvicorn's HTTP protocol class ("auto": httptools where installed, as uvicorn picks, else h11)
    whose framing-error answer is OpenAI's error object."""
    if http in ("auto", "httptools"):
        try:
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        except ImportError:  # (httptools is not installed: uvicorn itself falls back to h11)
            if http == "httptools":
                raise
        else:
            return _httptools(HttpToolsProtocol)
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return _h11(H11Protocol)


def _httptools(base: type) -> type:
    class JSONErrorHttpTools(base):  # type: ignore[misc, valid-type]
        def send_400_response(self, msg: str) -> None:
            if _mid_response(self):
                self.transport.close()
                return
            body = _body()
            head = [b"HTTP/1.1 400 Bad Request\r\n"]
            head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
            head += [b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(body),
                     b"connection: close\r\n\r\n"]
            self.transport.write(b"".join(head) + body)
            self.transport.close()

    return JSONErrorHttpTools


def _h11(base: type) -> type:
    import h11

    class JSONErrorH11(base):  # type: ignore[misc, valid-type]
        def send_400_response(self, msg: str) -> None:
            if _mid_response(self):
                self.transport.close()
                return
            body = _body()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       (b"connection", b"close")]
            out = self.conn.send(h11.Response(status_code=400, headers=headers, reason=b"Bad Request"))
            out += self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage())
            self.transport.write(out)
            self.transport.close()

    return JSONErrorH11
