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


_CLEAN = {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None}


def test_import_inflight_first_asks_for_a_short_spin_and_uses_every_core():
    out = _run("import os, inflight; c = inflight.configure_threads(); import torch; "
               "print(os.environ['OMP_WAIT_POLICY'], os.environ['GOMP_SPINCOUNT'], c.idle_wait.replace(' ', '_'), "
               "c.passive_wait, c.threads == c.cores == torch.get_num_threads(), sorted(inflight.threads.set_by_inflight()))",
               _CLEAN)
    assert out.split() == ["PASSIVE", "10000", "short_spin", "False", "True", "['GOMP_SPINCOUNT',", "'OMP_WAIT_POLICY']"]


def test_torch_loaded_first_still_gets_every_core():
    out = _run("import os; import torch, inflight; c = inflight.configure_threads(); "
               "print(c.idle_wait, c.threads == c.cores == torch.get_num_threads(), 'OMP_WAIT_POLICY' in os.environ, "
               "'GOMP_SPINCOUNT' in os.environ)", _CLEAN)
    assert out.split() == ["spin", "True", "False", "False"]  # too late to matter, so not set either


@pytest.mark.parametrize("env, idle_wait", [({"OMP_WAIT_POLICY": "ACTIVE"}, "spin"),
                                            ({"OMP_WAIT_POLICY": "PASSIVE"}, "sleep"),
                                            ({"GOMP_SPINCOUNT": "0"}, "sleep"),
                                            ({"GOMP_SPINCOUNT": "20k"}, "short_spin"),
                                            ({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "infinite"}, "spin")])
def test_users_own_policy_is_respected(env, idle_wait):
    out = _run("import os, inflight; c = inflight.configure_threads(); print(os.environ.get('OMP_WAIT_POLICY'), "
               "os.environ.get('GOMP_SPINCOUNT'), c.idle_wait.replace(' ', '_'), c.threads == c.cores, "
               "inflight.threads.set_by_inflight())", {**_CLEAN, **env})
    assert out.split() == [env.get("OMP_WAIT_POLICY", "None"), env.get("GOMP_SPINCOUNT", "None"), idle_wait, "True", "{}"]


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


def test_this_process_busy_threads_are_not_counted_as_other_programs():
    """/proc/loadavg counts torch's own workers too (runnable for a moment after each parallel
    region); counted as a neighbour, they made the governor run a quiet machine on one thread."""
    if not os.path.exists("/proc/self/task"):
        pytest.skip("needs Linux /proc")
    import threading
    import time

    stop = threading.Event()

    def spin():  # a thread of this process that is always runnable
        while not stop.is_set():
            sum(range(1000))

    t = threading.Thread(target=spin, daemon=True)
    t.start()
    try:
        own = threads._OwnThreads()
        seen = []
        for _ in range(20):
            seen.append(own())
            time.sleep(0.005)
    finally:
        stop.set()
        t.join()
    assert max(seen) >= 2  # the spinner and this thread: both ours


def test_other_runnable_is_the_machine_count_less_this_process(monkeypatch):
    machine = iter([1, 5, 4, 3, 3])
    monkeypatch.setattr(threads, "_running_threads", lambda: next(machine))
    monkeypatch.setattr(threads, "_own", lambda: 2)
    assert threads.other_runnable() == 0  # only the reader: this process's threads not even read
    assert threads.other_runnable() == 2  # 5 then 4 around our 2: the smaller, less ours
    assert threads.other_runnable() == 1
    monkeypatch.setattr(threads, "_running_threads", lambda: None)
    assert threads.other_runnable() is None  # no /proc/loadavg


def _governor(samples, cores=2, torch_spins=False):
    from inflight.engine.thread_governor import ThreadGovernor

    it = iter(samples)
    g = ThreadGovernor(read_others=lambda: next(it), torch_spins=torch_spins)
    g.cores = cores
    return g


def test_the_governor_narrows_to_the_free_cores_for_a_step_and_puts_the_count_back():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = _governor([0] * 3 + [1] * 10 + [0] * 10)  # quiet, a neighbour on one of two cores, quiet again
        assert [g.adjust() for _ in range(3)] == [2, 2, 2] and g.narrowed_steps == 0
        counts = []
        for _ in range(10):  # one thread on the free core, once the average has caught up
            counts.append(g.adjust())
            assert torch.get_num_threads() == counts[-1]
            g.restore()
            assert torch.get_num_threads() == 2  # the rest of the process never sees the change
        assert counts[0] == 2 and counts[-1] == 1 and g.narrowed_steps >= 5
        assert [g.adjust() for _ in range(10)][-1] == 2  # and back to every core when it leaves
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("cores, neighbours, threads", [(2, 2, 2), (2, 5, 2), (4, 1, 3), (4, 2, 2), (4, 3, 4),
                                                        (8, 4, 4), (8, 5, 8)])
