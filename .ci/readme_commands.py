#!/usr/bin/env python3
"""The README's own commands, as CI runs them: so that what a newcomer types and what CI proves are
the same lines, CI never spells them out itself, it reads them here.

Each code block of the README that CI runs sits right after an HTML comment naming its role
(invisible on GitHub and in any Markdown viewer):

    <!-- ci: system -->     the system packages (`sudo apt-get install ...`): CI installs the missing
                            ones its own way, as root, without sudo
    <!-- ci: setup -->      the virtual environment and the install: run verbatim, in CI's own shell
                            (so `source .venv/bin/activate` holds for everything after it)
    <!-- ci: test -->       the test command: run verbatim
    <!-- ci: build -->      the book build: run verbatim (the README's build is the strict one)
    <!-- ci: optional -->   shown to readers, never run by CI (the CPU-only torch install: CI's
                            machine has that wheel on disk; the download it names is not reachable)

    python3 .ci/readme_commands.py            print each role and its lines
    python3 .ci/readme_commands.py --shell    bash array definitions: README_SYSTEM_PACKAGES,
                                              README_SETUP, README_TEST, README_BUILD

`parse()` checks the shape CI relies on and fails, naming the problem, when the README changes so
that CI would no longer find its commands (tests/test_readme.py runs it on every `pytest`).
"""
from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
ROLES = ("system", "setup", "test", "build", "optional")
_BLOCK = re.compile(r"<!--\s*ci:\s*(\w+)\s*-->\s*\n```(?:bash|sh|console)?\s*\n(.*?)\n```", re.S)


class ReadmeShapeError(ValueError):
    """The README no longer has the commands CI runs, in the shape CI runs them."""


def _lines(block: str) -> list[str]:
    """The block's commands: one per line, comments and blank lines dropped."""
    out = []
    for line in block.splitlines():
        code = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
        if code:
            out.append(code)
    return out


def parse(text: str) -> dict[str, list[str]]:
    """{role: [command, ...]} for every marked block, after checking the shape CI needs."""
    found: dict[str, list[str]] = {}
    for role, body in _BLOCK.findall(text):
        if role not in ROLES:
            raise ReadmeShapeError(f"unknown role <!-- ci: {role} --> (known: {', '.join(ROLES)})")
        if role in found:
            raise ReadmeShapeError(f"two README blocks are marked <!-- ci: {role} -->; CI runs exactly one")
        found[role] = _lines(body)
    missing = [r for r in ROLES if r not in found]
    if missing:
        raise ReadmeShapeError(f"README has no code block marked <!-- ci: {missing[0]} --> right before it "
                               f"(missing: {', '.join(missing)})")
    _check_shape(found)
    return found


def _check_shape(found: dict[str, list[str]]) -> None:
    system = found["system"]
    if len(system) != 1 or not re.fullmatch(r"sudo apt-get install( [\w.+-]+)+", system[0]):
        raise ReadmeShapeError(f"the system block must be one `sudo apt-get install PKG...` line, got {system}")
    setup = " && ".join(found["setup"])
    for must, why in ((r"python3? -m venv \.venv\b", "create the venv at .venv"),
                      (r"(source|\.) \.venv/bin/activate\b", "activate .venv"),
                      (r"pip install -r requirements\.txt\b", "install requirements.txt")):
        if not re.search(must, setup):
            raise ReadmeShapeError(f"the setup block must {why}; it reads: {found['setup']}")
    if found["test"] != ["pytest"]:
        raise ReadmeShapeError(f"the test block must be the one line `pytest`, got {found['test']}")
    build = found["build"]
    if len(build) != 1 or not build[0].startswith("jupyter-book build "):
        raise ReadmeShapeError(f"the build block must be one `jupyter-book build ...` line, got {build}")
    for flag in ("--warningiserror", "--keep-going"):
        if flag not in build[0].split():
            raise ReadmeShapeError(f"the README's book build must be the strict one CI trusts ({flag} missing): "
                                   f"{build[0]}")


def system_packages(found: dict[str, list[str]]) -> list[str]:
    return found["system"][0].split()[3:]


def as_shell(found: dict[str, list[str]]) -> str:
    def array(name: str, items: list[str]) -> str:
        return f"{name}=(" + " ".join(shlex.quote(i) for i in items) + ")"
    return "\n".join([array("README_SYSTEM_PACKAGES", system_packages(found)), array("README_SETUP", found["setup"]),
                      array("README_TEST", found["test"]), array("README_BUILD", found["build"])])


def main(argv: list[str]) -> int:
    try:
        found = parse(README.read_text(encoding="utf-8"))
    except ReadmeShapeError as exc:
        print(f"{README.name}: {exc}", file=sys.stderr)
        return 2
    if argv[1:] == ["--shell"]:
        print(as_shell(found))
    else:
        for role in ROLES:
            print(f"{role}:")
            for line in found[role]:
                print(f"    {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
