"""Colab's published package list (the snapshot in .ci/colab-runtime/) and what CI does with it.

Google publishes what Colab's runtimes preinstall in the `googlecolab/backend-info` repository
(`pip-freeze.gpu.txt`: `python3 -m pip freeze` of the GPU runtime; `os-info-gpu.txt`: the OS and
Python). .ci/colab-runtime/ holds a dated copy; everything here reads that copy, never memory:

    python3 .ci/colab_runtime.py constraints OUT [--require NAME...]
                                                      a pip constraints file: every package of the
                                                      snapshot at its version (local labels such as
                                                      +cu128 dropped; URL installs and torch's CUDA
                                                      libraries left out); fails if a required name
                                                      is not in the snapshot
    python3 .ci/colab_runtime.py python               Colab's Python version, "3.13"
    python3 .ci/colab_runtime.py verify BEFORE AFTER  two `pip freeze` outputs of the Colab-like
                                                      venv, before and after the package's install:
                                                      fails if the install moved a package of the
                                                      snapshot (a reader on Colab would reinstall it)
    python3 .ci/colab_runtime.py refresh FREEZE [--os-info FILE] --commit SHA --date YYYY-MM-DD
                                                      take a new pip-freeze.gpu.txt (and os-info)
                                                      and record where and when it comes from

Standard library only: CI runs it with the machine's python3, before any venv exists.
"""
from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = ROOT / ".ci" / "colab-runtime"
FREEZE = SNAPSHOT / "pip-freeze.gpu.txt"
OS_INFO = SNAPSHOT / "os-info-gpu.txt"
README = SNAPSHOT / "README.md"
SOURCE_LINE = re.compile(r"(?m)^- commit: `[0-9a-f]{40}`, dated \d{4}-\d{2}-\d{2}$")
BOOK_README_LINE = re.compile(r"Colab's published list of \d{4}-\d{2}-\d{2}")

_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)\s*$")
_URL_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^]]*\])? @ ")
# torch's CUDA libraries: Colab's torch is PyTorch's cu128 build, the registry's torch of the same
# version the cu130 one, each with its own set of these; on CI's CPU they are never loaded
CUDA_RUNTIME = re.compile(r"^(nvidia-|cuda-)")


