"""The whole benchmark: every requested workload × mode, each checked against the sequential
reference, plus the online sweep, the hardware's limits and the attention and prefix sections.

Same weights, same prompts and the same per-request output lengths for every mode. Output
lengths are fixed by the workload (end-of-sequence ignored), so every mode does the same useful
work; every mode's greedy tokens are compared with the sequential run, and a mode whose tokens
differ gets no speed reported. A peer that can't run is reported unavailable, with its error.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import platform
import sys
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch

from inflight.bench.kernels import attention
from inflight.bench.offline import prefix
from inflight.bench.offline.agreement import describe_failure, policy_for, teacher_forced_deviation
from inflight.bench.kernels.decode_step import decode_step_report, decode_step_times
from inflight.bench.protocol.floor import ratio_bounds, time_floor
from inflight.bench.offline.config import MODE_TITLES, MODES, BenchConfig, BenchSetup
from inflight.bench.offline.metrics import check_outputs, device_limits, ideal_speedup, summarize, targets
from inflight.bench.offline.models import BenchModel, describe_model, load_model
from inflight.bench.offline.peers import run_hf_continuous, run_hf_static, to_transformers
from inflight.bench.profiling import measure_linear_layers
from inflight.bench.offline.prompts import Workload, make_workload, with_poisson_arrivals
from inflight.bench.offline.record import RunRecord, kv_bytes_per_token
from inflight.bench.offline.runners import run_engine, run_static
from inflight.device import describe_device
from inflight.threads import LoadWatch, configure_threads

__all__ = ["run_mode", "run_checked", "run_benchmark"]

Log = Callable[[str], None]
RunOne = Callable[..., dict[str, Any]]  # (mode, workload, ref_key=None) -> the mode's summary


def run_mode(mode: str, setup: BenchSetup, workload: Workload) -> RunRecord:
    """Run one mode on one workload and return its raw record (exceptions propagate)."""
    m = setup.model
    if mode in ("sequential", "static"):
        return run_static(m, workload, 1 if mode == "sequential" else setup.batch_size, setup.max_len, mode=mode)
    if mode == "contiguous":
        return run_engine(m, workload, block_size=setup.max_len, num_blocks=setup.batch_size,
                          max_batch_size=setup.batch_size, mode=mode,
                          max_batched_tokens=setup.max_batched_tokens, full_batch=setup.batch_size,
                          max_model_len=setup.max_len)
    if mode == "paged":
        return run_engine(m, workload, block_size=setup.paged_block_size, num_blocks=setup.paged_num_blocks,
                          max_batch_size=setup.paged_max_batch, mode=mode,
                          max_batched_tokens=setup.max_batched_tokens, full_batch=setup.batch_size,
                          max_model_len=setup.max_len)
    if mode in ("hf_static", "hf_continuous"):
        if setup.hf is None:
            raise RuntimeError(f"transformers model unavailable: {setup.hf_error}")
        if mode == "hf_static":
            return run_hf_static(setup.hf, workload, setup.batch_size, kv_bytes_per_token(m))
        return run_hf_continuous(setup.hf, workload, kv_bytes_per_token(m), setup.kv_tokens, setup.paged_block_size)
    raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")


def run_checked(mode: str, setup: BenchSetup, w: Workload, refs: dict[str, dict[str, list[int]]], log: Log,
                ref_key: str | None = None) -> dict[str, Any]:
    """Run a mode, check its tokens against the reference (`refs[ref_key or w.name]`, which the
    sequential mode fills), summarise; a failure becomes an "unavailable" entry."""
    key = ref_key or w.name
    title = MODE_TITLES.get(mode, mode)
    load_before = _loadavg()
    watch = LoadWatch()
    try:
        with watch:
            rec = run_mode(mode, setup, w)
    except Exception as exc:
        err = f"{type(exc).__name__}: {exc}"
        log(f"  {title} on {w.name}: unavailable — {err}")
        return {"mode": mode, "title": title, "status": "unavailable", "error": err,
                "traceback": traceback.format_exc(limit=6)}
    agreement = None
    if setup.agreement.get("policy") == "teacher_forced_logprobs":  # half precision: see bench.offline.agreement
        agreement = teacher_forced_deviation(setup.model, w, rec.tokens, setup.agreement)
        mismatch = describe_failure(agreement)
    else:
        if mode == "sequential" and key not in refs:
            refs[key] = rec.tokens
        mismatch = check_outputs(w, refs[key], rec.tokens) if key in refs else "no reference run to compare with"
    if mismatch:
        log(f"  {title} on {w.name}: NOT reporting a speed — {mismatch}")
    out = summarize(rec, w, mismatch)
    if agreement is not None:
        out["agreement"] = agreement
    # other processes on the machine skew timings: keep the 1-minute load average around each run
    out["loadavg_1min"] = [load_before, _loadavg()]
    # ... and how many cores other programs kept busy while it ran: a busy run's speed is not the engine's alone
    out["machine_busy"] = watch.busy
    out["other_cores_during"] = watch.other_cores
    if watch.busy:
        log(f"  {title} on {w.name}: the machine was busy (other programs kept {watch.other_cores or 0:.1f} "
            "core(s) busy): its speed is not comparable with a quiet run")
    return out


def run_benchmark(cfg: BenchConfig, model: Any = None, progress: bool = True, log: Log = print) -> dict[str, Any]:
    """Run every requested workload × mode; return the results dict that `--out` saves as JSON.
    `model` (an inflight LlamaModel) overrides `cfg.model`, e.g. one a notebook already loaded."""
    from tqdm.auto import tqdm

    bad = [m for m in cfg.modes + cfg.online_modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown mode(s) {bad}; choose from {MODES}")
    threads = configure_threads(cfg.threads or None)  # the thread policy of inflight.threads, or what was asked
    torch.manual_seed(cfg.seed)
    bm = (load_model(cfg.model, cfg.device, cfg.dtype, cfg.seed) if model is None
          else BenchModel(model, describe_model(model)))
    setup = _setup(cfg, bm.model)
    results = _header(cfg, bm, setup)
    results["machine"]["threads"] = asdict(threads)
    results["agreement_policy"] = setup.agreement
    exact = setup.agreement["policy"] == "exact_tokens"
    lt, plan = _plan(cfg, bm.model.config.vocab_size, setup.max_len, with_sequential=exact)
    online = len(cfg.rate_fractions) * len(cfg.online_modes) if "online" in cfg.workloads else 0
    refs: dict[str, dict[str, list[int]]] = {}
    with tqdm(total=sum(len(m) for _, m in plan) + online, desc="bench", disable=not progress) as bar:
        def run_one(mode: str, w: Workload, ref_key: str | None = None) -> dict[str, Any]:
            bar.set_postfix_str(f"{w.name}: {mode}")
            out = run_checked(mode, setup, w, refs, log, ref_key)
            bar.update(1)
            return out

        for w, modes in plan:
            results["workloads"][w.name] = _offline(cfg, w, modes, run_one)
        if "online" in cfg.workloads:
            results["workloads"]["online"] = _online(cfg, lt, results["workloads"].get(lt.name, {}).get("modes", {}),
                                                    run_one)
    lt_modes = results["workloads"].get(lt.name, {}).get("modes", {})
    results["fair"] = _fair_section(cfg, bm.model, lt, refs.get(lt.name), results, log)
    results["device_limits"] = lim = _limits(bm.model, lt, lt_modes, cfg.quick)
    for m, v in lt_modes.items():  # how close each mode came to its roof
        roof = lim.get("per_mode", {}).get(m, {}).get("roof_tokens_per_s")
        if roof and v.get("tokens_per_s"):
            v["fraction_of_roof"] = v["tokens_per_s"] / roof
    results["time_floor"] = _floor_section(bm.model, lt_modes, lim, cfg, results["fair"])
    results["attention_bench"] = _attention_section(cfg.quick) if cfg.attention_bench else {"status": "skipped"}
    results["prefix_caching"] = _prefix_section(cfg.quick, bm.model) if cfg.prefix_bench else {"status": "skipped"}
    results["decode_step"] = (_section(decode_step_times, decode_step_report, model=bm.model, steps=10 if cfg.quick else 50)
                              if cfg.decode_step_bench else {"status": "skipped"})
    results["targets"] = targets(results, cfg.batch_size)
    with contextlib.suppress(OSError, AttributeError):
        results["machine"]["loadavg_end"] = list(os.getloadavg())
    return results


def _setup(cfg: BenchConfig, model: Any) -> BenchSetup:
    """The memory every mode gets (B slots of the longest request the workloads may reach), and the
    transformers twin of the model when a peer mode is asked for."""
    max_len = min(cfg.prompt_range[1] + cfg.output_cap, model.config.max_position_embeddings)
    setup = BenchSetup(model, cfg.batch_size, max_len, cfg.paged_block_size, max_batched_tokens=cfg.max_batched_tokens,
                       agreement=policy_for(model.dtype, cfg.logprob_tolerance))
    if any(m.startswith("hf_") for m in cfg.modes + cfg.online_modes):
        try:
            setup.hf = to_transformers(model)
        except Exception as exc:
            setup.hf_error = f"{type(exc).__name__}: {exc}"
    return setup


def _plan(cfg: BenchConfig, vocab_size: int, max_len: int, with_sequential: bool = True
          ) -> tuple[Workload, list[tuple[Workload, list[str]]]]:
    """The long-tailed workload (the online sweep and the device limits read it even when its
    modes aren't asked for), and the (workload, modes) pairs to run. With exact-token checks the
    sequential reference always runs; on a workload that isn't reported, only it runs (for the
    online sweep). In half precision the reference is teacher-forced instead, and sequential runs
    only when asked for."""
    def workload(kind: str) -> Workload:
        return make_workload(kind, cfg.n, cfg.seed, vocab_size, max_context=max_len, prompt_range=cfg.prompt_range,
                             output_mean=cfg.output_mean, output_cap=cfg.output_cap)

    lt = workload("long_tailed")
    first = ["sequential"] if with_sequential or "sequential" in cfg.modes else []
    asked = first + [m for m in MODES if m in cfg.modes and m != "sequential"]
    plan = []
    if "long_tailed" in cfg.workloads or ("online" in cfg.workloads and with_sequential):
        plan.append((lt, asked if "long_tailed" in cfg.workloads else ["sequential"]))
    if "uniform" in cfg.workloads:
        plan.append((workload("uniform"), list(asked)))
    return lt, plan


def _offline(cfg: BenchConfig, w: Workload, modes: list[str], run_one: RunOne) -> dict[str, Any]:
    """One offline workload: its shape, the simulator's ideal, every mode, the realized speedup."""
    res: dict[str, Any] = {"requests": len(w.requests), "useful_tokens": w.useful_tokens,
                           "output_lens": [r.output_len for r in w.requests],
                           "prompt_lens": [len(r.prompt) for r in w.requests],
                           "ideal": ideal_speedup(w, cfg.batch_size), "modes": {}}
    for mode in modes:
        res["modes"][mode] = run_one(mode, w)
    if "sequential" not in cfg.modes and "sequential" in res["modes"]:
        res["modes"]["sequential"]["reported"] = False  # ran as the reference only
    st, co = (res["modes"].get(m, {}).get("tokens_per_s") for m in ("static", "contiguous"))
    if st and co:
        res["ideal"]["realized_speedup"] = co / st
        res["ideal"]["realized_fraction"] = co / st / res["ideal"]["ideal_speedup"]
    return res


