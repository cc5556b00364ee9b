"""How the benchmark decides that a batched mode computed the same thing as the sequential run.

In float32 the answer is exact: every mode's greedy tokens must equal the sequential run's, token
for token (`metrics.check_outputs`). In bfloat16/float16 that test is wrong. A batch of 64 rows
multiplies its matrices in a different order (other tiles, other reduction splits) than a batch of
one, so every logit is rounded differently; where two tokens are nearly tied, the greedy choice
flips, and from then on the continuation differs. Such a mode is not wrong, only differently rounded.

So in half precision each request's output is **teacher-forced through the sequential reference**:
the model, at batch 1, reads the prompt followed by the tokens the mode generated and gives the
log-probability of every next token (`LlamaModel.forward_dense`). A correct mode picks, at each
position, the reference's greedy token or one whose log-probability is within the tolerance of it
(a near-tie the rounding could flip); a broken mode (a wrong cache slot, a mask off by one) picks
tokens the reference finds far less likely. Per mode we record the largest and the mean deviation
`logp(reference's argmax) - logp(mode's token)` (0 wherever they agree), and the share of tokens
whose greedy choice differs; the mode passes if no deviation exceeds the tolerance.

The tolerance at a position is `nats + relative × |largest logit|`: a half-precision number is
rounded relative to its size (bf16 keeps 8 significant bits, so logits near 64 are 0.25 apart),
and two nearly tied logits may each be off by about that much.
"""
from __future__ import annotations

from typing import Any

import torch

from inflight.bench.offline.prompts import Workload

__all__ = ["TOLERANCE", "policy_for", "teacher_forced_deviation", "describe_failure"]

#: Accepted deviation per half-precision dtype: (nats, relative to the largest logit's magnitude).
#: The relative part is about two units in the last place: bf16 keeps 8 significant bits (2^-6
#: covers two ulps), fp16 keeps 11 (2^-9).
TOLERANCE = {torch.bfloat16: (0.05, 2**-6), torch.float16: (0.01, 2**-9)}


def policy_for(dtype: torch.dtype, tolerance: float | None = None) -> dict[str, Any]:
    """The check a run in `dtype` gets: exact tokens (float32/64) or teacher-forced log-probabilities
    within a tolerance (half precision; `tolerance` overrides the dtype's default)."""
    if dtype not in TOLERANCE:
        return {"policy": "exact_tokens", "dtype": str(dtype),
                "rule": "every batched mode's greedy tokens equal the sequential run's"}
    nats, relative = TOLERANCE[dtype]
    if tolerance is not None:
        nats = float(tolerance)
        if not nats > 0:
            raise ValueError(f"the log-probability tolerance must be > 0 nats, got {tolerance!r}")
    return {"policy": "teacher_forced_logprobs", "dtype": str(dtype), "tolerance_nats": nats,
            "tolerance_relative": relative,
            "rule": "each generated token's reference log-probability is within tolerance_nats + tolerance_relative "
                    "x |largest logit| of the reference's greedy token's (the reference: the same model at "
                    "batch 1, teacher-forced)"}


@torch.inference_mode()
def teacher_forced_deviation(model: Any, workload: Workload, got: dict[str, list[int]],
                             policy: dict[str, Any]) -> dict[str, Any]:
    """Teacher-force each request's generated tokens through `model` at batch 1 and measure how far
    they fall below the reference's greedy choice, against the tolerance of `policy` (`policy_for`)."""
    nats, relative = policy["tolerance_nats"], policy["tolerance_relative"]
    devs: list[torch.Tensor] = []
    excess: list[torch.Tensor] = []  # deviation minus its position's tolerance
    missing = []
    for r in workload.requests:
        tokens = list(got.get(r.id) or [])[: r.output_len]
        if len(tokens) < r.output_len:
            missing.append(r.id)
        if not tokens:
            continue
        ids = torch.tensor([list(r.prompt) + tokens], device=model.device)
        logits = model.forward_dense(ids)[0, len(r.prompt) - 1: -1].float()  # the rows that predicted `tokens`
        logp = logits.log_softmax(-1)
        chosen = logp.gather(1, ids[0, len(r.prompt):, None]).squeeze(1)
        d = logp.max(-1).values - chosen
        devs.append(d.cpu())
        excess.append((d - nats - relative * logits.abs().max(-1).values).cpu())
    dev = torch.cat(devs) if devs else torch.zeros(0)
    beyond = int((torch.cat(excess) > 0).sum()) if excess else 0
    return {"tolerance_nats": nats, "tolerance_relative": relative, "tokens": int(dev.numel()),
            "max_deviation_nats": float(dev.max()) if dev.numel() else 0.0,
            "mean_deviation_nats": float(dev.mean()) if dev.numel() else 0.0,
            "share_argmax_differs": float((dev > 0).float().mean()) if dev.numel() else 0.0,
            "tokens_beyond_tolerance": beyond, "requests_short": len(missing),
            "passed": not missing and beyond == 0}


def describe_failure(res: dict[str, Any]) -> str | None:
    """None for a passing check, else a sentence saying why it failed."""
    if res["passed"]:
        return None
    if res["requests_short"]:
        return f"{res['requests_short']} requests returned fewer tokens than asked"
    return (f"teacher-forced: {res['tokens_beyond_tolerance']} of {res['tokens']} tokens fall further below the "
            f"reference's greedy choice than the tolerance (worst {res['max_deviation_nats']:.3g} nats)")
