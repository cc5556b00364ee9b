"""Tensor parallelism (issue 33): the shard arithmetic, then real worker processes (gloo on this
CPU): tokens identical to one device through preemption (recompute and swap), prefix caching,
parallel sampling, log-probabilities and aborts; bad input refused; and the life cycle — shutdown,
garbage collection, Ctrl-C, a server's SIGTERM leave no process behind, and a worker that dies,
hangs or raises ends the engine with a clear error in bounded time (the deadlines below are
liveness bounds, generous for two loaded cores, not performance assertions)."""
from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from inflight import LLMEngine, SamplingParams
from inflight.engine.executor import MultiprocExecutor, WorkerError, check_startable
from inflight.model.llama import LlamaConfig, LlamaModel
from inflight.model.loading import TINY_PATH, load_pretrained
from inflight.model.parallel import (check_tp_size, column_shard, head_range, kv_head_range, kv_heads_per_rank,
                                     row_shard)
from inflight.model.sharding import local_config, shard_state_dict

ROOT = Path(__file__).resolve().parents[1]
#: where the token-identity tests run: this CPU (gloo), or CUDA (NCCL) where `.ci/gpu` sets it
DEVICE = os.environ.get("INFLIGHT_TP_DEVICE", "cpu")
ON = {"device": DEVICE, "dtype": torch.float32}  # fp32: the split changes only the order of additions
GREEDY = SamplingParams(max_tokens=24, temperature=0.0)
PROMPTS = ["def add(a, b):", "import os\n", "class Stack:\n    def push(self, x):", "for i in range(",
           "def fib(n):\n    if n < 2:", "while True:"]


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_gone(pids: list[int], timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def children_of(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid and alive(int(d.name)):
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def tp_workers_of(pid: int) -> list[int]:
    """The spawned worker processes of `pid` (not multiprocessing's resource tracker)."""
    return [c for c in children_of(pid) if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def tokens(outs) -> list[list[list[int]]]:
    return [[list(c.token_ids) for c in o.outputs] for o in outs]


# -- the arithmetic, no processes ------------------------------------------------------------------
@pytest.mark.parametrize("out_f, in_f, n", [(8, 4, 2), (12, 6, 3), (16, 8, 4), (6, 10, 2)])
def test_column_then_row_shards_give_the_unsharded_product(out_f, in_f, n):
    g = torch.Generator().manual_seed(out_f * 100 + n)
    x = torch.randn(5, in_f, generator=g, dtype=torch.float64)
    w1 = torch.randn(out_f, in_f, generator=g, dtype=torch.float64)   # column-parallel (split outputs)
    w2 = torch.randn(in_f, out_f, generator=g, dtype=torch.float64)   # row-parallel (split inputs)
    h = x @ w1.T
    torch.testing.assert_close(torch.cat([x @ column_shard(w1, r, n).T for r in range(n)], dim=1), h)
    partial = [(x @ column_shard(w1, r, n).T) @ row_shard(w2, r, n).T for r in range(n)]  # no gather in between
    torch.testing.assert_close(sum(partial), h @ w2.T)


@pytest.mark.parametrize("heads, kv, n", [(4, 2, 2), (4, 2, 4), (8, 2, 2), (8, 2, 4), (8, 2, 8), (8, 8, 4),
                                          (8, 1, 4), (16, 4, 8)])
def test_every_query_head_finds_its_kv_head_on_its_rank(heads, kv, n):
    group = heads // kv  # query heads per KV head
    assert kv_heads_per_rank(kv, n) == max(1, kv // n)
    for r in range(n):
        held = kv_head_range(kv, r, n)
        assert len(held) == kv_heads_per_rank(kv, n)
        assert {q // group for q in head_range(heads, r, n)} <= set(held)
    # replication: each KV head on n / kv ranks when kv < n, on exactly one otherwise
    copies = [sum(h in kv_head_range(kv, r, n) for r in range(n)) for h in range(kv)]
    assert copies == [max(1, n // kv)] * kv


@pytest.mark.parametrize("n, match", [(3, "attention heads"), (0, ">= 1"), (8, "attention heads")])
def test_a_size_the_model_does_not_divide_is_refused(n, match):
    with pytest.raises(ValueError, match=match):
        check_tp_size(4, 2, 688, n)
    with pytest.raises(TypeError):
        check_tp_size(4, 2, 688, 2.0)
    with pytest.raises(ValueError, match="KV heads"):
        check_tp_size(12, 4, 24, 6)


def test_shard_state_dict_shapes_match_the_local_model():
    model, _ = load_pretrained(TINY_PATH, device="cpu"), None
    full = model.hf_state_dict()
    for n in (2, 4):
        local = LlamaModel(local_config(model.config, n))
        for r in range(n):
            shard = shard_state_dict(full, model.config, r, n)
            local.load_hf_state_dict(shard)  # (raises on any misshapen tensor)
        assert local.config.num_key_value_heads == (1 if n >= 2 else 2)


def test_more_ranks_than_the_machine_can_start_is_refused():
    with pytest.raises(ValueError, match="worker processes need about"):
        check_startable(10 ** 6, "cpu", 0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA devices"):
            check_startable(2, "cuda", 0)


def test_disaggregation_is_refused_with_tensor_parallelism():
    ex = MultiprocExecutor(TINY_PATH, 2, timeout=30)
    try:
        with pytest.raises(ValueError, match="not supported with tensor_parallel_size > 1"):
            LLMEngine(ex, num_blocks=16, kv_connector=object())
    finally:
        ex.shutdown()


def test_a_path_that_is_not_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError):
        LLMEngine.from_pretrained(tmp_path, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="attention heads"):
        LLMEngine.from_pretrained(TINY_PATH, tensor_parallel_size=3)


# -- real workers: tokens identical ----------------------------------------------------------------
def gqa_checkpoint(folder: Path) -> Path:
    """A random-weight Llama with grouped-query attention: 8 query heads, 2 KV heads (so at TP = 4
    each KV head is replicated on two ranks). Weights scaled so that greedy choices are clear-cut."""
    from safetensors.torch import save_file

    cfg = LlamaConfig(vocab_size=97, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
    torch.manual_seed(7)
    model = LlamaModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(3.0)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(model.hf_state_dict(), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg.to_hf()))
    return folder


def run_both(path, tp: int, fn, **engine_args):
    """`fn(engine)` on one device and on `tp` workers."""
    if DEVICE == "cuda" and torch.cuda.device_count() < tp:
        pytest.skip(f"TP = {tp} needs {tp} CUDA devices, this machine has {torch.cuda.device_count()}")
    one = LLMEngine.from_pretrained(path, **ON, **engine_args)
    many = LLMEngine.from_pretrained(path, tensor_parallel_size=tp, **ON, **engine_args)
    try:
        return fn(one), fn(many), one, many
    finally:
        many.shutdown()


@pytest.fixture(scope="module")
def tp2_small_pool():
    """The tiny model over two workers with a pool small enough to preempt (recompute)."""
    eng = LLMEngine.from_pretrained(TINY_PATH, tensor_parallel_size=2, num_blocks=24, block_size=8, max_batch_size=8,
                                    **ON)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def tp1_small_pool():
    return LLMEngine.from_pretrained(TINY_PATH, num_blocks=24, block_size=8, max_batch_size=8, **ON)


def test_greedy_tokens_identical_through_recompute_preemption(tp1_small_pool, tp2_small_pool):
    ref = tp1_small_pool.generate(PROMPTS, GREEDY, use_tqdm=False)
    got = tp2_small_pool.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert tokens(got) == tokens(ref)
    assert tp2_small_pool.scheduler.num_preemptions > 0 and tp1_small_pool.scheduler.num_preemptions > 0
    assert tp2_small_pool.tensor_parallel_size == 2 and tp2_small_pool.num_blocks == 24


def test_parallel_sampling_and_logprobs_match(tp1_small_pool, tp2_small_pool):
    sp = [SamplingParams(max_tokens=12, temperature=0.8, seed=3, n=3, logprobs=2),
          SamplingParams(max_tokens=10, temperature=0.0, logprobs=1, prompt_logprobs=1)]
    ref = tp1_small_pool.generate(PROMPTS[:2], sp, use_tqdm=False)
    got = tp2_small_pool.generate(PROMPTS[:2], sp, use_tqdm=False)
    assert tokens(got) == tokens(ref)
    for a, b in zip(ref, got):
        for ca, cb in zip(a.outputs, b.outputs):
            for la, lb in zip(ca.logprobs, cb.logprobs):
                assert la.keys() == lb.keys()
                for k in la:
                    assert abs(la[k].logprob - lb[k].logprob) < 1e-4
    pa, pb = ref[1].prompt_logprobs, got[1].prompt_logprobs
    assert len(pa) == len(pb) and pa[0] is None and pb[0] is None
    for la, lb in zip(pa[1:], pb[1:]):
        for k in la:
            assert abs(la[k].logprob - lb[k].logprob) < 1e-4


def test_aborts_mid_run_match(tp1_small_pool, tp2_small_pool):
    def run(engine):
        ids = [engine.add_request(p, SamplingParams(max_tokens=20, temperature=0)) for p in PROMPTS[:4]]
        seen: dict[str, list[int]] = {}
        for step in range(40):
            if step == 3:
                engine.abort_request(ids[1])
            for o in engine.step():
                seen[o.request_id] = list(o.outputs[0].token_ids)
            if not engine.has_unfinished_requests():
                break
        return [seen.get(i) for i in ids]

    assert run(tp2_small_pool) == run(tp1_small_pool)


def test_swap_preemption_and_prefix_caching_match(tmp_path):
    shared = "def shared_prefix_of_every_prompt(x, y, z):\n    "
    prompts = [shared + p for p in PROMPTS]
    kw = dict(num_blocks=28, block_size=8, max_batch_size=8, preemption="swap", enable_prefix_caching=True)
    ref, got, one, many = run_both(TINY_PATH, 2, lambda e: tokens(e.generate(prompts, GREEDY, use_tqdm=False)), **kw)
    assert got == ref
    s1, s2 = one.summary(), many.summary()
    assert s2["swap_bytes"] > 0 and s2["prefix_cache_hits"] > 0
    assert s1["prefix_cache_hits"] == s2["prefix_cache_hits"]
    # each device holds half the KV heads, so half the bytes per block
    assert many.kv_cache.bytes_per_block * 2 == one.kv_cache.bytes_per_block


def test_speculative_decoding_matches():
    """Speculation lives in the driver (proposals, the rejection rule); the workers only compute the
    proposals' rows, which come back with the others."""
    prompts = ["def add(a, b):\n    return a + b\n\ndef add(", "import os\nimport os\nimport",
               "for i in range(10):\n    for i in range("]
    cfg = {"method": "ngram", "num_speculative_tokens": 3}
    ref, got, one, many = run_both(TINY_PATH, 2, lambda e: tokens(e.generate(prompts, SamplingParams(
        max_tokens=32, temperature=0), use_tqdm=False)), speculative_config=cfg)
    assert got == ref
    assert many.speculator.stats()["spec_num_accepted_tokens"] > 0
    assert many.speculator.stats() == one.speculator.stats()


@pytest.mark.parametrize("tp", [2, 4])
def test_gqa_model_identical_with_split_and_replicated_kv_heads(tmp_path, tp):
    path = gqa_checkpoint(tmp_path / "gqa")
    prompts = [[1, 5, 9, 13, 2], [40, 41, 42], [7] * 30, [3, 1, 4, 1, 5, 9, 2, 6]]
    sp = SamplingParams(max_tokens=16, temperature=0.0)
    ref, got, one, many = run_both(path, tp, lambda e: tokens(e.generate(prompts, sp, use_tqdm=False)),
                                   block_size=8, max_batched_tokens=16, max_batch_size=4)  # (chunked prefill)
    assert got == ref
    heads = [w[1]["num_key_value_heads"] for w in many.executor.workers]
    assert heads == [kv_heads_per_rank(2, tp)] * tp  # TP=4: one KV head each, each head on two ranks
    assert many.kv_cache.bytes_per_block * min(tp, 2) == one.kv_cache.bytes_per_block


# -- the life cycle --------------------------------------------------------------------------------
def test_shutdown_and_garbage_collection_leave_no_process():
    eng = LLMEngine.from_pretrained(TINY_PATH, tensor_parallel_size=2, num_blocks=16)
    pids = eng.executor.pids
    assert all(alive(p) for p in pids)
    eng.shutdown()
    assert wait_gone(pids) == []
    with pytest.raises(WorkerError, match="shut down"):
        eng.generate(["x"], GREEDY, use_tqdm=False)

    eng = LLMEngine.from_pretrained(TINY_PATH, tensor_parallel_size=2, num_blocks=16)
    pids = eng.executor.pids
    eng.generate(["def f():"], SamplingParams(max_tokens=4), use_tqdm=False)
    del eng
    gc.collect()
    assert wait_gone(pids) == []


def test_a_killed_worker_ends_the_engine_with_a_clear_error():
    eng = LLMEngine.from_pretrained(TINY_PATH, tensor_parallel_size=2, num_blocks=32, distributed_timeout=30)
    pids = eng.executor.pids
    eng.generate(["def f():"], SamplingParams(max_tokens=4), use_tqdm=False)
    os.kill(pids[1], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match=r"rank 1 .*died|rank \d+ failed|rank 1 is gone"):
        eng.generate(["def g():"], SamplingParams(max_tokens=50), use_tqdm=False)
    assert time.monotonic() - t0 < 30 + 15  # bounded: the deadline, plus stopping the other worker
    assert wait_gone(pids) == []
    with pytest.raises(WorkerError):  # and it stays ended
        eng.step() if eng.has_unfinished_requests() else eng.generate(["x"], GREEDY, use_tqdm=False)


def test_a_hung_worker_ends_the_engine_at_the_deadline():
    eng = LLMEngine.from_pretrained(TINY_PATH, tensor_parallel_size=2, num_blocks=32, distributed_timeout=4)
    pids = eng.executor.pids
    eng.generate(["def f():"], SamplingParams(max_tokens=2), use_tqdm=False)
    os.kill(pids[0], signal.SIGSTOP)
    try:
        with pytest.raises(WorkerError, match=r"rank\(s\) \[0(, 1)?\] gave no answer within 4 s"):
            eng.generate(["def g():"], SamplingParams(max_tokens=20), use_tqdm=False)
        assert wait_gone(pids) == []
    finally:
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_a_worker_that_raises_reports_its_traceback():
    ex = MultiprocExecutor(TINY_PATH, 2, timeout=30, _worker_options={1: {"fail_at_step": 2}})
    pids = ex.pids
    eng = LLMEngine(ex, num_blocks=16)
    with pytest.raises(WorkerError, match=r"(?s)rank 1 failed.*failing at step 2 as asked"):
        eng.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=10), use_tqdm=False)
    assert wait_gone(pids) == []


CTRL_C_SCRIPT = textwrap.dedent("""
    # (no `if __name__ == "__main__":` guard: the workers never import this script)
    import signal
    # Ctrl-C as a terminal's program has it, whoever started the tests: a test run started in the
    # background by a non-interactive shell hands its children SIGINT ignored, and Python keeps that
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from inflight import LLMEngine, SamplingParams
    from inflight.model.loading import TINY_PATH
    eng = LLMEngine.from_pretrained(TINY_PATH, tensor_parallel_size=2, num_blocks=64)
    print("PIDS", *eng.executor.pids, flush=True)
    while True:  # until Ctrl-C
        eng.generate(["def f(x):"] * 4, SamplingParams(max_tokens=200, ignore_eos=True), use_tqdm=False)
""")


def test_ctrl_c_leaves_no_process(tmp_path):
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PIDS"), line + proc.stderr.read()
        pids = [int(p) for p in line.split()[1:]]
        time.sleep(1.0)  # (mid-generate)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        proc.wait(60)
        assert "KeyboardInterrupt" in proc.stderr.read()
        assert wait_gone(pids) == []
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigint_deferred_holds_with_other_threads():
    """A Ctrl-C during a step's broadcast waits for its end, though SIGINT may land on any thread
    (the driver always has others: torch's TCPStore serves from one)."""
    from inflight.engine.interrupts import sigint_deferred

    other = threading.Thread(target=time.sleep, args=(2.0,), daemon=True)
    other.start()
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # (pytest may have been started with it ignored)
    finished = False
    try:
        with pytest.raises(KeyboardInterrupt):
            with sigint_deferred():
                signal.pthread_kill(other.ident, signal.SIGINT)  # (the thread the system may choose)
                time.sleep(0.2)  # (the GIL handed over and back: a pending interrupt is raised here, if at all)
                t = time.monotonic()
                while time.monotonic() - t < 0.2:  # (... or between bytecodes)
                    pass
                finished = True
        assert finished
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with sigint_deferred():  # no interrupt: nothing raised, the handler put back
            pass
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_server_sigterm_and_a_dead_worker():
    sys.path.insert(0, str(Path(__file__).parent))
    from serve_helpers import ServerProcess

    server = ServerProcess("--tensor-parallel-size", "2", "--num-blocks", "64")
    try:
        workers = tp_workers_of(server.proc.pid)
        body = {"model": server.model, "prompt": "def f(x):", "max_tokens": 8, "temperature": 0}
        status, _, data = server.request("POST", "/v1/completions", body)
        assert status == 200, data
        assert server.request("GET", "/health")[0] == 200
        assert len(workers) >= 2
        # a worker dies: the next request fails, /health says 503, nothing hangs
        os.kill(workers[-1], signal.SIGKILL)
        status, _, data = server.request("POST", "/v1/completions", body)
        assert status >= 500, data
        deadline = time.monotonic() + 60
        while server.request("GET", "/health")[0] != 503:
            assert time.monotonic() < deadline, "/health never turned 503"
            time.sleep(0.2)
    finally:
        server.stop(signal.SIGTERM)
    assert wait_gone(workers) == []


def test_server_sigterm_leaves_no_process():
    sys.path.insert(0, str(Path(__file__).parent))
    from serve_helpers import ServerProcess

    server = ServerProcess("--tensor-parallel-size", "2", "--num-blocks", "64")
    workers = tp_workers_of(server.proc.pid)
    try:
        body = {"model": server.model, "prompt": "class A:", "max_tokens": 6, "temperature": 0}
        assert server.request("POST", "/v1/completions", body)[0] == 200
    finally:
        code = server.stop(signal.SIGTERM)
    assert code in (0, -signal.SIGTERM), "".join(server.output)  # (uvicorn re-raises the signal it handled)
    assert wait_gone(workers) == []