def _online(cfg: BenchConfig, lt: Workload, lt_modes: dict[str, Any], run_one: RunOne) -> dict[str, Any]:
    """The first `online_n` long-tailed requests arriving as a Poisson process, at rates relative to
    what the paged engine sustains offline on this machine (so "several rates" mean the same load
    on any hardware; static's or sequential's capacity when paged didn't run)."""
    cap = next((lt_modes[m]["requests_per_s"] for m in ("paged", "static", "sequential")
                if m in lt_modes and lt_modes[m].get("requests_per_s")), None)
    online: dict[str, Any] = {"capacity_requests_per_s": cap, "rates": {}}
    if not cap:
        return online
    base = Workload(lt.name, lt.requests[: cfg.online_n])
    for frac in cfg.rate_fractions:
        w = with_poisson_arrivals(base, frac * cap, cfg.seed)
        entry = {"rate_requests_per_s": w.rate, "fraction_of_capacity": frac, "modes": {}}
        online["rates"][f"{frac:g}"] = entry
        for mode in cfg.online_modes:
            entry["modes"][mode] = run_one(mode, w, ref_key=lt.name)
    return online


def _limits(model: Any, lt: Workload, lt_modes: dict[str, Any], quick: bool) -> dict[str, Any]:
    """The hardware's roofs for this model at each long-tailed mode's mean batch (an error entry
    when they can't be measured)."""
    mean_ctx = sum(len(r.prompt) + r.output_len / 2 for r in lt.requests) / len(lt.requests)
    batches = {m: v.get("mean_batch") for m, v in lt_modes.items() if v.get("mean_batch")}
    try:
        return device_limits(model, mean_ctx, batches, 0.2 if quick else 0.5)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def _floor_section(model: Any, lt_modes: dict[str, Any], lim: dict[str, Any], cfg: BenchConfig,
                   fair_res: dict[str, Any]) -> dict[str, Any]:
    """The paged run against the lower bounds of its own work (`bench.protocol.floor`): where its time went,
    the fastest the workload allows here, the largest ratio over each peer that allows (a peer at its
    best: its median in the fair comparison, when there is one), and the linear layers alone at the
    benchmark's batch size (the ceiling of the roof target)."""
    paged = lt_modes.get("paged") or {}
    if paged.get("status") != "ok" or not paged.get("work_per_step") or "memory_bytes_per_s" not in lim:
        return {"status": "skipped", "reason": "needs an ok paged run on long_tailed and the device limits"}
    try:
        floor = time_floor(model, paged, lim["memory_bytes_per_s"], lim["kv_bytes_per_token"],
                           points=5 if cfg.quick else 8, min_seconds=0.02 if cfg.quick else 0.05)
        at_batch = cfg.batch_size / measure_linear_layers(model, cfg.batch_size, min_seconds=0.1 if cfg.quick else 0.25)
    except Exception as exc:
        return {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    peers = {m: (lt_modes.get(m) or {}).get("tokens_per_s") for m in ("hf_static", "hf_continuous", "static")}
    if fair_res.get("status") == "ok":
        peers.update({m: fair_res["summary"]["contenders"][m]["median"] for m in ("hf_static", "hf_continuous")})
    floor["ratio_bounds"] = ratio_bounds(floor, peers)
    floor["linear_layers_at_batch"] = {"batch": cfg.batch_size, "tokens_per_s": at_batch,
                                       "fraction_of_compute_roof": at_batch / lim["compute_roof_tokens_per_s"]}
    return {"status": "ok", **floor}


def _fair_section(cfg: BenchConfig, model: Any, lt: Workload, reference: dict[str, list[int]] | None,
                  results: dict[str, Any], log: Log) -> dict[str, Any]:
    """The paged engine against the transformers peers by the fair protocol (`bench.protocol.side_by_side`:
    each in its own process at its best setting, alternating), on the long-tailed workload, every
    process checked against this run's sequential tokens -- whichever modes the table ran: the table
    runs every mode in this one process, with this process's settings, which is no comparison
    between systems."""
    import tempfile

    from inflight.bench.protocol import fair, side_by_side
    from inflight.bench.offline.models import save_model

    why = ("fair_rounds is 0" if not cfg.fair_rounds else
           "needs the long-tailed workload" if "long_tailed" not in cfg.workloads else
           "needs exact tokens (float32)" if reference is None else None)
    if why:
        return {"status": "skipped", "reason": why}
    with tempfile.TemporaryDirectory(prefix="inflight-fair-") as tmp:
        path = cfg.fair_reference or str(Path(tmp) / "reference_tokens.json")
        ref = fair.TokenReference.save(path, reference, "this benchmark's sequential run (python -m inflight.bench)")
        # the contenders load this very model (whatever it is: a checkpoint, the tiny one, a notebook's)
        shape = dict(prompt_range=cfg.prompt_range, output_mean=cfg.output_mean, output_cap=cfg.output_cap,
                     seed=cfg.seed, weights=save_model(model, str(Path(tmp) / "model.pt")), device=str(model.device))
        try:
            return side_by_side.run(len(lt.requests), cfg.fair_rounds, cfg.fair_search_rounds,
                                    min(cfg.fair_search_n, len(lt.requests)), cfg.fair_floor, path, batch_size=cfg.batch_size,
                                    log=lambda s: log(f"  fair: {s}"), ref=ref,
                                    ideal=results["workloads"][lt.name]["ideal"]["work_bound_speedup"], **shape)
        except Exception as exc:
            return {"status": "error", "error": f"{type(exc).__name__}: {exc}"}


def _header(cfg: BenchConfig, bm: BenchModel, setup: BenchSetup) -> dict[str, Any]:
    """What every results file starts with: when, the command, the machine, versions, model, memory."""
    model, mcfg = bm.model, bm.model.config
    return {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m inflight.bench"] + sys.argv[1:]) if sys.argv and "bench" in sys.argv[0] else None,
        "machine": _machine(), "versions": _versions(), "seed": cfg.seed, "config": asdict(cfg),
        "model": {"source": bm.source, "device": str(model.device), "dtype": str(model.dtype),
                  "parameters": sum(p.numel() for p in model.parameters()), "weights_sha256": bm.weights_sha256,
                  "config": {k: getattr(mcfg, k) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                          "num_hidden_layers", "num_attention_heads",
                                                          "num_key_value_heads", "head_dim",
                                                          "max_position_embeddings")}},
        "kv_memory": {"tokens": setup.kv_tokens, "bytes": setup.kv_tokens * kv_bytes_per_token(model),
                      "contiguous": {"slots": cfg.batch_size, "block_size": setup.max_len},
                      "paged": {"block_size": cfg.paged_block_size, "num_blocks": setup.paged_num_blocks,
                                "max_batch_size": setup.paged_max_batch}},
        "workloads": {},
        "device": describe_device(),
    }


