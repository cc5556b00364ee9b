"""`AsyncEngine`: one `LLMEngine` stepped by one loop, fed by many concurrent requests (vLLM's
`AsyncLLM`, `vllm/v1/engine/async_llm.py`).

`LLMEngine` is not thread-safe, and must not be: its scheduler, block pool and requests change on
every step. So nothing but the engine loop ever calls into it. Requests and aborts reach it as
commands on a queue that the loop drains *between* steps; its outputs go back as one batch of
`StreamDelta`s per step, handed to the event loop with `call_soon_threadsafe` and dispatched there
into each request's `RequestOutputCollector` (which merges when the reader is slow). So:

- a request added at any moment is admitted at the next step; an abort takes effect before the
  next step, and the request's KV blocks are back in the pool when that step plans its batch;
- the loop steps while any request has work and sleeps on a condition when none has — an idle
  server uses no CPU;
- the loop never waits for a client: handing a step's deltas over never blocks.

The loop runs on its own thread by default (`loop="thread"`). torch releases the GIL inside its
operators, so the event loop keeps answering HTTP while a step computes. With `loop="task"` the
same loop is an asyncio task that calls `step()` directly: simpler, but every step then holds the
event loop for its whole length, and no request is read, no token written, no disconnect noticed
meanwhile (`python -m inflight.bench.serve.cost` measures both).
"""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

from inflight.engine.llm_engine import LLMEngine
from inflight.engine.outputs import RequestOutput
from inflight.engine.sampling import SamplingParams
from inflight.serve.output_collector import RequestOutputCollector, StreamDelta

__all__ = ["AsyncEngine", "RequestStream", "EngineDeadError", "EngineSnapshot", "LOOP_MODES"]

LOOP_MODES = ("thread", "task")


class EngineDeadError(RuntimeError):
    """The engine loop has stopped (a step raised, or the server is shutting down)."""


@dataclass
class EngineSnapshot:
    """The engine's state after its latest step, published by the loop for /metrics and back-pressure."""

    num_running: int = 0
    num_waiting: int = 0
    blocks_used: int = 0
    num_blocks: int = 1
    steps: int = 0


@dataclass
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float


@dataclass
class _Abort:
    request_id: str


