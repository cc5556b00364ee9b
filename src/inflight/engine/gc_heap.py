"""The startup heap, frozen: Python's oldest-generation collections stop walking it mid-run.

CPython's cyclic garbage collector runs now and then as objects are created. Most passes look at the
young generations only, but once enough objects have survived into the oldest one, a pass walks
*every* object the collector tracks. A process that has imported torch and transformers and built a
model tracks some 170 000 of them, and that walk stops the engine for 50-100 ms on this project's
CPU. The engine loop creates small objects every step (its batch lists, outputs, stats), so such a
pass comes every so many steps: a stall that every running request's next token waits behind.
With the tiny model, one fell inside the timed run of two of the prefill-heavy cells of
`python -m inflight.bench.protocol.matrix` (95 ms of a 1.2 s run, 53 ms of a 0.3 s one).

`gc.freeze()` moves everything alive into a permanent generation that no pass walks; objects made
afterwards are tracked and collected as before. Collecting first keeps it from freezing garbage that
already exists. What it costs: an object alive at the freeze that later becomes unreachable only
through a reference *cycle* stays in memory for good (one freed by reference counting is still freed,
as an engine is: it has no cycles through itself). That is why only a process the package owns
freezes, once what it serves with is built -- as vLLM does in its engine core's process and its API
server (`vllm/utils/gc_utils.py`, `freeze_gc_heap`):
- the server (`python -m inflight.serve`), just before it starts serving;
- a tensor-parallel worker, once its KV cache is allocated;
- the fair protocol's contender, before its timed run, whichever system it times.
Not `LLMEngine`'s constructor: a library call must not freeze its caller's heap. In a notebook, an
object of the reader's alive in a cycle at that moment -- an app, a session object holding an earlier
engine and its KV cache -- would never be collected (an independent review built both cases). A
program that serves from one engine it built can call `freeze_gc_heap()` itself.

`INFLIGHT_GC_FREEZE=0` leaves the heap as it is (to measure what the freeze is worth:
`python -m inflight.bench.protocol.contender` records the collector's passes inside its timed run).
"""
from __future__ import annotations

import atexit
import gc

from inflight import checks

__all__ = ["freeze_gc_heap", "OFF_VAR"]

OFF_VAR = "INFLIGHT_GC_FREEZE"

_unfreeze_at_exit = False


def freeze_gc_heap() -> None:
    """Collect every generation, then freeze what is left. Cheap after the first: collections skip
    what earlier freezes froze, and the freeze itself splices one list onto another. (How many are
    frozen, `gc.get_freeze_count()`, walks that list: 10 ms for the startup heap, so not here.)

    At exit the heap is unfrozen again: the interpreter's last collection skips frozen objects, and
    extension modules that count their objects at shutdown (triton's nanobind bindings) would report
    the cycles it left as leaks."""
    global _unfreeze_at_exit
    if checks.switched_off(OFF_VAR):
        return
    gc.collect()
    gc.freeze()
    if not _unfreeze_at_exit:
        atexit.register(gc.unfreeze)
        _unfreeze_at_exit = True
