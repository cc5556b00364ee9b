"""Prometheus metrics with vLLM's names under `inflight:` (vLLM's `vllm/v1/metrics/loggers.py`).

Gauges (requests running and waiting, KV-cache usage) are read from the engine loop's latest
snapshot when /metrics is scraped; counters and histograms are recorded by the loop after every
step, from the step's outputs: a request's TTFT and prompt tokens when its first token comes out,
each inter-token gap as it happens, its end-to-end latency and queue time when it ends. All are the
engine's own clock (arrival = when the HTTP request came in), so a client sees these plus the
network. Each server has its own registry, so several can live in one process (tests).
"""
from __future__ import annotations

import re
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["ServerMetrics", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: the ignored-fields counter is labelled by field name, which the client chooses: past this many
#: names (or for a name that does not look like a field), it counts under "other", so that a client
#: inventing names cannot grow the registry without bound
MAX_FIELD_LABELS = 100
_FIELD_NAME = re.compile(r"[A-Za-z0-9_.\[\]-]{1,64}")
# vLLM's buckets
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class ServerMetrics:
    """The server's metrics (a registry of its own) and how each step updates them."""

    def __init__(self, model_name: str, num_speculative_tokens: int | None = None):
        """`num_speculative_tokens`: the engine speculates (its k): the spec_decode counters are served too."""
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r, m = self.registry, [model_name]

        def gauge(name, doc):
            return Gauge(f"inflight:{name}", doc, labels, registry=r).labels(*m)

        def counter(name, doc):
            return Counter(f"inflight:{name}", doc, labels, registry=r).labels(*m)

        def histogram(name, doc, buckets):
            return Histogram(f"inflight:{name}", doc, labels, buckets=buckets, registry=r).labels(*m)

        self.running = gauge("num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prompt_tokens = counter("prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Number of generation tokens processed.")
        self.preemptions = counter("num_preemptions", "Cumulative number of preemptions from the engine.")
        self.prefix_queries = counter("prefix_cache_queries", "Prefix cache queries, in queried tokens.")
        self.prefix_hits = counter("prefix_cache_hits", "Prefix cache hits, in cached tokens.")
        self._success = Counter("inflight:request_success", "Count of finished requests, by finish reason.",
                                labels + ["finished_reason"], registry=r)
        self._ignored = Counter("inflight:request_ignored_fields", "Request fields this server does not know, "
                                "accepted and ignored (as vLLM does), by field.", labels + ["field"], registry=r)
        self._ignored_names: set[str] = set()
        self.model_name = model_name
        self.ttft = histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             REQUEST_BUCKETS)
        self.queue = histogram("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                               REQUEST_BUCKETS)
        self.spec = None
        if num_speculative_tokens:  # vLLM's speculative-decoding counters (vllm/v1/spec_decode/metrics.py)
            self.spec = (counter("spec_decode_num_drafts", "Number of spec decoding drafts."),
                         counter("spec_decode_num_draft_tokens", "Number of draft tokens."),
                         counter("spec_decode_num_accepted_tokens", "Number of accepted tokens."),
                         self._per_pos(r, labels, model_name, num_speculative_tokens))
            self._spec_last = (0, 0, 0, [0] * num_speculative_tokens)
        self._seen: dict[str, int] = {}      # tokens of each running request already counted
        self._prefix = (0, 0)                # the engine's prefix-cache totals at the last step

    def on_step(self, outputs: list, engine: Any) -> None:
        """Record one step (called on the engine loop, after each `step()` and only then: `engine.stats[-1]`
        is that step's record)."""
        if engine.stats:
            self.preemptions.inc(engine.stats[-1].num_preempted)
        pc = engine.prefix_cache_stats()
        queries, hits = pc["prefix_cache_query_tokens"], pc["prefix_cache_hit_tokens"]
        self.prefix_queries.inc(queries - self._prefix[0])
        self.prefix_hits.inc(hits - self._prefix[1])
        self._prefix = (queries, hits)
        if self.spec is not None:
            self._spec_step(engine.spec_decode_stats())
        for out in outputs:
            seen = self._seen.get(out.request_id, 0)
            times = out.token_times
            self.generation_tokens.inc(len(times) - seen)
            if seen == 0 and times:  # its first token
                self.ttft.observe(times[0] - out.arrival_time)
                # its whole prompt, once (vLLM's count: with the part the prefix cache supplied, without recomputes)
                self.prompt_tokens.inc(len(out.prompt_token_ids))
            for a, b in zip(times[max(seen - 1, 0):], times[max(seen, 1):]):
                self.itl.observe(b - a)
            if out.finished:
                self._seen.pop(out.request_id, None)
                self.request_finished(out.finish_reason)
                if out.finish_time is not None:
                    self.e2e.observe(out.finish_time - out.arrival_time)
                if out.queue_time is not None:
                    self.queue.observe(out.queue_time)
            else:
                self._seen[out.request_id] = len(times)

    @staticmethod
    def _per_pos(registry, labels, model_name, k):
        c = Counter("inflight:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                    labels + ["position"], registry=registry)
        return [c.labels(model_name, str(i)) for i in range(k)]

    def _spec_step(self, st: dict) -> None:
        if not st:
            return
        now = (st["spec_num_drafts"], st["spec_num_draft_tokens"], st["spec_num_accepted_tokens"],
               st["spec_accepted_per_pos"])
        for c, a, b in zip(self.spec[:3], now[:3], self._spec_last[:3]):
            c.inc(a - b)
        for c, a, b in zip(self.spec[3], now[3], self._spec_last[3]):
            c.inc(a - b)
        self._spec_last = (now[0], now[1], now[2], list(now[3]))

    def request_finished(self, reason: str | None) -> None:
        self._success.labels(self.model_name, reason or "abort").inc()

    def fields_ignored(self, names: list[str]) -> None:
        """Count the fields a request carried that the server ignored (one each)."""
        for name in names:
            if name not in self._ignored_names and (len(self._ignored_names) >= MAX_FIELD_LABELS
                                                    or not _FIELD_NAME.fullmatch(name)):
                name = "other"
            self._ignored_names.add(name)
            self._ignored.labels(self.model_name, name).inc()

    def on_abort(self, request_id: str) -> None:
        """An aborted request (its client left, or the server is shutting down)."""
        self._seen.pop(request_id, None)
        self.request_finished("abort")

    def render(self, snapshot: Any) -> bytes:
        """The text format, with the gauges read from the engine loop's latest `snapshot`."""
        self.running.set(snapshot.num_running)
        self.waiting.set(snapshot.num_waiting)
        self.kv_usage.set(snapshot.blocks_used / max(snapshot.num_blocks, 1))
        return generate_latest(self.registry)