class AsyncEngine:
    """Serve `engine` to concurrent asyncio callers through one stepping loop (see the module docstring).

    `observer` (optional, e.g. `ServerMetrics`) hears from the loop: `on_step(outputs, engine)` after
    every step and `on_abort(request_id)` for every abort; `threads` is torch's thread count for the
    loop's thread (default: the calling thread's). `stream_interval` (SGLang's `--stream-interval`)
    hands a request's tokens over once it has that many new ones (or has ended): fewer, bigger
    chunks, less work per token on the HTTP side, lumpier streams."""

    def __init__(self, engine: LLMEngine, *, loop: str = "thread", observer: Any = None, threads: int | None = None,
                 stream_interval: int = 1):
        if loop not in LOOP_MODES:
            raise ValueError(f"loop must be one of {LOOP_MODES}, got {loop!r}")
        import torch

        self.engine = engine
        self.mode = loop
        self.observer = observer
        self.stream_interval = stream_interval
        self.threads = torch.get_num_threads() if threads is None else threads
        self.snapshot = EngineSnapshot(num_blocks=engine.num_blocks)
        self.dead: BaseException | None = None      # why the loop stopped, once it has
        self._cond = threading.Condition()
        self._commands: list[_Add | _Abort] = []    # guarded by _cond
        self._pending_adds = 0                      # requests added, not yet in a snapshot (guarded by _cond)
        self._stopping = False
        self._collectors: dict[str, RequestOutputCollector] = {}  # event-loop thread only
        self._sent: dict[str, tuple[int, int]] = {}  # loop only: (tokens, characters) each request has been sent
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None     # task mode: new commands
        self._runner: threading.Thread | asyncio.Task | None = None
        self._next_id = 0

    # -- life cycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the loop (call from the event loop that will serve the requests)."""
        self._event_loop = asyncio.get_running_loop()
        if self.mode == "thread":
            self._runner = threading.Thread(target=self._run_thread, name="inflight-engine-loop", daemon=True)
            self._runner.start()
        else:
            self._wake = asyncio.Event()
            self._runner = asyncio.create_task(self._run_task())

    def stop(self) -> None:
        """Ask the loop to abort every request (each stream ends with finish_reason "abort") and stop;
        returns at once (call it from the event loop's thread, e.g. a signal handler)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._wake is not None:
            self._wake.set()

    async def shutdown(self, timeout: float = 30.0) -> None:
        """`stop()`, then wait for the loop to end."""
        self.stop()
        if isinstance(self._runner, threading.Thread):
            await asyncio.get_running_loop().run_in_executor(None, self._runner.join, timeout)
        elif self._runner is not None:
            await asyncio.wait_for(asyncio.shield(self._runner), timeout)

    @property
    def is_running(self) -> bool:
        return self.dead is None and self._runner is not None and not self._stopping

    def num_waiting(self) -> int:
        """Requests waiting for admission: the engine's queue after its last step plus those added
        since (a request counts as pending from `add_request` until a snapshot that includes it is
        published, so a burst of requests checked one after another sees every one before it)."""
        with self._cond:
            return self.snapshot.num_waiting + self._pending_adds

    # -- requests (event loop) ---------------------------------------------------------------------
    def new_request_id(self, prefix: str = "req") -> str:
        self._next_id += 1
        return f"{prefix}-{self._next_id}"

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str,
                    arrival_time: float | None = None) -> "RequestStream":
        """Queue a request now and return its stream of deltas (vLLM's `AsyncLLM.add_request`).
        Validate it first (`LLMEngine.check_request`). The caller must `close()` the stream however
        it stops reading: a request that has not finished is then aborted through the loop. A
        `request_id` still in use is refused (ValueError): its deltas would go to the wrong reader."""
        if not self.is_running:
            raise EngineDeadError(f"the engine loop is not running ({self.dead or 'shut down'})")
        if request_id in self._collectors:
            raise ValueError(f"request_id {request_id!r} is already in use")
        collector = RequestOutputCollector()
        self._collectors[request_id] = collector
        arrival = time.perf_counter() if arrival_time is None else arrival_time
        self._submit(_Add(request_id, prompt_token_ids, params, arrival))
        return RequestStream(self, request_id, collector)

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str,
                       arrival_time: float | None = None) -> AsyncIterator[StreamDelta]:
        """Queue a request (`add_request`) and yield its deltas until it ends. If the caller stops
        early (a client disconnected: the task is cancelled, or the generator closed), the request
        is aborted through the loop and its blocks go back to the pool."""
        stream = self.add_request(prompt_token_ids, params, request_id, arrival_time)
        try:
            async for delta in stream:
                yield delta
        finally:
            stream.close()

    def _submit(self, command: _Add | _Abort) -> None:
        with self._cond:
            self._commands.append(command)
            self._pending_adds += isinstance(command, _Add)
            self._cond.notify()
        if self._wake is not None:
            self._wake.set()

    def _dispatch(self, deltas: list[tuple[str, StreamDelta | BaseException]]) -> None:
        """On the event loop: each delta into its request's collector (gone if the client left)."""
        for request_id, delta in deltas:
            collector = self._collectors.get(request_id)
            if collector is not None:
                collector.put(delta)

    # -- the loop ----------------------------------------------------------------------------------
    def _run_thread(self) -> None:
        import torch

        torch.set_num_threads(self.threads)  # torch's thread count is per thread (an OpenMP setting)
        try:
            while True:
                with self._cond:
                    while not (self._commands or self._stopping or self.engine.has_unfinished_requests()):
                        self._cond.wait()  # idle: sleep until a command arrives
                deltas, done = self._iteration()
                if deltas:
                    self._event_loop.call_soon_threadsafe(self._dispatch, deltas)
                if done:
                    return
        except BaseException as exc:  # noqa: BLE001 - the loop died: every request hears it, /health says so
            self._die(exc)

    async def _run_task(self) -> None:
        try:
            while True:
                if not (self._commands or self._stopping or self.engine.has_unfinished_requests()):
                    await self._wake.wait()
                self._wake.clear()
                deltas, done = self._iteration()
                self._dispatch(deltas)
                if done:
                    return
                await asyncio.sleep(0)  # let the event loop serve HTTP between two steps
        except Exception as exc:  # noqa: BLE001
            self._die(exc)

    def _iteration(self) -> tuple[list, bool]:
        """Drain the commands, then one step; the deltas to hand over, and whether the loop is done."""
        with self._cond:
            commands, self._commands = self._commands, []
            stopping = self._stopping
        added = sum(isinstance(cmd, _Add) for cmd in commands)
        deltas: list[tuple[str, StreamDelta | BaseException]] = []
        for cmd in commands:
            if isinstance(cmd, _Abort):
                if self._sent.pop(cmd.request_id, None) is not None:  # (one that already ended: nothing to do)
                    self.engine.abort_request(cmd.request_id)
                    if self.observer is not None:
                        self.observer.on_abort(cmd.request_id)
            else:
                try:
                    self.engine.add_request(cmd.prompt_token_ids, cmd.params, request_id=cmd.request_id,
                                            arrival_time=cmd.arrival_time)
                    self._sent[cmd.request_id] = (0, 0)
                except (ValueError, TypeError) as exc:  # checked before, so only an id clash gets here
                    deltas.append((cmd.request_id, exc))
        if stopping:
            for rid in list(self.engine.requests):
                self.engine.abort_request(rid)
                deltas.append((rid, StreamDelta(finish_reason="abort")))
                if self.observer is not None:
                    self.observer.on_abort(rid)
            self._sent.clear()
            self._publish(added)
            return deltas, True
        if not self.engine.has_unfinished_requests():  # (only aborts came, or an add that failed): no step
            self._publish(added)                        # to run, and none for the observer to record
            return deltas, False
        outputs = self.engine.step()
        deltas += [(o.request_id, self._delta(o)) for o in outputs if self._due(o)]
        self._publish(added)
        if self.observer is not None:
            self.observer.on_step(outputs, self.engine)
        return deltas, False

    def _due(self, out: RequestOutput) -> bool:
        """Whether `out` goes to its client now: its first token at once, its end, else every
        `stream_interval` tokens."""
        sent = self._sent.get(out.request_id, (0, 0))[0]
        return out.finished or sent == 0 or len(out.token_ids) - sent >= self.stream_interval

    def _delta(self, out: RequestOutput) -> StreamDelta:
        """What `out` adds to what its request has been sent so far."""
        n_tokens, n_chars = self._sent.get(out.request_id, (0, 0))
        text = out.text or ""
        delta = StreamDelta(out.token_ids[n_tokens:], text[n_chars:], out.finish_reason, out.error)
        if out.finished:
            self._sent.pop(out.request_id, None)
        else:
            self._sent[out.request_id] = (len(out.token_ids), len(text))
        return delta

    def _publish(self, added: int) -> None:
        """A new snapshot, which now counts the `added` requests this iteration handed to the engine
        (as waiting or running): they stop counting as pending in the same instant."""
        sched = self.engine.scheduler
        snapshot = EngineSnapshot(len(sched.running), len(sched.waiting) + len(sched.swapped),
                                  self.engine.allocator.num_used, self.engine.num_blocks, self.snapshot.steps + 1)
        with self._cond:
            self.snapshot = snapshot
            self._pending_adds -= added

    def _die(self, exc: BaseException) -> None:
        self.dead = exc
        error = EngineDeadError(f"the engine loop died: {type(exc).__name__}: {exc}")
        if self.mode == "task":
            self._fail_all(error)
        elif self._event_loop is not None and not self._event_loop.is_closed():
            self._event_loop.call_soon_threadsafe(self._fail_all, error)

    def _fail_all(self, error: BaseException) -> None:
        """On the event loop: every waiting request ends with `error`."""
        self._dispatch([(rid, error) for rid in list(self._collectors)])


class RequestStream:
    """One queued request's deltas, as an async iterator (what `AsyncEngine.add_request` returns).
    `close()` ends it: a request that has not finished is aborted through the engine loop. It ends
    by itself with the request's last delta, or with the error the loop sent instead."""

    def __init__(self, engine: AsyncEngine, request_id: str, collector: RequestOutputCollector):
        self.engine, self.request_id, self.collector = engine, request_id, collector
        self.finished = False

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> StreamDelta:
        if self.finished:
            raise StopAsyncIteration
        try:
            delta = await self.collector.get()
        except Exception:  # the loop failed the request (or died): nothing left to abort
            self._end()
            raise
        if delta.finished:
            self._end()
        return delta

    def close(self) -> None:
        """Stop reading: abort the request if it has not finished (safe to call more than once)."""
        if not self.finished:
            self._end()
            self.engine._submit(_Abort(self.request_id))

    def _end(self) -> None:
        self.finished = True
        self.engine._collectors.pop(self.request_id, None)
