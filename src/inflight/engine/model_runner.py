"""`ModelRunner`: everything one step does with tensors (nano-vllm's `model_runner.py`).

The scheduler decides *who* runs and *how many tokens* each computes; it knows nothing about
tensors. The runner turns that decision into one forward pass: it flattens the ragged batch into
token ids and attention metadata (`prepare`), runs the model over the paged KV cache, and samples
one token for every request whose prompt is now complete. It also owns the KV cache's sizing and
the copies between the device pool and the CPU pool that swap preemption needs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from inflight.engine.block_manager import blocks_needed
from inflight.engine.cuda_graphs import DecodeGraphRunner
from inflight.engine.logprobs import StepLogprobs, prompt_rows
from inflight.engine.parallel_sampling import expand_draws
from inflight.engine.scheduler import SchedulerOutput
from inflight.engine.sequence import Sequence
from inflight.model.attention_metadata import AttentionMetadata
from inflight.model.kv_cache import KVCache, default_kv_budget_bytes, kv_bytes_per_token
from inflight.model.logprobs import token_logprobs
from inflight.model.sampler import Sampler
from inflight.engine.thread_governor import ThreadGovernor
from inflight.threads import adaptive_threads_wanted

__all__ = ["ModelRunner", "StepInputs", "StepPlan", "plan_batch", "step_tensors", "StepTimes", "KVSwapper", "step_logprobs", "default_num_blocks", "default_swap_blocks",
           "CPU_DEFAULT_TOKENS_PER_REQUEST", "GPU_MEMORY_FRACTION"]

#: On CPU, without `num_blocks`: enough blocks for `max_batch_size` requests of this many tokens each.
CPU_DEFAULT_TOKENS_PER_REQUEST = 512
#: On CUDA, without `num_blocks`: this fraction of the memory free after the weights are loaded.
GPU_MEMORY_FRACTION = 0.5


@dataclass
class StepInputs:
    """One step's batch as tensors: `logits_indices` are the rows to sample from, one per request
    in `sampling_seqs` (those whose prompt is complete after this step), in batch order, then the
    rows whose logits give prompt log-probabilities: `prompt_requests` lists (request, first
    position, count) for them, in order (`inflight.engine.logprobs`)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor
    sampling_seqs: list[Sequence]
    prompt_requests: list[tuple[Sequence, int, int]] = field(default_factory=list)
    num_prompt_rows: int = 0  # (after them: the rows of each verifying request's proposals, in order)


@dataclass
class StepTimes:
    """Where one step's tensor work went (seconds)."""

    prepare: float = 0.0
    forward: float = 0.0
    sample: float = 0.0


@dataclass
class StepPlan:
    """One step's batch as plain lists — what a tensor-parallel driver sends to every worker
    (`inflight.engine.executor`), each of which builds the same tensors from it (`step_tensors`)."""

    input_ids: list[int]
    query_lens: list[int]
    context_lens: list[int]
    block_tables: list[list[int]]
    logits_indices: list[int]


def plan_batch(batch: SchedulerOutput) -> tuple[StepPlan, list[Sequence], list[tuple[Sequence, int, int]], int]:
    """The batch flattened (see `ModelRunner.prepare`), the requests sampled, the prompt rows wanted
    for log-probabilities, and how many rows those are (after them in `logits_indices`: the rows of
    each verifying request's proposals, in order — speculative decoding)."""
    input_ids: list[int] = []
    query_lens, context_lens, tables, logits_idx, sampling = [], [], [], [], []
    prompt_idx, prompt_requests, spec_idx = [], [], []
    for s in batch.seqs:
        q, done, spec = s.num_scheduled_tokens, s.num_computed_tokens, s.spec_token_ids
        start = len(input_ids)
        input_ids.extend(s.token_ids[done:done + q - len(spec)])
        input_ids.extend(spec)  # (speculative decoding: the proposals follow the last token)
        query_lens.append(q)
        context_lens.append(done + q)
        tables.append(s.block_table)
        if done + q == s.num_tokens + len(spec):  # prompt complete (or a decode): its last row gives the next token
            logits_idx.append(len(input_ids) - 1 - len(spec))
            sampling.append(s)
            spec_idx.extend(range(len(input_ids) - len(spec), len(input_ids)))  # each proposal's row
        if s.prompt_logprobs is not None:  # (asked for them: the rows of its prompt tokens too)
            first, count = prompt_rows(s)
            if count:
                prompt_idx.extend(range(start + first, start + first + count))
                prompt_requests.append((s, done + first, count))
    plan = StepPlan(input_ids, query_lens, context_lens, tables, logits_idx + prompt_idx + spec_idx)
    return plan, sampling, prompt_requests, len(prompt_idx)


