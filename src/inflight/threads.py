"""CPU threads: how torch should use the cores, and whether other programs are using them too.

torch runs its CPU operators on a team of OpenMP threads (GNU OpenMP in PyTorch's Linux wheels).
Between two parallel regions an idle member of the team *spins*, waiting for work, before it goes
to sleep (for milliseconds by default: 8 ms measured on the book's machine); at the end of every region all members wait for the slowest.
On an idle machine that is fast. On a busy one it collapses: when another program holds a core, one
of torch's threads is descheduled, every parallel region waits at its barrier until it runs again,
and meanwhile the spinning threads burn the CPU time the descheduled one needs.
`OMP_WAIT_POLICY=PASSIVE` makes idle threads sleep at once instead, at the price of a wake-up in
every region, which costs a quiet machine dearly when a step is many short regions.

So `import inflight` asks for a short spin: PASSIVE, and `GOMP_SPINCOUNT=10000` (GNU OpenMP's own
count, which takes precedence over the policy: about a third of a millisecond of spinning on the
book's machine, then sleep). That bridges
the gaps between one step's operators, and a thread waiting for a descheduled teammate goes to sleep
before it has burnt much of the core the teammate needs. (Other OpenMP runtimes ignore the count
and read PASSIVE.) OpenMP reads both once, when torch's library loads, so they have to be in the
environment *before* `import torch`: `import inflight` sets them when torch is not loaded yet and
neither `OMP_WAIT_POLICY` nor `GOMP_SPINCOUNT` is set; your own settings are left alone.

Either way the engine is fast: its C kernels can run on a pool of their own whose waiting the
engine's `ThreadGovernor` (`inflight.engine.thread_governor`) sets before every step from the load
it reads here, and it keeps torch's own team from spinning beside a busy program.
`configure_threads()` gives torch every core (or the count you ask for). `machine_load()` says
whether other programs compete for the cores, so that a measurement taken on a busy machine can be
flagged as such.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

from inflight import checks

__all__ = ["ThreadConfig", "MachineLoad", "LoadWatch", "configure_threads", "machine_load", "other_runnable",
           "passive_wait_in_effect", "openmp_idle_wait", "set_by_inflight", "environment_for_child", "usable_cores",
           "adaptive_threads_wanted",
           "BUSY_RUNNABLE", "SHORT_SPIN"]

WAIT_POLICY_VAR = "OMP_WAIT_POLICY"
SPIN_VAR = "GOMP_SPINCOUNT"
#: the spin count `import inflight` asks GNU OpenMP for: about 0.35 ms of spinning on the book's
#: machine (libgomp reckons 100,000 spins a millisecond; measured there 0.38 ms, against 8 ms for the
#: default 300,000) -- longer than the Python between one step's operators (tens of microseconds),
#: far shorter than the default
SHORT_SPIN = "10000"
#: spin counts up to this (about a millisecond) count as a short spin
_SHORT_SPIN_MAX = 100_000
ADAPT_VAR = "INFLIGHT_ADAPT_THREADS"  # "0": engines keep the thread count they were given
#: a machine is "busy" when, on average, at least this many other threads were runnable (or other
#: programs kept this many cores busy during a run)
BUSY_RUNNABLE = 0.5

# Recorded once, when `import inflight` runs this module: what OpenMP will see when torch loads.
_POLICY_BEFORE_INFLIGHT = os.environ.get(WAIT_POLICY_VAR)
_SPIN_BEFORE_INFLIGHT = os.environ.get(SPIN_VAR)
_TORCH_LOADED_BEFORE_INFLIGHT = "torch" in sys.modules
_SET_HERE: dict[str, str] = {}  # what this module put in the environment
if not _TORCH_LOADED_BEFORE_INFLIGHT and _POLICY_BEFORE_INFLIGHT is None and _SPIN_BEFORE_INFLIGHT is None:
    _SET_HERE = {WAIT_POLICY_VAR: "PASSIVE", SPIN_VAR: SHORT_SPIN}
    os.environ.update(_SET_HERE)


def set_by_inflight() -> dict[str, str]:
    """The variables `import inflight` put in this process's environment (and so in its children's,
    unless they are taken out again: `inflight.bench.protocol.fair` does, so that a peer runs as it would
    without us)."""
    return dict(_SET_HERE)


def environment_for_child(**extra: str) -> dict[str, str]:
    """This process's environment without what `import inflight` put there, plus `extra`: what a
    program started from here should see, so that it runs as it would if started by hand (a peer is
    not measured under our OpenMP settings; an inflight child sets its own when it imports inflight)."""
    return {**{k: v for k, v in os.environ.items() if k not in _SET_HERE}, **extra}


def _spin_count(text: str | None) -> float | None:
    """GNU OpenMP's GOMP_SPINCOUNT: a count with an optional k/M/G/T, or "infinite"; None if unset or
    unreadable (libgomp then ignores it too)."""
    if text is None:
        return None
    t = text.strip().lower()
    if t in ("infinite", "infinity"):
        return float("inf")
    scale = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}.get(t[-1:], 1)
    try:
        return float(t[:-1] if scale != 1 else t) * scale
    except ValueError:
        return None


def openmp_idle_wait() -> str:
    """How torch's idle OpenMP threads wait for work, from the environment torch loaded with:
    "sleep" (PASSIVE, or a spin count of 0), "short spin" (a spin count up to about a millisecond:
    what `import inflight` asks for) or "spin" (the library's default, ACTIVE, or a long count)."""
    # what inflight set, else the environment as inflight found it (when torch came first, assumed to
    # be what torch loaded with)
    policy = _SET_HERE.get(WAIT_POLICY_VAR, _POLICY_BEFORE_INFLIGHT) or ""
    spins = _spin_count(_SET_HERE.get(SPIN_VAR, _SPIN_BEFORE_INFLIGHT))
    if spins is None:  # no count: the policy decides (GNU OpenMP: no spin for PASSIVE, milliseconds otherwise)
        return "sleep" if policy.strip().upper() == "PASSIVE" else "spin"
    if spins == 0:
        return "sleep"
    return "short spin" if spins <= _SHORT_SPIN_MAX else "spin"


def passive_wait_in_effect() -> bool:
    """Whether torch's OpenMP threads sleep at once when idle (PASSIVE without a spin count, set by
    you before torch loaded)."""
    return openmp_idle_wait() == "sleep"


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity on Linux, else every core)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class ThreadConfig:
    """What `configure_threads` chose, and why."""

    threads: int
    cores: int
    passive_wait: bool
    reason: str
    idle_wait: str = "spin"  # `openmp_idle_wait()`: "sleep", "short spin" or "spin"


