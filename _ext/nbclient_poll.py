"""Poll a kernel's shell channel in one-second slices, so that a cell with widgets ends on time.

While a cell's ipywidgets send comm messages (chapter 3's explorer, with Jupyter's inline
matplotlib backend), one long asyncio poll of the shell socket can miss the execute reply and
return only when the cell's timeout runs out (jupyter/nbclient#312): the cell then "takes" the
whole timeout, or fails with it. A fresh poll sees the waiting reply at once, so `get_msg` polls
again every second until its own timeout. Used by the book build (as a Sphinx extension, before
myst-nb executes anything) and by `.ci/run_notebooks.py`.
"""
from __future__ import annotations

import time
from queue import Empty

from jupyter_client.channels import AsyncZMQSocketChannel


async def _sliced_get_msg(self, timeout: float | None = None) -> dict:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
        if await self.socket.poll(int(left * 1000)):
            return await self._recv()
        if deadline is not None and time.monotonic() >= deadline:
            raise Empty


def patch() -> None:
    AsyncZMQSocketChannel.get_msg = _sliced_get_msg


def setup(app):
    patch()
    return {"parallel_read_safe": True, "parallel_write_safe": True}