def step_tensors(plan: StepPlan, block_size: int, device: torch.device
                 ) -> tuple[torch.Tensor, AttentionMetadata, torch.Tensor]:
    """The step's token ids, attention metadata (positions included) and logits rows, on `device`."""
    meta = AttentionMetadata.build(plan.query_lens, plan.context_lens, plan.block_tables, block_size, device)
    ids = torch.tensor(plan.input_ids, dtype=torch.long).to(device, non_blocking=True)
    idx = torch.tensor(plan.logits_indices, dtype=torch.long).to(device, non_blocking=True)
    return ids, meta, idx


class ModelRunner:
    """Runs scheduled batches through `model` over `kv_cache` and samples the next tokens."""

    def __init__(self, model: Any, kv_cache: KVCache, sampler: Sampler, graphs: DecodeGraphRunner | None = None):
        self.model = model
        self.kv_cache = kv_cache
        self.sampler = sampler
        self.device = kv_cache.device
        # decode-only steps that fit a bucket run padded from static buffers (graph replay on CUDA)
        self.graphs = graphs
        # on a CPU, each step runs on the cores other programs leave free (None: threads left alone)
        self.threads = ThreadGovernor() if self.device.type == "cpu" and adaptive_threads_wanted() else None

    def prepare(self, batch: SchedulerOutput) -> StepInputs:
        """Flatten the ragged batch: each request contributes its tokens from `num_computed_tokens`
        on (a prefill chunk, or the one new token of a decode), and is sampled if that reaches its end."""
        plan, sampling, prompt_requests, n_prompt = plan_batch(batch)
        ids, meta, idx = step_tensors(plan, self.kv_cache.block_size, self.device)
        return StepInputs(ids, meta.positions, meta, idx, sampling, prompt_requests, n_prompt)

    @torch.inference_mode()
    def run(self, batch: SchedulerOutput) -> tuple[list[int], dict[int, str], StepTimes, StepLogprobs]:
        """One forward pass over `batch`: the sampled tokens of the requests whose prompt is
        complete, in batch order (one each, or `n` for a request about to fork into its samples:
        `parallel_sampling.draws`); `{k: reason}` for the k-th token if it could not be sampled (it
        is -1: only that sample fails); the time each part took; and the log-probabilities the
        requests asked for (`inflight.engine.logprobs`)."""
        t0 = time.perf_counter()
        if self.threads is not None:
            self.threads.adjust()
            try:
                return self._run(batch, t0)
            finally:
                self.threads.restore()
        return self._run(batch, t0)

    def _run(self, batch: SchedulerOutput, t0: float) -> tuple[list[int], dict[int, str], StepTimes, StepLogprobs]:
        prompt_requests: list = []
        n_prompt = 0
        if self.graphs is not None and self.graphs.can_run(batch.seqs):
            seqs = batch.seqs  # a decode-only step: every request is sampled (and no prompt row is wanted)
            bucket, longest = self.graphs.prepare(seqs)
            t1 = time.perf_counter()
            logits = self.graphs.forward(len(seqs), bucket, longest)
        else:
            inputs = self.prepare(batch)
            seqs, prompt_requests, n_prompt = inputs.sampling_seqs, inputs.prompt_requests, inputs.num_prompt_rows
            t1 = time.perf_counter()
            logits = self.model(inputs.input_ids, inputs.positions, inputs.meta, self.kv_cache,
                                logits_indices=inputs.logits_indices)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # honest forward time
        t2 = time.perf_counter()
        tokens, failures, lps = self._sample(logits, seqs, prompt_requests, n_prompt)
        return tokens, failures, StepTimes(prepare=t1 - t0, forward=t2 - t1, sample=time.perf_counter() - t2), lps

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence], prompt_requests: list, n_prompt: int = 0
                ) -> tuple[list, dict[int, str], StepLogprobs]:
        """The draws of the step (a row per draw: a forking request's row repeated for its `n`
        samples, each with its own stream), then the log-probabilities asked for. A request that
        verifies proposals draws by the rejection rule instead (`_verify`): its entry is a list."""
        if not seqs and not prompt_requests:
            return [], {}, StepLogprobs()
        rows, params, generators = expand_draws(seqs)
        sample_logits = logits[:len(seqs)]
        if len(rows) != len(seqs):
            sample_logits = sample_logits[torch.tensor(rows, device=logits.device)]
        verify = [d for d, r in enumerate(rows) if seqs[r].spec_token_ids]
        temps = [p.temperature for p in params]
        for d in verify:  # (greedy here: their random streams are the rejection rule's)
            temps[d] = 0.0
        tokens, failures = self.sampler.sample(sample_logits, temps, [p.top_p for p in params],
                                               generators) if rows else ([], {})
        ks = [p.logprobs for p in params]
        spec_lps: dict[int, list] = {}
        if verify:
            for d in verify:
                ks[d] = None
            self._verify(verify, [seqs[rows[d]] for d in verify], sample_logits, logits[len(seqs) + n_prompt:],
                         tokens, failures, spec_lps)
        if not prompt_requests and all(k is None for k in ks) and not spec_lps:
            return tokens, failures, StepLogprobs()
        lps = step_logprobs(sample_logits, tokens, ks, logits[len(seqs):len(seqs) + n_prompt], prompt_requests)
        lps.spec = spec_lps
        return tokens, failures, lps

    def _verify(self, draws_at: list[int], seqs: list[Sequence], sample_logits: torch.Tensor,
                spec_logits: torch.Tensor, tokens: list, failures: dict[int, str], spec_lps: dict[int, list]) -> None:
        """Speculative decoding: for each verifying request (draw `draws_at[i]`), its rows — the last
        token's and one per proposal — through the rejection rule (`spec_decode.rejection_sampler`);
        `tokens[d]` becomes the list of tokens it emits, with their log-probabilities if asked. Its
        proposals stop before the first row that is not finite (a row whose own token cannot be
        sampled, the first, fails the request as in an ordinary step)."""
        from inflight.engine.spec_decode.rejection_sampler import greedy_verify, rejection_sample

        spec_logits = spec_logits.float()
        finite = torch.isfinite(spec_logits).all(-1).tolist()
        argmax = spec_logits.max(dim=-1).indices.tolist()
        at = 0
        for d, s in zip(draws_at, seqs):
            draft = s.spec_token_ids
            off, at = at, at + len(draft)
            if d in failures:
                continue
            ok = 0
            while ok < len(draft) and finite[off + ok]:
                ok += 1
            draft = draft[:ok]  # (row j + 1 verifies proposal j + 1 and gives the bonus: all must be finite)
            p = s.params
            try:
                if p.temperature == 0:
                    got = greedy_verify([tokens[d]] + argmax[off:off + ok], draft)
                    block = None
                else:
                    g = s.generator if s.generator is not None else self.sampler.generator
                    block = torch.cat([sample_logits[d:d + 1].float(), spec_logits[off:off + ok]])
                    got = rejection_sample(block.cpu(), draft, p.temperature, p.top_p,
                                           lambda: torch.rand(1, generator=g, dtype=torch.float64).item())
            except Exception as exc:  # noqa: BLE001 - one request's failure, reported as its own
                failures[d], tokens[d] = f"{type(exc).__name__}: {exc}", -1
                continue
            tokens[d] = got
            if p.logprobs is not None:
                if block is None:
                    block = torch.cat([sample_logits[d:d + 1].float(), spec_logits[off:off + ok]])
                spec_lps[d] = token_logprobs(block[:len(got)], got, [p.logprobs] * len(got))


    def run_isolating(self, batch: SchedulerOutput) -> tuple[SchedulerOutput, list[int], dict[int, str], StepTimes,
                                                             StepLogprobs, dict[Sequence, str]]:
        """`run(batch)`, but when its forward pass raises, find out whether some requests are the
        cause: each is run alone (forward only, so no random number is drawn). If some fail alone
        and others don't, the failing ones are left out — returned as `{request: why}` for the
        engine to end — and the rest run as one batch. Otherwise (a flaky or broken model, not one
        request's problem) the error is raised, and the engine stands as before the step.
        Returns the batch that ran, then what `run` returns, then the requests left out."""
        try:
            return (batch, *self.run(batch), {})
        except Exception:
            broken = {s: why for s in batch.seqs if (why := self._fails_alone(s)) is not None}
            if not broken or len(broken) == len(batch.seqs):
                raise
        rest = [s for s in batch.seqs if s not in broken]
        decode = sum(s.num_scheduled_tokens == 1 and s.num_computed_tokens == s.num_tokens - 1 for s in rest)
        ran = SchedulerOutput(rest, sum(s.num_scheduled_tokens for s in rest) - decode, decode)
        return (ran, *self.run(ran), broken)

    @torch.inference_mode()
    def _fails_alone(self, s: Sequence) -> str | None:
        """Why the forward pass of `s`'s scheduled tokens, alone, raises; None if it doesn't. (It
        writes only `s`'s own new KV slots, which the next computation of those tokens rewrites.)"""
        try:
            inputs = self.prepare(SchedulerOutput([s], 0, 0))
            self.model(inputs.input_ids, inputs.positions, inputs.meta, self.kv_cache,
                       logits_indices=inputs.logits_indices)
        except Exception as exc:  # noqa: BLE001 - this request's failure, reported as its own
            return f"{type(exc).__name__}: {exc}"
        return None


