"""The C kernels' own threads: idle members spin while the machine is quiet and sleep when it isn't.

torch's CPU wheel runs its operators on GNU OpenMP, and the C kernels (attention, the fused passes,
the skinny GEMMs), built with `-fopenmp`, share that very runtime (torch's wheel ships `libgomp.so.1`
under the system's soname, so one copy serves both): one team of threads, whose idle members either
spin for a few milliseconds after every parallel region (the default) or sleep at once
(`OMP_WAIT_POLICY=PASSIVE`), decided once, when torch loads, by whoever imported first. A decode
step runs twenty-odd short regions, so that one choice is a cliff either way: sleeping threads pay
a wake-up in every region on a quiet machine; spinning ones collapse beside a busy program (a region
waits at its end for a descheduled thread while the spinners burn the time it needs).

So the kernels can also run on a small pool of their own (`csrc/thread_pool.c`, plain pthreads and
futexes), whose waiting threads spin for `spin_ns` and then sleep. Before every step the engine's
`ThreadGovernor` (`inflight.engine.thread_governor`) puts the kernels on whichever team waits the
right way for the machine as it is -- torch's, when its fixed policy happens to be right, else this
pool, set to spin or to sleep -- and sets the kernels' thread count. Outside an engine step the
kernels run on torch's team where its threads spin, else on the pool (spinning briefly).

`INFLIGHT_THREAD_POOL=0` leaves the kernels on OpenMP (how `python -m inflight.bench.protocol.busy` measures
what the pool is worth); without a C compiler nothing here runs and neither do the kernels.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch

from inflight import checks
from inflight.model import c_build
from inflight.threads import passive_wait_in_effect

__all__ = ["load", "build_error", "wanted", "attach", "threads", "use", "on_openmp", "set_spin", "spin", "stats", "QUIET_SPIN_NS",
           "BACKENDS"]

SOURCE = Path(__file__).with_name("csrc") / "thread_pool.c"
FLAGS = ["-O2", "-shared", "-fPIC", "-std=gnu11", "-pthread"]
SYMBOLS = ("inflight_pool_for", "inflight_pool_set_spin", "inflight_pool_stats")
POOL_VAR = "INFLIGHT_THREAD_POOL"
#: how long an idle thread spins before it sleeps while the machine is quiet: longer than the gaps
#: between a step's kernels (tens of microseconds of Python), shorter than the gap between steps
QUIET_SPIN_NS = int(float(os.environ.get("INFLIGHT_POOL_SPIN_US", "200")) * 1000)
#: what `inflight_parallel_backend()` of a kernel library answers
BACKENDS = {0: "one thread", 1: "OpenMP", 2: "inflight thread pool"}


def _declare(lib: ctypes.CDLL) -> None:
    lib.inflight_pool_set_spin.argtypes = [ctypes.c_int64]
    lib.inflight_pool_set_spin.restype = ctypes.c_int64
    lib.inflight_pool_stats.argtypes = [ctypes.c_void_p]
    lib.inflight_pool_stats.restype = None
    lib.inflight_pool_set_spin(QUIET_SPIN_NS)


_library = c_build.LazyLibrary(SOURCE, FLAGS, SYMBOLS, _declare, openmp=False)
_attached: list[ctypes.CDLL] = []  # the kernel libraries that run on the pool
# for the current step (the governor's choice): "threads", the kernels' team (None: torch's count);
# "openmp", whether the kernels run on torch's OpenMP team instead -- by default where torch's idle
# threads spin (two teams would fight over the cores); "spin_ns", the spin last set
_step: dict = {"threads": None, "openmp": not passive_wait_in_effect()}


def load() -> ctypes.CDLL | None:
    """The compiled pool (built on first use, cached per machine by `c_build`), or None."""
    return _library.load()


def build_error() -> str | None:
    return _library.build_error()


def wanted() -> bool:
    """Whether the kernels should run on the pool: yes unless `INFLIGHT_THREAD_POOL=0`."""
    return not checks.switched_off(POOL_VAR)


def attach(kernels: ctypes.CDLL) -> str:
    """Give a kernel library (one built with `parallel.h`) the pool, when it can have it; returns the
    threads its work now runs on (a value of `BACKENDS`)."""
    pool = load() if wanted() else None
    kernels.inflight_parallel_backend.restype = ctypes.c_int
    if pool is not None:
        _attached.append(kernels)
        if not _step["openmp"]:
            kernels.inflight_use_pool(ctypes.cast(pool.inflight_pool_for, ctypes.c_void_p))
    return BACKENDS[kernels.inflight_parallel_backend()]


def threads() -> int:
    """The kernels' team for the current step: what the governor chose, else torch's thread count."""
    return _step["threads"] or torch.get_num_threads()


def use(threads: int | None = None, openmp: bool = False) -> None:
    """From now on the kernels run on `threads` threads (None: torch's count), on OpenMP -- torch's
    own team -- instead of the pool if `openmp`. (When torch's idle threads spin, a second team would
    fight them for the cores: the governor then puts the kernels on torch's team while the machine
    is quiet.)"""
    _step["threads"] = threads
    if openmp == _step["openmp"]:
        return
    _step["openmp"] = openmp
    pool = load()
    for kernels in _attached:
        kernels.inflight_use_pool(None if openmp or pool is None else ctypes.cast(pool.inflight_pool_for, ctypes.c_void_p))


def on_openmp() -> bool:
    """Whether the kernels run on torch's OpenMP team now (rather than the pool)."""
    return _step["openmp"]


def set_spin(ns: int) -> None:
    """How long the pool's idle threads (and a caller waiting for them) spin before they sleep, from
    now on: 0 sleeps at once. A no-op where the pool isn't built or hasn't changed."""
    ns = max(0, int(ns))
    if _step.get("spin_ns") == ns:
        return
    pool = load()
    if pool is not None:
        pool.inflight_pool_set_spin(ns)
        _step["spin_ns"] = ns


def spin() -> int | None:
    """The spin in force (nanoseconds), or None without the pool."""
    s = stats()
    return None if s is None else s["spin_ns"]


def stats() -> dict[str, int] | None:
    """Since the process started: jobs shared out over threads, sleeping threads woken, threads
    started (the caller's included), the spin in force, pieces handed out, and pieces the caller ran
    beyond its share because a worker had not claimed them yet (it was waking up, or another program
    held its core). None without the pool."""
    pool = load()
    if pool is None:
        return None
    out = (ctypes.c_uint64 * 6)()
    pool.inflight_pool_stats(out)
    return {"jobs": out[0], "wakeups": out[1], "threads": out[2], "spin_ns": out[3], "pieces": out[4],
            "taken_by_caller": out[5]}
