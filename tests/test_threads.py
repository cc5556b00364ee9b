"""The CPU thread policy and the busy-machine check (`inflight.threads`)."""
import os
import subprocess
import sys

import pytest

from inflight import threads


def _run(code: str, env: dict) -> str:
    src = os.path.join(os.path.dirname(__file__), "..", "src")
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src), **env}
    env = {k: v for k, v in env.items() if v is not None}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout


def test_import_inflight_first_makes_idle_threads_sleep_and_uses_every_core():
    out = _run("import os, sys; os.environ.pop('OMP_WAIT_POLICY', None); import inflight; c = inflight.configure_threads(); "
               "import torch; print(os.environ['OMP_WAIT_POLICY'], c.passive_wait, c.threads == c.cores == torch.get_num_threads())", {})
    assert out.split() == ["PASSIVE", "True", "True"]


def test_torch_loaded_first_means_one_thread():
    out = _run("import os; os.environ.pop('OMP_WAIT_POLICY', None); import torch, inflight; c = inflight.configure_threads(); "
               "print(c.passive_wait, c.threads, torch.get_num_threads(), 'OMP_WAIT_POLICY' in os.environ)", {})
    assert out.split() == ["False", "1", "1", "False"]  # too late to matter, so not set either


def test_users_own_policy_is_respected():
    out = _run("import os, inflight; c = inflight.configure_threads(); print(os.environ['OMP_WAIT_POLICY'], c.passive_wait, c.threads)",
               {"OMP_WAIT_POLICY": "ACTIVE"})
    assert out.split() == ["ACTIVE", "False", "1"]


def test_explicit_thread_count_and_bad_values():
    import torch

    before = torch.get_num_threads()
    try:
        assert threads.configure_threads(1).threads == 1 == torch.get_num_threads()
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match="threads"):
                threads.configure_threads(bad)
    finally:
        torch.set_num_threads(before)


def test_machine_load_counts_other_runnable_threads():
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        load = threads.machine_load(seconds=0.5, samples=10)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert load.cores >= 1 and len(load.loadavg) == 3
    if os.path.exists("/proc/loadavg"):  # Linux: two spinning neighbours are seen
        assert load.other_runnable >= 1.5 and load.busy
        assert load.as_dict()["busy"] is True


def test_load_watch_sees_other_programs_working_during_a_measurement():
    if not os.path.exists("/proc/stat"):
        pytest.skip("needs Linux /proc/stat")
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with threads.LoadWatch(sample_seconds=0.1) as watch:
            import time
            time.sleep(1.0)  # this process idles; the spinner keeps a core busy
    finally:
        spinner.kill()
        spinner.wait()
    assert watch.other_cores >= 0.6 and watch.busy
    d = watch.as_dict()
    assert d["busy"] is True and d["wall_s"] >= 1.0 and d["before"]["cores"] >= 1