def step_logprobs(sample_logits: torch.Tensor, tokens: list[int], ks: list[int | None],
                  prompt_logits: torch.Tensor | None = None,
                  prompt_requests: list[tuple[Sequence, int, int]] = ()) -> StepLogprobs:
    """The step's answers: draw k (row k of `sample_logits`, which gave `tokens[k]`) when `ks[k]` is
    not None; and for each (request, first position, count) of `prompt_requests`, in order, the next
    `count` rows of `prompt_logits`. A draw that failed (token -1) gets none."""
    out = StepLogprobs()
    rows = [k for k, want in enumerate(ks) if want is not None and tokens[k] >= 0]
    if rows:
        got = token_logprobs(sample_logits[rows], [tokens[k] for k in rows], [ks[k] for k in rows])
        out.sampled = dict(zip(rows, got))
    if prompt_requests:
        ids, kk = [], []
        for s, first, count in prompt_requests:
            ids += s.token_ids[first + 1:first + 1 + count]
            kk += [s.params.prompt_logprobs] * count
        got = token_logprobs(prompt_logits, ids, kk)
        at = 0
        for s, first, count in prompt_requests:
            out.prompt.append((s, first + 1, got[at:at + count]))
            at += count
    return out


class KVSwapper:
    """Copies KV blocks between the device cache and a CPU pool of the same per-block shape
    (pinned on CUDA, so the copies can overlap). The scheduler calls it with (device, cpu) block pairs."""

    def __init__(self, kv: KVCache, num_cpu_blocks: int):
        pin = kv.device.type == "cuda"
        shape = (num_cpu_blocks, kv.block_size, kv.num_kv_heads, kv.head_dim)
        self.kv = kv
        self.k = [torch.zeros(shape, dtype=kv.dtype, pin_memory=pin) for _ in range(kv.num_layers)]
        self.v = [torch.zeros(shape, dtype=kv.dtype, pin_memory=pin) for _ in range(kv.num_layers)]
        self.bytes_moved = 0

    def _indices(self, pairs: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        dev = torch.tensor([p[0] for p in pairs], dtype=torch.long).to(self.kv.device)
        return dev, torch.tensor([p[1] for p in pairs], dtype=torch.long)

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        if not pairs:
            return
        dev, cpu = self._indices(pairs)
        for layer in range(self.kv.num_layers):
            self.k[layer][cpu] = self.kv.k_cache[layer][dev].to("cpu")
            self.v[layer][cpu] = self.kv.v_cache[layer][dev].to("cpu")
        self.bytes_moved += len(pairs) * self.kv.bytes_per_block

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        if not pairs:
            return
        dev, cpu = self._indices(pairs)
        for layer in range(self.kv.num_layers):
            self.kv.k_cache[layer][dev] = self.k[layer][cpu].to(self.kv.device, non_blocking=True)
            self.kv.v_cache[layer][dev] = self.v[layer][cpu].to(self.kv.device, non_blocking=True)
        self.bytes_moved += len(pairs) * self.kv.bytes_per_block


def default_num_blocks(config: Any, dtype: torch.dtype, device: torch.device, block_size: int,
                       max_batch_size: int, max_model_len: int) -> int:
    """The KV pool when none is given. On CUDA, as serving engines do: `GPU_MEMORY_FRACTION` of the
    memory free after the weights are loaded. On CPU: enough for `max_batch_size` requests of
    `CPU_DEFAULT_TOKENS_PER_REQUEST` tokens, capped by `default_kv_budget_bytes`."""
    per_block = kv_bytes_per_token(config.num_hidden_layers, config.num_key_value_heads, config.head_dim,
                                   dtype) * block_size
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        # memory torch's caching allocator holds but no tensor uses (an earlier engine's cache,
        # deleted) is free to this process, though the driver counts it as used
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return max(1, int(free * GPU_MEMORY_FRACTION) // per_block)
    want = max_batch_size * blocks_needed(min(CPU_DEFAULT_TOKENS_PER_REQUEST, max_model_len), block_size)
    return max(1, min(want, default_kv_budget_bytes("cpu") // per_block))


def default_swap_blocks(kv: KVCache) -> int:
    """The CPU pool of swap preemption when none is given: as many blocks as the device pool, but on
    CUDA at most a quarter of the host's RAM — a GPU pool can be tens of GiB, and mirroring it in
    pinned memory could exhaust RAM (Colab has 12 GiB)."""
    if kv.device.type != "cuda":
        return kv.num_blocks
    host = default_kv_budget_bytes("cpu", cpu_fraction=0.25, cpu_cap_bytes=16 << 30)
    return min(kv.num_blocks, max(1, host // kv.bytes_per_block))
