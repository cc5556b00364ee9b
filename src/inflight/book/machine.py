"""Say so when a chapter's timings ran on a busy machine.

A reader's laptop or a Colab CPU is rarely idle, and on two cores one other busy program can halve
(or, with spinning threads, crush) what a cell measures. Chapters wrap the cells whose numbers are
timings in `watch_machine()`: it measures how many cores other programs kept busy meanwhile
(`inflight.threads.LoadWatch`) and, when that was enough to skew the figures, prints one line saying
so — the numbers stay, the reader knows what they are worth.

    with watch_machine("the benchmark above"):
        results = bench.run_benchmark(cfg, model=model)
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from inflight.threads import LoadWatch

__all__ = ["watch_machine", "busy_note"]


def busy_note(watch: LoadWatch, what: str = "these timings") -> str | None:
    """The line to show when `watch` saw other programs compete for the cores, else None."""
    if not watch.busy:
        return None
    others = watch.other_cores
    load = f"other programs kept {others:.1f} of {watch.before.cores if watch.before else '?'} cores busy" \
        if others is not None else "other programs were running"
    return (f"⚠ The machine was busy while {what} ran ({load}): the timings are lower and noisier than this "
            "code gets on a quiet machine. Re-run the cell when nothing else is running to compare.")


@contextmanager
def watch_machine(what: str = "these timings", sample_seconds: float = 0.1) -> Iterator[LoadWatch]:
    """Measure the machine's load around the block; print a note afterwards if it was busy."""
    watch = LoadWatch(sample_seconds)
    with watch:
        yield watch
    note = busy_note(watch, what)
    if note:
        print(note)
