"""What a reader sees of a benchmark run: a fixed-width table per workload, the whole report as
text, and the results saved as JSON (the format `results/*.json`, chapter 7 and chapter 5 read)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from inflight.bench.offline.config import MODE_TITLES, MODES

__all__ = ["format_table", "format_report", "format_fair", "target_lines", "save_results", "print_and_save"]


def _f(x: Any, fmt: str, scale: float = 1.0) -> str:
    return "—" if x is None else format(x * scale, fmt)


def format_table(modes: dict[str, dict[str, Any]]) -> str:
    """A fixed-width table of one workload's modes."""
    head = (f"{'mode':30} {'tok/s':>8} {'req/s':>7} {'TTFT p50/p99 ms':>17} {'TPOT p50/p99 ms':>16} "
            f"{'batch':>6} {'KV MiB':>7} {'KV used':>7} {'peak MiB':>8} {'not fwd':>7}")
    lines = [head, "-" * len(head)]
    for m in MODES:
        v = modes.get(m)
        if v is None:
            continue
        title = v.get("title", m)
        if v.get("status") == "unavailable":
            lines.append(f"{title:30} unavailable: {v.get('error', '')[:90]}")
            continue
        if v.get("status") == "outputs differ":
            lines.append(f"{title:30} REFUSED (outputs differ): {v.get('reason', '')[:90]}")
            continue
        ttft = f"{_f(v['ttft_p50_s'], '.0f', 1e3)}/{_f(v['ttft_p99_s'], '.0f', 1e3)}"
        tpot = f"{_f(v['tpot_p50_s'], '.1f', 1e3)}/{_f(v['tpot_p99_s'], '.1f', 1e3)}"
        title = title[:28] + (" !" if v.get("machine_busy") else "")  # ! : other programs competed for the cores
        lines.append(f"{title:30} {_f(v['tokens_per_s'], '8.0f')} {_f(v['requests_per_s'], '7.2f')} {ttft:>17} "
                     f"{tpot:>16} {_f(v['mean_batch'], '6.1f')} {_f(v['kv_allocated_bytes'], '7.1f', 2**-20)} "
                     f"{_f(v['kv_used_share'], '7.0%')} {_f(v['peak_memory_bytes'], '8.0f', 2**-20)} "
                     f"{_f(v['outside_forward_share'], '7.0%')}")
    if any(v.get("machine_busy") for v in modes.values()):
        lines.append("! the machine was busy during this run (other programs competed for the cores): "
                     "its speed is not comparable with a quiet run")
    return "\n".join(lines)


def format_report(results: dict[str, Any]) -> str:
    """Everything a reader wants on stdout: tables per workload, online sweep, limits, targets."""
    out = [f"device: {results['device']}", f"model: {results['model']['source']} "
           f"({results['model']['parameters'] / 1e6:.2f}M parameters, {results['model']['dtype']})",
           f"KV memory for every cached mode: {results['kv_memory']['tokens']} tokens "
           f"({results['kv_memory']['bytes'] / 2**20:.1f} MiB)"]
    out += _agreement_lines(results)
    for name, w in results["workloads"].items():
        if name != "online":
            out += ["", f"== {name}: {w['requests']} requests, {w['useful_tokens']} tokens to generate ==",
                    format_table(w["modes"]), _ideal_line(w["ideal"])]
    out += _online_lines(results["workloads"].get("online"))
    fair = results.get("fair") or {}
    out += ["", format_fair(fair)] if fair.get("status") == "ok" else \
        (["", f"fair comparison with the peers: {fair['status']} ({fair.get('reason') or fair.get('error')})"] if fair else [])
    out += _limits_lines(results.get("device_limits", {}), results["workloads"].get("long_tailed", {}).get("modes", {}))
    out += _floor_lines(results.get("time_floor") or {})
    for key, title in (("attention_bench", "attention bench (inflight.bench.kernels.attention)"),
                       ("prefix_caching", "prefix caching (inflight.bench.offline.prefix)"),
                       ("decode_step", "decode step at batch 1 (inflight.bench.kernels.decode_step)")):
        sec = results.get(key, {})
        out += ["", f"{title}: {sec.get('status')}" + (f" ({sec.get('error')})" if sec.get("error") else "")]
        if sec.get("report"):
            out.append(sec["report"])
    out += ["", "targets:"]
    for k, v in results.get("targets", {}).items():
        out.append(f"  {k}: {json.dumps(v, default=lambda x: round(x, 3) if isinstance(x, float) else str(x))}")
    return "\n".join(out)


