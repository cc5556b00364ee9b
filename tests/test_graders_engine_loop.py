"""The engine-loop grader runs the learner's order and explains wrong ones from what it measured.
Mutants are written here, independently of the package's Mistakes."""
from inflight.exercises.engine_loop import WORKLOADS, check_engine_loop, measure_order, reference_step
from inflight.sim.engine_sim import SimEngine


def right(engine):
    engine.reap()
    engine.budget()
    engine.admit()
    engine.preempt()
    engine.decode()


def test_reference_and_a_correct_learner_pass():
    assert check_engine_loop(right, quiet=True)
    assert check_engine_loop(["reap", "budget", "admit", "preempt", "decode"], quiet=True)
    assert check_engine_loop(("Reap", "BUDGET", " admit", "preempt", "decode"), quiet=True)  # names are forgiving


def test_preempt_and_admit_commute_and_the_report_says_so():
    result = check_engine_loop(["reap", "budget", "preempt", "admit", "decode"], quiet=True)
    assert result and "commute" in result.report


def test_not_implemented_stub():
    def stub(engine):
        raise NotImplementedError("Your turn")
    assert check_engine_loop(stub, quiet=True).not_implemented


def mutant_budget_first(engine):
    engine.budget()
    engine.reap()
    engine.admit()
    engine.preempt()
    engine.decode()


def mutant_decode_first(engine):
    engine.decode()
    engine.reap()
    engine.budget()
    engine.admit()
    engine.preempt()


def mutant_admit_unbudgeted(engine):
    engine.reap()
    engine.admit()
    engine.budget()
    engine.preempt()
    engine.decode()


def mutant_preempt_first(engine):
    engine.preempt()
    engine.reap()
    engine.budget()
    engine.admit()
    engine.decode()


def mutant_decode_then_preempt(engine):
    engine.reap()
    engine.budget()
    engine.admit()
    engine.decode()
    engine.preempt()


def mutant_late_admission(engine):
    engine.reap()
    engine.budget()
    engine.preempt()
    engine.decode()
    engine.admit()


def mutant_reap_at_the_end(engine):
    engine.budget()
    engine.admit()
    engine.preempt()
    engine.decode()
    engine.reap()


MUTANTS = [
    (mutant_budget_first, "budget before reap", "idle"),
    (mutant_decode_first, "decode first", "already finished"),
    (mutant_admit_unbudgeted, "admit before budget", "previous step's budget"),
    (mutant_preempt_first, "preempt before reap", "preemptions"),
    (mutant_decode_then_preempt, "decode before preempt", "no KV slot"),
    (mutant_late_admission, "admit after decode", "TTFT"),
    (mutant_reap_at_the_end, "reap last", "wasted on finished requests"),
]


def test_each_mutant_is_recognised_with_a_measured_explanation():
    for mutant, name, words in MUTANTS:
        result = check_engine_loop(mutant, quiet=True)
        assert not result, name
        assert result.mistake == name, (name, result.mistake, result.report)
        assert result.report.count("💡") == 1 and "🤔" not in result.report
        assert words in result.explanation, (name, result.explanation)
        assert any(ch.isdigit() for ch in result.explanation), "explanations quote measured numbers"


def test_budget_before_reap_really_leaves_blocks_idle():
    ref, bad = measure_order(reference_step), measure_order(mutant_budget_first)
    assert bad["idle_block_steps"] > ref["idle_block_steps"]
    assert bad["mean_ttft_steps"] > ref["mean_ttft_steps"]


def test_missing_and_repeated_steps_are_named():
    def forgets_preempt(engine):
        engine.reap()
        engine.budget()
        engine.admit()
        engine.decode()
    result = check_engine_loop(forgets_preempt, quiet=True)
    assert not result and "never calls preempt" in result.report

    def reaps_twice(engine):
        engine.reap()
        engine.budget()
        engine.reap()
        engine.admit()
        engine.preempt()
        engine.decode()
    result = check_engine_loop(reaps_twice, quiet=True)
    assert "reap more than once" in result.report or result  # reaping twice is harmless; if it fails, it's named


def test_unknown_step_name_is_reported():
    result = check_engine_loop(["reap", "budget", "admit", "preempt", "fly"], quiet=True)
    assert not result and "fly" in result.report


def test_sim_engine_runs_every_workload_to_completion_with_the_right_order():
    for name, make in WORKLOADS.items():
        engine = SimEngine(**make())
        while not engine.done():
            engine.run_step(reference_step)
            engine.scheduler.check_invariants()
        assert all(s.num_output_tokens == s.params.max_tokens for s in engine.seqs), name
        engine.scheduler.reap()  # the last step's finishers are reaped by the next step
        assert engine.scheduler.allocator.num_free == engine.scheduler.allocator.num_blocks
