"""A chapter says so when its timings ran on a busy machine (and stays silent on a quiet one)."""
from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

from inflight.book.machine import busy_note, watch_machine


def test_quiet_machine_gives_no_note():
    assert busy_note(SimpleNamespace(busy=False)) is None


def test_busy_note_names_the_load():
    watch = SimpleNamespace(busy=True, other_cores=1.6, before=SimpleNamespace(cores=2))
    note = busy_note(watch, "the benchmark")
    assert "busy while the benchmark ran" in note and "1.6 of 2 cores" in note


def test_competing_programs_are_seen(capsys):
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.3)
        with watch_machine("this test") as watch:
            time.sleep(0.5)  # idle: every busy core belongs to someone else
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert watch.busy and watch.other_cores >= 0.5
    assert "busy while this test ran" in capsys.readouterr().out