def normalize(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def public_version(version: str) -> str:
    """`2.11.0+cu128` -> `2.11.0`: the registry has the public version (its CUDA flavour differs)."""
    return version.split("+", 1)[0]


def read_freeze(path: Path | None = None, urls: bool = False) -> dict[str, str]:
    """{normalized name: version} of every `name==version` line (comments skipped; URL installs,
    `name @ URL`, too unless `urls`, then with the URL as their version)."""
    pins = {}
    for line in Path(path or FREEZE).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        m = _REQ.match(line)
        if m:
            pins[normalize(m.group(1))] = m.group(2)
        elif urls and (m := _URL_REQ.match(line)):
            pins[normalize(m.group(1))] = line.split(" @ ", 1)[1]
    return pins


def colab_python(path: Path | None = None) -> str:
    """Colab's Python as major.minor, from os-info-gpu.txt's `Python 3.13.15` line."""
    path = path or OS_INFO
    m = re.search(r"(?m)^Python (\d+)\.(\d+)\.\d+", Path(path).read_text(encoding="utf-8"))
    if not m:
        raise SystemExit(f"{path}: no 'Python X.Y.Z' line")
    return f"{m.group(1)}.{m.group(2)}"


def write_constraints(out: Path, require: list[str] = ()) -> int:
    pins = read_freeze()
    missing = [name for name in require if normalize(name) not in pins]
    if missing:
        raise SystemExit(f"not in Colab's published list ({FREEZE.relative_to(ROOT)}): {', '.join(missing)}; "
                         "Colab does not preinstall them, so a notebook must get them from the package or an extra")
    lines = [f"{name}=={public_version(v)}" for name, v in sorted(pins.items()) if not CUDA_RUNTIME.match(name)]
    Path(out).write_text("# generated from .ci/colab-runtime/pip-freeze.gpu.txt\n" + "\n".join(lines) + "\n")
    return len(lines)


def moved(before: dict[str, str], after: dict[str, str], snapshot: dict[str, str]) -> list[str]:
    """Packages of the snapshot that the venv held before and that changed or vanished after."""
    out = []
    for name, version in sorted(before.items()):
        if name in snapshot and after.get(name) != version:
            out.append(f"{name} {version} -> {after.get(name, 'removed')}")
    return out


def verify(before_path: Path, after_path: Path) -> int:
    snapshot = read_freeze()
    before, after = read_freeze(before_path, urls=True), read_freeze(after_path, urls=True)
    # the venv itself must hold Colab's versions (public part) of what it was built with
    off = [f"{n} {v} (Colab: {snapshot[n]})" for n, v in sorted(before.items())
           if n in snapshot and not CUDA_RUNTIME.match(n) and public_version(v) != public_version(snapshot[n])]
    changed = moved(before, after, snapshot)
    added = sorted(set(after) - set(before))
    for problem in off:
        print(f"not Colab's version: {problem}")
    for problem in changed:
        print(f"the package's install moved {problem}")
    cuda = sum(1 for n in before if CUDA_RUNTIME.match(n))
    print(f"colab pins: {len(before) - cuda} packages at Colab's versions (and {cuda} CUDA libraries of torch's registry build) before the package's install; "
          f"it moved {len(changed)}; it added {', '.join(added) or 'nothing'}")
    return 1 if off or changed else 0


def refresh(freeze: Path, os_info: Path | None, commit: str, date: str) -> int:
    if not re.fullmatch(r"[0-9a-f]{40}", commit) or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
        raise SystemExit("--commit takes the 40-hex commit of googlecolab/backend-info, --date YYYY-MM-DD")
    if not read_freeze(freeze):
        raise SystemExit(f"{freeze}: no name==version lines; is it a pip freeze?")
    shutil.copyfile(freeze, FREEZE)
    if os_info:
        shutil.copyfile(os_info, OS_INFO)
    text = README.read_text(encoding="utf-8")
    if not SOURCE_LINE.search(text):
        raise SystemExit(f"{README}: its '- commit: `...`, dated ...' line is missing")
    README.write_text(SOURCE_LINE.sub(f"- commit: `{commit}`, dated {date}", text), encoding="utf-8")
    book_readme = ROOT / "README.md"
    btext = book_readme.read_text(encoding="utf-8")
    book_readme.write_text(BOOK_README_LINE.sub(f"Colab's published list of {date}", btext), encoding="utf-8")
    print(f"snapshot refreshed: {len(read_freeze())} packages, Python {colab_python()}, commit {commit[:12]} "
          f"of {date}; now run pytest tests/test_colab_runtime.py and bash .ci/colab")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("constraints")
    c.add_argument("out", type=Path)
    c.add_argument("--require", nargs="*", default=[], help="names that must be in the snapshot")
    sub.add_parser("python")
    v = sub.add_parser("verify")
    v.add_argument("before", type=Path)
    v.add_argument("after", type=Path)
    r = sub.add_parser("refresh")
    r.add_argument("freeze", type=Path)
    r.add_argument("--os-info", type=Path)
    r.add_argument("--commit", required=True)
    r.add_argument("--date", required=True)
    args = ap.parse_args(argv)
    if args.cmd == "constraints":
        print(f"{write_constraints(args.out, args.require)} pins written to {args.out}")
        return 0
    if args.cmd == "python":
        print(colab_python())
        return 0
    if args.cmd == "verify":
        return verify(args.before, args.after)
    return refresh(args.freeze, args.os_info, args.commit, args.date)


if __name__ == "__main__":
    sys.exit(main())
