"""Poll a kernel's shell channel in one-second slices, so that a cell with widgets ends on time.

While a cell's ipywidgets send comm messages (chapter 3's explorer, with Jupyter's inline
matplotlib backend), one long asyncio poll of the shell socket can miss the execute reply and
return only when the cell's timeout runs out (jupyter/nbclient#312): the cell then "takes" the
whole timeout, or fails with it. A fresh poll sees the waiting reply at once, so `get_msg` polls
again every second until its own timeout. Used by the book build (as a Sphinx extension, before
myst-nb executes anything); `patch_blocking` does the same for jupyter_client's blocking client,
which nbval drives its kernels with (`.ci/nbval_inflight.py`): an async channel in jupyter_client 7
(Colab's 7.4.9), a plain zmq one in 8.
"""
from __future__ import annotations

import inspect
import time
from queue import Empty


async def _sliced_get_msg(self, timeout: float | None = None) -> dict:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
        if await self.socket.poll(int(left * 1000)):
            return await self._recv()
        if deadline is not None and time.monotonic() >= deadline:
            raise Empty


def _sliced_get_msg_sync(self, timeout: float | None = None) -> dict:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
        if self.socket.poll(int(left * 1000)):
            return self._recv()
        if deadline is not None and time.monotonic() >= deadline:
            raise Empty


def patch() -> None:
    from jupyter_client.channels import AsyncZMQSocketChannel  # jupyter_client 8

    AsyncZMQSocketChannel.get_msg = _sliced_get_msg


def patch_blocking() -> None:
    """The same slices for `jupyter_client.BlockingKernelClient`'s channels (nbval's client)."""
    from jupyter_client.blocking.client import BlockingKernelClient

    channel = BlockingKernelClient.shell_channel_class
    channel = getattr(channel, "klass", channel)  # a traitlets Type
    sliced = _sliced_get_msg if inspect.iscoroutinefunction(channel.get_msg) else _sliced_get_msg_sync
    channel.get_msg = sliced


def setup(app):
    patch()
    return {"parallel_read_safe": True, "parallel_write_safe": True}