def configure_threads(threads: int | None = None) -> ThreadConfig:
    """Set torch's intra-op threads for this process and say why (`threads` overrides the policy).

    The policy: every usable core, whatever the wait policy. (It used to be one thread unless idle
    threads slept, because spinning threads collapse beside a busy program; the engine's
    `ThreadGovernor` now takes care of that step by step, and one thread halved every quiet run.)"""
    import torch

    cores = usable_cores()
    wait = openmp_idle_wait()
    passive = wait == "sleep"
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive int, got {threads!r}")
        reason = "asked for"
    else:
        threads, reason = cores, ("every core: the engine's ThreadGovernor fits each step to the machine (idle "
                                  f"OpenMP threads: {wait})")
    torch.set_num_threads(threads)
    return ThreadConfig(threads, cores, passive, reason, wait)


@dataclass(frozen=True)
class MachineLoad:
    """How busy the machine is right now, apart from this process."""

    cores: int
    loadavg: tuple[float, float, float]  # 1, 5 and 15 minutes (this process included when it ran)
    other_runnable: float                # mean number of *other* runnable threads over the sampling
    cpu_pressure: float | None = None    # Linux PSI: % of the last 10 s some task waited for a CPU
    runnable_names: list[str] = field(default_factory=list)  # the other runnable processes, at one sample

    @property
    def busy(self) -> bool:
        """Other programs compete for the cores: numbers measured now are not this program's alone."""
        return self.other_runnable >= BUSY_RUNNABLE

    def as_dict(self) -> dict:
        return {"cores": self.cores, "loadavg": list(self.loadavg), "other_runnable": self.other_runnable,
                "cpu_pressure": self.cpu_pressure, "runnable_names": self.runnable_names, "busy": self.busy}


def machine_load(seconds: float = 0.2, samples: int = 10) -> MachineLoad:
    """Sample how many threads of other programs are runnable (Linux: `/proc/loadavg` less this
    process's own; elsewhere the 1-minute load average stands in) over `seconds`."""
    counts = []
    for i in range(samples):
        others = other_runnable()
        if others is None:
            break
        counts.append(others)
        if i + 1 < samples:
            time.sleep(seconds / samples)
    try:
        avg = tuple(float(x) for x in os.getloadavg())
    except (AttributeError, OSError):
        avg = (0.0, 0.0, 0.0)
    others = sum(counts) / len(counts) if counts else avg[0]
    return MachineLoad(usable_cores(), avg, others, _cpu_pressure(), _runnable_names())


class _LoadavgReader:
    """The running-threads field of `/proc/loadavg`, read often (the ThreadGovernor reads it every
    step): the file stays open and each read is one `pread`, a few microseconds; opening it again
    each time costs ten times that."""

    def __init__(self):
        try:
            self._fd: int | None = os.open("/proc/loadavg", os.O_RDONLY)
        except (OSError, AttributeError):  # not Linux
            self._fd = None

    def __call__(self) -> int | None:
        if self._fd is None:
            return None
        try:
            return int(os.pread(self._fd, 128, 0).split()[3].split(b"/")[0])
        except (OSError, ValueError, IndexError):
            return None

    def __del__(self):
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)