def _machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    # hostname_hash answers "the same machine?" without naming it; sha256, because str's hash()
    # changes with every process
    info: dict[str, Any] = {"platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(),
                            "torch_threads": torch.get_num_threads(),
                            "hostname_hash": int(hashlib.sha256(platform.node().encode()).hexdigest(), 16) % 10**6}
    with contextlib.suppress(OSError, AttributeError):
        info["loadavg_start"] = list(os.getloadavg())
    return info


def _versions() -> dict[str, str]:
    import inflight

    v = {"python": platform.python_version(), "torch": torch.__version__, "inflight": inflight.__version__}
    for name in ("transformers", "triton", "numpy"):
        try:
            v[name] = __import__(name).__version__
        except Exception:
            v[name] = "not installed"
    return v


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def _section(collect: Callable[..., Any], report: Callable[[Any], str], **kwargs: Any) -> dict[str, Any]:
    """Another benchmark's figures (`collect(**kwargs)` and its `report`); a failure becomes an entry."""
    try:
        res = collect(**kwargs)
        text = report(res)
    except Exception as exc:
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    return {"status": "ok", "results": json.loads(json.dumps(res, default=str)), "report": text}


def _attention_section(quick: bool) -> dict[str, Any]:
    """The paged-KV chapter's figures (`inflight.bench.kernels.attention`)."""
    return _section(attention.collect, attention.report, quick=quick)


def _prefix_section(quick: bool, model: Any) -> dict[str, Any]:
    """The sharing chapter's figures (`inflight.bench.offline.prefix`): prefix caching on vs off."""
    return _section(prefix.collect, prefix.report, model=model, quick=quick)
