"""Say so when a chapter's timings ran on a busy machine.

A reader's laptop or a Colab CPU is rarely idle, and on two cores one other busy program can halve
(or, with spinning threads, crush) what a cell measures. Chapters wrap the cells whose numbers are
timings in `watch_machine()`: it measures how many cores other programs kept busy meanwhile
(`inflight.threads.LoadWatch`) and, when that was enough to skew the figures, prints one line saying
so — the numbers stay, the reader knows what they are worth. On the book's site (built by CI,
beside its other jobs) the line says plainly that the page was measured while it was built.

    with watch_machine("the benchmark above"):
        results = bench.run_benchmark(cfg, model=model)
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from inflight.book.interactive import where
from inflight.threads import LoadWatch

__all__ = ["watch_machine", "busy_note"]


def busy_note(watch: LoadWatch, what: str = "these timings") -> str | None:
    """The line to show when `watch` saw other programs compete for the cores, else None."""
    if not watch.busy:
        return None
    others = watch.other_cores
    load = f"other programs kept {others:.1f} of {watch.before.cores if watch.before else '?'} cores busy" \
        if others is not None else "other programs were running"
    if where() == "page":  # the book's site, built beside other jobs: what the numbers are
        return (f"⚠ Measured while the site was built, on a build machine shared with other jobs\n"
                f"  ({load} while {what} ran): these timings are lower and noisier than this code\n"
                "  gets on a quiet machine. Run the notebook to measure yours.")
    return (f"⚠ The machine was busy while {what} ran ({load}):\n  the timings are lower and noisier than this "
            "code gets on a quiet machine.\n  Re-run the cell when nothing else is running to compare.")


@contextmanager
def watch_machine(what: str = "these timings", sample_seconds: float = 0.1) -> Iterator[LoadWatch]:
    """Measure the machine's load around the block; print a note afterwards if it was busy."""
    watch = LoadWatch(sample_seconds)
    with watch:
        yield watch
    note = busy_note(watch, what)
    if note:
        print(note)