def _agreement_lines(results: dict[str, Any]) -> list[str]:
    """The correctness policy, and in half precision each mode's measured deviation."""
    pol = results.get("agreement_policy") or {}
    if pol.get("policy") != "teacher_forced_logprobs":
        return []
    out = [f"check ({pol['dtype']}): teacher-forced log-probabilities within {pol['tolerance_nats']} nats + "
           f"{pol['tolerance_relative']:.3g} x |top logit| of the reference's greedy token (inflight.bench.offline.agreement)"]
    for name, w in results["workloads"].items():
        for m, v in (w.get("modes") or {}).items():
            a = v.get("agreement")
            if a:
                out.append(f"  {name} {MODE_TITLES.get(m, m):28} max {a['max_deviation_nats']:.3f} mean "
                           f"{a['mean_deviation_nats']:.4f} nats; greedy choice differs on {a['share_argmax_differs']:.1%} "
                           f"of {a['tokens']} tokens: {'pass' if a['passed'] else 'FAIL'}")
    return out


def _ideal_line(ideal: dict[str, Any]) -> str:
    line = (f"simulator, {ideal['batch_size']} slots: static {ideal['static_steps']} steps, continuous "
            f"{ideal['continuous_steps']} steps → ideal speedup {ideal['ideal_speedup']:.2f}x if every step "
            f"costs the same, {ideal['work_bound_speedup']:.2f}x if a step costs in proportion to its rows")
    if "realized_speedup" in ideal:
        line += (f"; realized (contiguous/static tok/s) {ideal['realized_speedup']:.2f}x = "
                 f"{ideal['realized_fraction']:.0%} of ideal")
    return line


def _online_lines(online: dict[str, Any] | None) -> list[str]:
    if not online or not online.get("rates"):
        return []
    out = ["", f"== online (Poisson arrivals; capacity ≈ {online['capacity_requests_per_s']:.2f} req/s) =="]
    for frac, e in online["rates"].items():
        for m, v in e["modes"].items():
            if v.get("status") != "ok":
                out.append(f"  {frac}x {m:12} {v.get('status')}: {v.get('reason') or v.get('error')}")
                continue
            out.append(f"  rate {e['rate_requests_per_s']:6.2f}/s ({frac}x) {MODE_TITLES[m]:28} "
                       f"{v['tokens_per_s']:7.0f} tok/s  TTFT p50 {_f(v['ttft_p50_s'], '.0f', 1e3)} ms "
                       f"p99 {_f(v['ttft_p99_s'], '.0f', 1e3)} ms  TPOT p50 {_f(v['tpot_p50_s'], '.1f', 1e3)} ms")
    return out


def format_fair(fair: dict[str, Any]) -> str:
    """The comparison with the peers by the fair protocol (`bench.protocol.fair`, `bench.protocol.side_by_side`):
    each system's median and range, its setting, each ratio's median and range, the token check."""
    rounds = len(fair["rounds"])
    searched = fair.get("search_rounds") and any(v["tried"] for v in fair["settings"].values())
    out = [f"fair comparison with the peers: each system in its own process, {rounds} alternating round"
           f"{'s' if rounds > 1 else ''}, at " + ("the best of its settings (searched)" if searched else
                                                  "its library's own settings (not searched here)")]
    for name, v in fair["summary"]["contenders"].items():
        out.append(f"  {MODE_TITLES.get(name, name):30} median {_f(v['median'], '.0f')} tok/s, range "
                   f"{_f(v['min'], '.0f')}-{_f(v['max'], '.0f')} ({fair['settings'][name]['best']['label']})")
    for pair, r in fair["summary"]["ratios"].items():
        if r["n"]:
            out.append(f"  {pair}: median {r['median']:.2f}x, range {r['min']:.2f}-{r['max']:.2f}x")
    if fair.get("target"):
        out += ["  " + line for line in target_lines(fair["target"])]
    out.append("  every process's tokens identical to the reference: " + ("yes" if fair["all_tokens_identical"] else "NO"))
    return "\n".join(out)


