"""Run review answers through the learner notebooks' own grader calls and save each report."""
import contextlib
import io
import pathlib
import sys
import time

OUT = pathlib.Path(__file__).with_name("out")


def passed(result):
    for attr in ("passed", "ok", "success"):
        if hasattr(result, attr):
            return bool(getattr(result, attr))
    return bool(result)


def run(chapter, answers, check):
    """answers: [(name, what_is_wrong_or_None, answer)]; check: the notebook's grader function."""
    OUT.mkdir(exist_ok=True)
    only = sys.argv[1:]
    rows = []
    for name, wrong, answer in answers:
        if only and name not in only:
            continue
        buf = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(buf):
            try:
                result = check(answer)
                ok = passed(result)
                text = str(result)
            except BaseException as exc:  # a grader must not crash on a learner's answer
                ok, text = None, f"GRADER RAISED {type(exc).__name__}: {exc}"
        report = buf.getvalue() + "\n" + text
        (OUT / f"{chapter}_{name}.txt").write_text(
            f"# {chapter} {name}: {'CORRECT' if wrong is None else 'WRONG: ' + wrong}\n"
            f"# accepted={ok}  ({time.perf_counter() - t0:.1f}s)\n\n{report}\n")
        rows.append((name, wrong, ok))
        print(f"{chapter:<6} {name:<10} accepted={ok!s:<5} {'correct' if wrong is None else 'wrong: ' + wrong}")
    return rows
