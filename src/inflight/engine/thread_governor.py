"""`ThreadGovernor`: before each engine step on a CPU, how many threads, on which team, waiting how.

Two teams of threads can run a step. torch's own (GNU OpenMP: the BLAS of large steps, big
elementwise operators) waits as it was told once, when torch loaded: its idle threads spin for a few
milliseconds (torch imported first, the library's default), for about a third of one (`import
inflight` first asks for that short spin) or not at all (`OMP_WAIT_POLICY=PASSIVE` set by you). The
C kernels (attention, the fused passes, the skinny GEMMs) run
on the package's pool (`inflight.model.thread_pool`), whose waiting this governor sets step by step.
A decode step is twenty-odd short parallel regions, so the waiting is the cost:

- threads that sleep pay a wake-up in every region of a quiet machine;
- threads that spin collapse beside a busy program: a region waits at its end for a descheduled
  teammate while the spinners burn the time it needs;
- two teams whose idle threads both want the cores fight each other.

Before each step the governor reads how many threads of *other* programs are runnable
(`inflight.threads.other_runnable`: `/proc/loadavg` less this process's own, whose workers are
still runnable for a moment after each region) and averages that over the last few steps, so that a
passing blip changes nothing. Then `plan_step`, with n neighbours on c cores:

- threads: the c - n free cores while n <= c / 2 (a thread sharing a core gets half of it, and every
  region waits for it: c threads would take 2/c of the work's time, the free cores 1/(c - n), no
  more); every thread beyond that (then each of ours is slowed alike, and each is a share of the
  machine: on 2 cores beside 2 busy programs, 2 threads get about a core, 1 thread two thirds of one);
- quiet (n = 0): idle threads should spin through the step's short gaps. If torch's spin (for long
  or briefly), the kernels join torch's team; if they sleep, the kernels run on the pool, spinning;
- busy (n >= 1): idle threads should sleep at once, and the kernels run on the pool, sleeping, where
  a worker that another program keeps off its core costs nothing: the pool's pieces are claimed,
  not assigned, so the caller takes a late worker's piece itself instead of waiting a scheduler
  time slice for it at a barrier (OpenMP's regions, sleeping or not, wait for every member). If
  torch's threads spin, torch gets one thread, so its spinning team never has a member to wait for.

So in each case one team of ours at most spins, and every team waits the right way (measured in
`python -m inflight.bench.protocol.busy`; `results/busy_cpu.json` has the figures).

`restore()` puts torch's count back after the step, so nothing else in the process sees the change.
The tokens don't change: every kernel and operator gives the same bits on any number of threads or
team (the tests check it). Where `/proc/loadavg` doesn't exist it does nothing;
`INFLIGHT_ADAPT_THREADS=0` turns it off.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from inflight import threads as machine
from inflight.model import thread_pool

__all__ = ["StepThreads", "plan_step", "ThreadGovernor"]


@dataclass(frozen=True)
class StepThreads:
    """One step's threading: the kernels' team size and where it runs, torch's own threads, and how
    long the pool's idle threads spin before they sleep."""

    threads: int
    kernels_on_openmp: bool
    torch_threads: int
    spin_ns: int


def plan_step(cores: int, neighbours: int, threads: int, torch_spins: bool, quiet_spin_ns: int) -> StepThreads:
    """The rule of the module docstring: n `neighbours` on `cores` cores, `threads` set for the
    process, whether torch's idle threads spin. The kernels run on whichever team waits the right
    way for the machine as it is: torch's own when it spins and the machine is quiet, else the pool,
    set to spin (quiet) or to sleep (busy)."""
    want = threads if 2 * neighbours > cores else max(1, min(threads, cores - neighbours))
    if neighbours == 0:  # spin: on torch's team if it spins, else on the pool, spinning
        return StepThreads(want, torch_spins, want, quiet_spin_ns)
    # sleep: on the pool (no barrier waits for a descheduled worker), and a spinning torch on one thread
    return StepThreads(want, False, 1 if torch_spins else want, 0)


class ThreadGovernor:
    """Sets, before each step, what `plan_step` says for the machine as it is now (see the module
    docstring); `restore()` after the step."""

    def __init__(self, smoothing: float = 0.3, read_others: Callable[[], int | None] | None = None,
                 torch_spins: bool | None = None, pool: Any = thread_pool):
        self.cores = machine.usable_cores()
        self.smoothing = smoothing  # weight of the newest sample in the running average
        self.others = 0.0           # running average of other runnable threads
        self.narrowed_steps = 0     # steps run on fewer threads than were set
        self.busy_steps = 0         # steps run beside other programs
        self.torch_spins = not machine.passive_wait_in_effect() if torch_spins is None else torch_spins
        self.last: StepThreads | None = None
        self._read = read_others or machine.other_runnable  # () -> other programs' runnable threads, or None
        self._pool = pool
        self._saved: int | None = None

    def adjust(self) -> int:
        """Sample the machine and set the coming step's threads; returns the kernels' thread count."""
        self.restore()  # (in case the last step's wasn't)
        now = torch.get_num_threads()
        others = self._read()
        if others is None:
            return now
        self.others += self.smoothing * (others - self.others)
        # a neighbour counts once the average says so (0.75 of one): a single sample of one isn't enough
        neighbours = int(self.others + 0.25)
        plan = self.last = plan_step(self.cores, neighbours, now, self.torch_spins, self._pool.QUIET_SPIN_NS)
        self._pool.set_spin(plan.spin_ns)
        self._pool.use(plan.threads, openmp=plan.kernels_on_openmp)
        if plan.torch_threads != now:
            self._saved = now
            torch.set_num_threads(plan.torch_threads)
        self.narrowed_steps += plan.threads < now
        self.busy_steps += neighbours > 0
        return plan.threads

    def restore(self) -> None:
        """Put back torch's thread count; the kernels follow it again."""
        self._pool.use(None, openmp=self._pool.on_openmp())
        if self._saved is not None:
            torch.set_num_threads(self._saved)
            self._saved = None
