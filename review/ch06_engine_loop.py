"""Chapter 6: the order of the five steps of one iteration."""
from _harness import run

from inflight.exercises.engine_loop import check_engine_loop


def correct(engine):
    engine.reap()
    engine.budget()
    engine.admit()
    engine.preempt()
    engine.decode()


def w1_admit_before_budget(engine):
    # admits before the budget of this step is computed
    engine.reap()
    engine.admit()
    engine.budget()
    engine.preempt()
    engine.decode()


def w2_no_preempt(engine):
    # "admission already respects the budget": preempt left out
    engine.reap()
    engine.budget()
    engine.admit()
    engine.decode()


def w3_preempt_first(engine):
    # serves the running requests first (vLLM-like), but before they have been planned by budget
    engine.reap()
    engine.preempt()
    engine.budget()
    engine.admit()
    engine.decode()


def correct_vllm(engine):
    # vLLM's arrangement: the running requests are served (preempt) before admission
    engine.reap()
    engine.budget()
    engine.preempt()
    engine.admit()
    engine.decode()


def probe_reap_last(engine):
    # chapter 3's habit: retire at the end of the step (the chapter's note discusses it)
    engine.budget()
    engine.admit()
    engine.preempt()
    engine.decode()
    engine.reap()


ANSWERS = [
    ("correct2", None, correct_vllm),
    ("probe", "reap at the end of the step (the chapter says it relies on the previous step)", probe_reap_last),
    ("correct", None, correct),
    ("w1", "reap -> admit -> budget -> preempt -> decode (admits on a stale budget)", w1_admit_before_budget),
    ("w2", "preempt never called (reap -> budget -> admit -> decode)", w2_no_preempt),
    ("w3", "reap -> preempt -> budget -> admit -> decode (preempts before planning)", w3_preempt_first),
]

if __name__ == "__main__":
    run("ch06lp", ANSWERS, check_engine_loop)