class _OwnThreads:
    """How many of this process's own threads are running or runnable right now (Linux
    `/proc/self/task/*/stat`). `/proc/loadavg` counts them too: a worker of torch's OpenMP team
    that has just finished a parallel region is still runnable for a moment on its way to sleep,
    and must not be mistaken for another program. The stat files stay open (one `pread` each); the
    list of threads is read again each time, since OpenMP and torch start theirs lazily."""

    def __init__(self):
        self._fds: dict[str, int] = {}

    def __call__(self) -> int:
        try:
            tids = os.listdir("/proc/self/task")
        except OSError:
            return 1  # at least the thread asking
        for gone in self._fds.keys() - set(tids):
            os.close(self._fds.pop(gone))
        running = 0
        for tid in tids:
            try:
                if tid not in self._fds:
                    self._fds[tid] = os.open(f"/proc/self/task/{tid}/stat", os.O_RDONLY)
                stat = os.pread(self._fds[tid], 512, 0)
            except OSError:  # the thread ended between the listing and the read
                continue
            state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]
            running += state == b"R"
        return max(1, running)

    def __del__(self):
        for fd in getattr(self, "_fds", {}).values():
            os.close(fd)


_loadavg: _LoadavgReader | None = None  # one open file for the process
_own: _OwnThreads | None = None


def _running_threads() -> int | None:
    """Threads running or runnable right now, on the whole machine, this one included (Linux
    `/proc/loadavg`; else None)."""
    global _loadavg
    if _loadavg is None:
        _loadavg = _LoadavgReader()
    return _loadavg()


def other_runnable() -> int | None:
    """Threads of *other* programs running or runnable right now (Linux; else None).

    The machine's count minus this process's own runnable threads. The two are read a moment apart,
    so the machine's is read on both sides of this process's and the smaller taken: a worker of ours
    that fell asleep in between is then not counted as someone else. On a quiet machine the first
    read usually says 1 (the reader) and the rest is skipped."""
    global _own
    first = _running_threads()
    if first is None or first <= 1:
        return None if first is None else 0
    if _own is None:
        _own = _OwnThreads()
    mine = _own()
    second = _running_threads()
    return max(0, min(first, second if second is not None else first) - mine)


def _cpu_pressure() -> float | None:
    try:
        with open("/proc/pressure/cpu") as f:
            some = f.readline().split()
    except OSError:
        return None
    fields = dict(kv.split("=") for kv in some[1:] if "=" in kv)
    return float(fields["avg10"]) if "avg10" in fields else None


def _runnable_names() -> list[str]:
    """Names of the other processes that are running or runnable now (Linux; empty elsewhere)."""
    names = []
    me = os.getpid()
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit() and int(p) != me]
    except OSError:
        return names
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name, rest = stat[stat.find("(") + 1:stat.rfind(")")], stat[stat.rfind(")") + 2:]
        if rest[:1] == "R":
            names.append(name)
    return sorted(names)


def _busy_jiffies() -> int | None:
    """CPU time (clock ticks) all cores spent on anything but idling, since boot (Linux /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    guest = sum(fields[8:10]) if len(fields) > 9 else 0  # already counted in user/nice
    return sum(fields) - idle - guest


class LoadWatch:
    """Watches a measurement: the machine's load before and after, and how many cores *other*
    programs kept busy while it ran (all cores' busy time from /proc/stat, minus this process's).

        with LoadWatch() as watch:
            run_the_benchmark()
        watch.busy, watch.as_dict()
    """

    def __init__(self, sample_seconds: float = 0.2):
        self.sample_seconds = sample_seconds
        self.before: MachineLoad | None = None
        self.after: MachineLoad | None = None
        self.wall_seconds = 0.0
        self.cpu_seconds = 0.0
        self.other_cores: float | None = None

    def __enter__(self) -> "LoadWatch":
        self.before = machine_load(self.sample_seconds)
        self._t0, self._c0, self._j0 = time.perf_counter(), time.process_time(), _busy_jiffies()
        return self

    def __exit__(self, *exc) -> None:
        self.wall_seconds = time.perf_counter() - self._t0
        self.cpu_seconds = time.process_time() - self._c0
        j1 = _busy_jiffies()
        if self._j0 is not None and j1 is not None and self.wall_seconds > 0:
            busy = (j1 - self._j0) / os.sysconf("SC_CLK_TCK")
            self.other_cores = max(0.0, busy - self.cpu_seconds) / self.wall_seconds
        self.after = machine_load(self.sample_seconds)

    @property
    def busy(self) -> bool:
        """Other programs competed for the cores before, during or after the measurement."""
        during = self.other_cores is not None and self.other_cores >= BUSY_RUNNABLE
        return during or bool(self.before and self.before.busy) or bool(self.after and self.after.busy)

    def as_dict(self) -> dict:
        return {"busy": self.busy, "other_cores_during": self.other_cores, "wall_s": self.wall_seconds,
                "cpu_s": self.cpu_seconds, "before": self.before.as_dict() if self.before else None,
                "after": self.after.as_dict() if self.after else None}


def adaptive_threads_wanted() -> bool:
    """Whether engines should fit their threads to the free cores (`ThreadGovernor`): yes unless
    `INFLIGHT_ADAPT_THREADS=0`."""
    return not checks.switched_off(ADAPT_VAR)
