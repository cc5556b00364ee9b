"""Build a small C source into a shared library once per machine, and load it only when it is whole.

The library lands in a cache folder (`$INFLIGHT_CACHE`, else `~/.cache/inflight`) under a name keyed
by the source, the compiler and its flags, and the CPU it was built on (`-march=native` code must not
reach a machine without those instructions, e.g. through a shared home folder). A build is checked
before anyone can see it: the compiler must succeed and write a file, a separate process must be
able to load it and find the functions, and its SHA-256 goes into a sidecar file written *before*
the library is renamed into place. Loading compares the library with its sidecar first, so a
truncated or foreign file is deleted and rebuilt instead of crashing the process inside `dlopen`.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from inflight import checks

__all__ = ["cache_dir", "cpu_id", "compiler", "library_path", "build", "build_kernel", "LazyLibrary", "turned_off",
           "profiled_call"]

_CHECK = "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); [getattr(lib, name) for name in sys.argv[2:]]"


class _Damaged(Exception):
    """A cached library that doesn't match its recorded digest, or lacks the functions."""


def cache_dir() -> Path:
    root = os.environ.get("INFLIGHT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "inflight")
    return Path(root)


def cpu_id() -> str:
    """What `-march=native` compiles for: the CPU's model and feature flags."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features", "CPU part"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


def compiler() -> list[str] | None:
    """The C compiler command (`$CC`, which may carry arguments, else `cc`), or None if it isn't installed."""
    cmd = shlex.split(os.environ.get("CC") or "cc")
    return cmd if cmd and shutil.which(cmd[0]) else None


def library_path(source: Path, cc: Sequence[str], flags: Sequence[str]) -> Path:
    # the headers beside the source (vec8.h) are part of what gets built: editing one rebuilds its users
    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    key = hashlib.sha256(source.read_bytes() + headers + " ".join([*cc, *flags, platform.machine(), cpu_id()]).encode())
    return cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_suffix(".sha256")


def _compile(source: Path, cc: list[str], flags: Sequence[str], target: Path, symbols: Sequence[str]) -> str | None:
    """Build into a temporary file, check it, then publish digest and library; the complaint, or None."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        r = subprocess.run([*cc, *flags, str(source), "-o", tmp, "-lm"], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            return (r.stderr or r.stdout).strip()[-500:] or f"{cc[0]} exited with {r.returncode}"
        if os.path.getsize(tmp) == 0:
            return f"{cc[0]} reported success but wrote nothing"
        r = subprocess.run([sys.executable, "-c", _CHECK, tmp, *symbols], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:  # loaded in another process: a bad build can't take this one down
            return f"the built library does not load: {(r.stderr or '').strip()[-300:] or r.returncode}"
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        side_tmp = tmp + ".sha256"
        Path(side_tmp).write_text(_digest(Path(tmp)))
        os.replace(side_tmp, _sidecar(target))  # the digest first: whoever sees the library can check it
        os.replace(tmp, target)
        return None
    finally:
        for leftover in (tmp, tmp + ".sha256"):
            if os.path.exists(leftover):
                os.unlink(leftover)


def _load(path: Path, symbols: Sequence[str]) -> ctypes.CDLL:
    side = _sidecar(path)
    if not side.exists() or side.read_text().strip() != _digest(path):
        raise _Damaged(f"{path.name} does not match its recorded digest")
    lib = ctypes.CDLL(str(path))
    missing = [s for s in symbols if not hasattr(lib, s)]
    if missing:
        raise _Damaged(f"{path.name} lacks {missing}")
    return lib


def turned_off() -> str | None:
    """Why the C code must not run (`INFLIGHT_CPU_KERNEL=0`: every operator stays on its torch
    reference), or None."""
    if checks.switched_off("INFLIGHT_CPU_KERNEL"):
        return "turned off by INFLIGHT_CPU_KERNEL=0"
    return None


def build(source: Path, flag_sets: Sequence[Sequence[str]], symbols: Sequence[str]) -> tuple[ctypes.CDLL | None, str | None]:
    """Load the cached library for the first flag set that works, building it if needed (a damaged
    cached copy is deleted and rebuilt once): (library, None), or (None, why not)."""
    cc = compiler()
    if cc is None:
        return None, f"no C compiler ({os.environ.get('CC') or 'cc'!r} not found)"
    errors = []
    for flags in flag_sets:
        target = library_path(source, cc, flags)
        for _attempt in range(2):
            try:
                err = None if target.exists() else _compile(source, cc, flags, target, symbols)
                if err is not None:
                    errors.append(err)
                    break
                return _load(target, symbols), None
            except (_Damaged, OSError, subprocess.SubprocessError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                for stale in (target, _sidecar(target)):
                    try:
                        stale.unlink()
                    except OSError:
                        pass
    return None, f"could not build {source.name}: {errors[-1]}"


def build_kernel(source: Path, flags: Sequence[str], symbols: Sequence[str],
                 declare: Callable[[ctypes.CDLL], None], openmp: bool = True) -> tuple[ctypes.CDLL | None, str | None]:
    """What every C file of the package goes through: nothing when `turned_off()`, else `build` (with
    OpenMP where the compiler has it, if `openmp`; without, where it hasn't), and `declare(lib)` to
    give the functions their argument types. (library, None), or (None, why not)."""
    off = turned_off()
    if off:
        return None, off
    lib, err = build(source, ([list(flags) + ["-fopenmp"]] if openmp else []) + [list(flags)], symbols)
    if lib is not None:
        declare(lib)
    return lib, err


class LazyLibrary:
    """One C file of the package, built and loaded on the first `load()` in this process (through
    `build_kernel`), then kept: `load()` gives the library or None, `build_error()` why not."""

    def __init__(self, source: Path, flags: Sequence[str], symbols: Sequence[str],
                 declare: Callable[[ctypes.CDLL], None], openmp: bool = True):
        self.source, self.flags, self.symbols, self.declare = source, list(flags), tuple(symbols), declare
        self.openmp = openmp
        self.tried = False
        self.lib: ctypes.CDLL | None = None
        self.error: str | None = None

    def load(self) -> ctypes.CDLL | None:
        if not self.tried:
            self.lib, self.error = build_kernel(self.source, self.flags, self.symbols, self.declare, self.openmp)
            self.tried = True
        return self.lib

    def build_error(self) -> str | None:
        """Why `load()` returned None (None if it hasn't been tried or it worked)."""
        return self.error

    def fresh(self) -> "LazyLibrary":
        """The same file, not yet loaded: the next `load()` looks again (tests swap it in)."""
        return LazyLibrary(self.source, self.flags, self.symbols, self.declare, self.openmp)


def profiled_call(name: str, fn, *args):
    """fn(*args) — a compiled function — inside a torch.profiler range called `name` when a profiler
    runs, so that op tables show the C code's time under its own name instead of its caller's."""
    import torch

    if torch.autograd.profiler._is_profiler_enabled:
        with torch.profiler.record_function(name):
            return fn(*args)
    return fn(*args)
