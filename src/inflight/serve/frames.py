"""Length-prefixed frames over a socket: a JSON header and an optional binary body (a KV payload).
What the disaggregated servers (`inflight.serve.disagg`) and their client speak; no engine code."""
from __future__ import annotations

import json
import socket
import struct

__all__ = ["send_frame", "recv_frame"]

_HEAD = struct.Struct("!IQ")  # header bytes, body bytes
MAX_HEADER = 1 << 24
MAX_BODY = 1 << 34


def send_frame(sock: socket.socket, header: dict, body: bytes = b"") -> None:
    head = json.dumps(header).encode()
    sock.sendall(_HEAD.pack(len(head), len(body)) + head)
    if body:
        sock.sendall(body)


def _exactly(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError(f"the peer closed the connection {got} bytes into a {n}-byte read")
        got += k
    return buf


def recv_frame(sock: socket.socket) -> tuple[dict, bytearray]:
    """The next frame: (header, body); ConnectionError when the peer has gone."""
    nh, nb = _HEAD.unpack(_exactly(sock, _HEAD.size))
    if nh > MAX_HEADER or nb > MAX_BODY:
        raise ConnectionError(f"a frame of {nh} + {nb} bytes is not one of ours")
    return json.loads(_exactly(sock, nh)), (_exactly(sock, nb) if nb else bytearray())