def target_lines(t: dict[str, Any]) -> list[str]:
    """The targets of a fair comparison (`bench.protocol.side_by_side.run`'s "target"): over `generate` as a
    multiple of the ideal, and the engine's time over its floor when it was measured."""
    if not t["rounds_measured"]:
        return ["no round gave both speeds (a process's tokens differed from the reference)"]
    lines = [f"paged over transformers generate: median {t['median_of_ideal']:.2f}x the work-bound ideal "
                 f"({t['work_bound_ideal']:.2f}x), range {t['min_of_ideal']:.2f}-{t['max_of_ideal']:.2f}x over "
                 f"{t['rounds_measured']} rounds; target >= {t['of_ideal_at_least']}x: "
                 f"{'met' if t['met'] else 'not met'}; paged over transformers CB: median {t['median_over_hf_continuous']:.2f}x"]
    if "floor" in t and t["floor"].get("n"):
        f = t["floor"]
        lines.append(f"paged engine's time over its floor: median {f['median']:.2f}x, range {f['min']:.2f}-{f['max']:.2f}x "
                     f"(median run over the lowest floor of any round: {f['median_wall_over_lowest_floor']:.2f}x); "
                     f"target <= {f['wall_over_floor_at_most']}x: {'met' if f['met'] else 'not met'}")
    return lines


def _limits_lines(lim: dict[str, Any], modes: dict[str, Any]) -> list[str]:
    if "matmul_flops_per_s" not in lim:
        return []
    out = ["", f"device limits: matmul {lim['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s, copy "
               f"{lim['memory_bytes_per_s'] / 1e9:.1f} GB/s; model {lim['model_flops_per_token'] / 1e6:.2f} "
               f"MFLOP/token → compute roof {lim['compute_roof_tokens_per_s']:.0f} tok/s"]
    for m, r in lim["per_mode"].items():
        frac = modes.get(m, {}).get("fraction_of_roof")
        lin = r.get("linear_layers_tokens_per_s")
        tps = modes.get(m, {}).get("tokens_per_s")
        out.append(f"  {MODE_TITLES.get(m, m):30} batch {r['batch']:5.1f}: roof {r['roof_tokens_per_s']:8.0f} "
                   f"tok/s, achieved {_f(frac, '.1%')}; linear layers alone {_f(lin, '.0f')} tok/s "
                   f"({_f(lin / r['roof_tokens_per_s'] if lin else None, '.0%')} of the roof), achieved "
                   f"{_f(tps / lin if lin and tps else None, '.0%')} of that")
    return out


def _floor_lines(floor: dict[str, Any]) -> list[str]:
    """Where the paged run's time went against the floors of its own work, and what they allow."""
    if floor.get("status") != "ok":
        return []
    out = ["", f"where the paged run's time went (inflight.bench.protocol.floor): {floor['wall_s']:.2f} s = linear layers "
               f"at their measured rate {floor['linear_layers_s']:.2f} s ({floor['linear_share']:.0%}) + one KV read "
               f"per step at the copy rate {floor['kv_read_s']:.2f} s ({floor['kv_share']:.0%}) + everything else "
               f"{floor['rest_s']:.2f} s ({floor['rest_share']:.0%})",
           f"  fastest this workload allows here: {floor['max_tokens_per_s_linear_only']:.0f} tok/s with only the "
           f"linear layers, {floor['max_tokens_per_s_linear_and_kv']:.0f} with one KV read per step"]
    for peer, b in floor.get("ratio_bounds", {}).items():
        out.append(f"  largest possible ratio over {MODE_TITLES.get(peer, peer)}: {b['linear_only']:.1f}x "
                   f"(linear only), {b['linear_and_kv']:.1f}x (with the KV read)")
    at = floor.get("linear_layers_at_batch")
    if at:
        out.append(f"  linear layers alone at batch {at['batch']}: {at['tokens_per_s']:.0f} tok/s = "
                   f"{at['fraction_of_compute_roof']:.0%} of the compute roof")
    return out


def _jsonable(x: Any) -> Any:
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else round(x, 6)
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def save_results(results: dict[str, Any], path: str | Path) -> None:
    """Write the results as indented JSON (floats rounded, NaN as null)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_jsonable(results), indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


def print_and_save(res: dict[str, Any], text: str, out: str | None) -> int:
    """A side benchmark's ending: print its report, write its JSON to `out` if given; the exit status
    (0 when it ran, 1 when it was unavailable here)."""
    print(text)
    if out:
        Path(out).write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
        print(f"results written to {out}")
    return 0 if res["status"] == "ok" else 1
