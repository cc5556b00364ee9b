"""Ctrl-C held back while a tensor-parallel driver talks to its workers.

A step is sent to every rank in turn; a KeyboardInterrupt between two of those sends would leave
the ranks that got it alone in an all-reduce the others never join. So the interrupt is caught for
the length of the sends and delivered right after (`sigint_deferred`).
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager

__all__ = ["sigint_deferred"]


@contextmanager
def sigint_deferred():
    """Ctrl-C arrives after the block, not inside it. Done in Python, not with the thread's signal
    mask: blocking SIGINT in this thread only hands it to another (this process has torch's TCPStore
    thread and others), whose C handler still has KeyboardInterrupt raised here, in the middle of the
    block. Only the main thread ever receives KeyboardInterrupt, so elsewhere there is nothing to do."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield  # (None: a handler set outside Python, which could not be put back)
        return
    caught: list = []
    try:
        old = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    except (ValueError, OSError):  # (no signals here: an embedded interpreter)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if caught:  # what the interrupt would have done, now the block is whole
            if callable(old):
                old(signal.SIGINT, caught[0])
            elif old == signal.SIG_DFL:
                os.kill(os.getpid(), signal.SIGINT)