def test_with_most_cores_shared_every_thread_is_a_share(cores, neighbours, threads):
    """n neighbours on c cores: the free cores while n <= c / 2, every thread beyond that."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(cores)
    try:
        g = _governor([neighbours] * 20, cores=cores)
        assert [g.adjust() for _ in range(20)][-1] == threads
        g.restore()
    finally:
        torch.set_num_threads(before)


def test_one_blip_changes_nothing_and_no_proc_means_no_change():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = _governor([0, 2, 0, 0])
        assert [g.adjust() for _ in range(4)] == [2, 2, 2, 2]
        assert _governor([None]).adjust() == 2
        torch.set_num_threads(1)
        assert _governor([0]).adjust() == 1  # never more threads than were set
    finally:
        torch.set_num_threads(before)


def test_every_operator_gives_the_same_tokens_on_one_thread_or_two():
    """What lets the governor change the count mid-run: the engine's tokens don't depend on it."""
    import torch
    from inflight.engine.llm_engine import LLMEngine
    from inflight.engine.sampling import SamplingParams
    from inflight.model.loading import load_tiny

    model = load_tiny()[0].eval()
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist() for n in (5, 60, 2, 33)]
    before, outs = torch.get_num_threads(), []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            engine = LLMEngine(model, block_size=4, num_blocks=128, max_batch_size=4, max_batched_tokens=32)
            engine.runner.threads = None  # this test sets the count itself
            outs.append([o.token_ids for o in engine.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True),
                                                              use_tqdm=False)])
    finally:
        torch.set_num_threads(before)
    assert outs[0] == outs[1]


# --- the governor's rule (`inflight.engine.thread_governor.plan_step`) ------------------------------

@pytest.mark.parametrize("torch_spins", [False, True])
def test_a_quiet_machine_spins_on_torchs_team_if_it_spins_else_on_the_pool(torch_spins):
    from inflight.engine.thread_governor import plan_step

    p = plan_step(cores=2, neighbours=0, threads=2, torch_spins=torch_spins, quiet_spin_ns=123)
    assert (p.threads, p.torch_threads, p.spin_ns) == (2, 2, 123)
    assert p.kernels_on_openmp is torch_spins  # one team of ours waits for work, never two


@pytest.mark.parametrize("torch_spins", [False, True])
@pytest.mark.parametrize("neighbours", [1, 2, 5])
def test_a_busy_machine_sleeps_on_the_pool_whatever_torchs_policy(torch_spins, neighbours):
    from inflight.engine.thread_governor import plan_step

    p = plan_step(cores=2, neighbours=neighbours, threads=2, torch_spins=torch_spins, quiet_spin_ns=123)
    assert p.spin_ns == 0 and not p.kernels_on_openmp  # the pool never waits for a descheduled worker
    assert p.threads == (1 if neighbours == 1 else 2)
    assert p.torch_threads == (1 if torch_spins else p.threads)  # a spinning torch team gets no member to wait for


def test_adjust_applies_the_plan_and_restore_gives_torch_its_count_back():
    import torch

    from inflight.engine.thread_governor import ThreadGovernor

    class Pool:
        QUIET_SPIN_NS = 7

        def __init__(self):
            self.calls, self.openmp = [], False

        def set_spin(self, ns):
            self.calls.append(("spin", ns))

        def use(self, threads, openmp=False):
            self.calls.append(("use", threads, openmp))
            self.openmp = openmp

        def on_openmp(self):
            return self.openmp

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        pool = Pool()
        g = ThreadGovernor(read_others=iter([0] + [2] * 20).__next__, torch_spins=True, pool=pool)
        g.cores = 2
        assert g.adjust() == 2 and pool.calls[-2:] == [("spin", 7), ("use", 2, True)]
        for _ in range(10):
            g.adjust()
        assert pool.calls[-2:] == [("spin", 0), ("use", 2, False)] and torch.get_num_threads() == 1
        assert g.last.torch_threads == 1 and g.busy_steps >= 5
        g.restore()
        assert torch.get_num_threads() == 2 and pool.calls[-1] == ("use", None, False)
    finally:
        torch.set_num_threads(before)
