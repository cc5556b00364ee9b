"""The batched sampler: greedy, temperature, top-p, per-request seeds.

Determinism regardless of batch composition: each row's probabilities depend only on that row's
logits, and a seeded request draws its one uniform number per token from its *own*
`torch.Generator`. So a seeded request samples the same tokens alone or in a batch of 64, before
or after a preemption. The engine and the reference generator (`inflight.model.generate`) both
sample through here.

One row never takes the others down: a row whose logits are not finite, whose temperature turns
its probabilities into NaN, or whose generator fails is reported as failed (with the reason) and
the other rows are sampled as if it were not there. `Sampler.sample` returns those failures (the
engine ends just that request); calling the sampler directly raises `SamplingError` instead.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

__all__ = ["Sampler", "SamplingError", "sample_rows", "make_generator"]


def make_generator(seed: int | None, device: str | torch.device = "cpu") -> torch.Generator | None:
    """A request's own random stream (None for unseeded requests, which share the engine's)."""
    if seed is None:
        return None
    g = torch.Generator(device="cpu")  # draws happen on CPU: same numbers on every device
    g.manual_seed(int(seed))
    return g


class SamplingError(RuntimeError):
    """Some rows could not be sampled; `failures` maps each such row to the reason."""

    def __init__(self, failures: dict[int, str]):
        self.failures = failures
        row, why = next(iter(failures.items()))
        super().__init__(f"{len(failures)} row(s) could not be sampled; row {row}: {why}")


class Sampler:
    """Turns a `[S, vocab]` block of float32 logits into one token id per row."""

    def __init__(self, seed: int = 0):
        self.generator = torch.Generator(device="cpu")  # shared stream of unseeded requests
        self.generator.manual_seed(seed)

    def __call__(self, logits: torch.Tensor, temperatures: Sequence[float], top_ps: Sequence[float],
                 generators: Sequence[torch.Generator | None]) -> list[int]:
        """One token per row of `logits`; `temperatures[i]` (0 = greedy), `top_ps[i]` and
        `generators[i]` (None = the shared stream) belong to row i. Raises `SamplingError` if a row
        cannot be sampled."""
        tokens, failures = self.sample(logits, temperatures, top_ps, generators)
        if failures:
            raise SamplingError(failures)
        return tokens

    def sample(self, logits: torch.Tensor, temperatures: Sequence[float], top_ps: Sequence[float],
               generators: Sequence[torch.Generator | None]) -> tuple[list[int], dict[int, str]]:
        """Like calling the sampler, but a row that cannot be sampled gets token -1 and an entry in
        the returned `{row: reason}`; the other rows are unaffected."""
        best, greedy = logits.max(dim=-1)  # the greedy token, and a NaN/inf check of the row for free
        out, failures = greedy.tolist(), {}
        top = best.tolist()
        if not math.isfinite(sum(top)):  # (one C-level sum: the common case costs no per-row Python)
            for i, v in enumerate(top):
                if not math.isfinite(v):
                    failures[i], out[i] = "the model's logits for it are not finite (NaN or +inf, or all -inf)", -1
        rows = [i for i, t in enumerate(temperatures) if t > 0 and i not in failures]
        if not rows:  # the common fast path: greedy rows only, no per-row work
            return out, failures
        draws = self._uniforms(rows, generators, failures)
        if len(draws) < len(rows):  # a row whose generator failed is out
            rows = list(draws)
            out = [-1 if i in failures else t for i, t in enumerate(out)]
        if not rows:
            return out, failures
        temps = torch.tensor([temperatures[i] for i in rows], dtype=torch.float64)
        top_p = torch.tensor([top_ps[i] for i in rows], dtype=torch.float64)
        picked = sample_rows(logits[rows].cpu(), temps, top_p, torch.tensor(list(draws.values()), dtype=torch.float64))
        for i, token in zip(rows, picked):
            if token is None:
                failures[i] = f"temperature {temperatures[i]!r} makes its probabilities NaN"
                out[i] = -1
            else:
                out[i] = token
        return out, failures

    def _uniforms(self, rows: list[int], generators: Sequence[torch.Generator | None],
                  failures: dict[int, str]) -> dict[int, float]:
        """One uniform number per sampled row (in `rows` order), from the row's own stream when it
        is seeded; a generator that fails is that row's failure alone (and it gets no number)."""
        u = dict.fromkeys(rows, 0.0)
        shared = [i for i in rows if generators[i] is None]
        if shared:
            u.update(zip(shared, torch.rand(len(shared), generator=self.generator, dtype=torch.float64).tolist()))
        for i in rows:
            if generators[i] is not None:
                try:
                    u[i] = torch.rand(1, generator=generators[i], dtype=torch.float64).item()
                except Exception as exc:  # noqa: BLE001 - whatever went wrong, it is this row's alone
                    failures[i] = f"its random generator failed ({type(exc).__name__}: {exc})"
                    del u[i]
        return u


def sample_rows(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                u: torch.Tensor) -> list[int | None]:
    """Inverse-CDF sampling of each row with its own temperature, top-p and uniform `u` in [0, 1);
    None for a row whose probabilities are not a distribution (NaN or all zero).

    Tokens are sorted by probability (ties by token id, so the order is stable), the nucleus is
    the shortest prefix reaching `top_p`, and `u` picks a token inside it. The division by the
    temperature is done in float64, where even a temperature of 1e-300 stays finite."""
    probs = torch.softmax(logits.double() / temperature[:, None].double(), dim=-1)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    cum = sorted_p.cumsum(-1)
    # keep token k if the mass before it is < top_p (so the first token is always kept)
    keep = (cum - sorted_p) < top_p[:, None]
    sorted_p = sorted_p * keep
    cum = sorted_p.cumsum(-1)
    total = cum[:, -1]
    target = u * total
    idx = torch.searchsorted(cum, target[:, None], right=True).clamp(max=cum.shape[1] - 1)
    # searchsorted can land on a zero-probability tail entry only through rounding: step back to kept ones
    idx = torch.minimum(idx, keep.sum(-1, keepdim=True) - 1).clamp(min=0)
    valid = torch.isfinite(total) & (total > 0)
    picked = torch.where(valid, order.gather(1, idx).squeeze(1), -1).tolist()
    return [None if t < 0 else t for t in picked]
