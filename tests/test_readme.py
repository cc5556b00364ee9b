"""The README's commands are the ones CI runs: CI reads them from the README's marked code blocks
(`.ci/readme_commands.py`), so this test fails when the README changes shape and CI would no longer
find them, or would find something it cannot run as written."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("readme_commands", ROOT / ".ci" / "readme_commands.py")
rc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rc)

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_has_every_command_ci_runs():
    found = rc.parse(README)
    assert rc.system_packages(found) and "chromium" in rc.system_packages(found)
    assert found["setup"][0] == "python3 -m venv .venv && source .venv/bin/activate"
    assert found["setup"][-1] == "pip install -r requirements.txt"
    assert found["test"] == ["pytest"]
    assert found["build"] == ["jupyter-book build . --warningiserror --keep-going"]
    assert any(re.fullmatch(r"pip install torch==[\d.]+ --index-url https://download\.pytorch\.org/whl/cpu", line)
               for line in found["optional"]), "the CPU-only torch install is a copyable, optional block"


def test_the_readme_pins_the_torch_that_requirements_pins():
    pinned = re.search(r"^torch==([\d.]+)$", (ROOT / "requirements.txt").read_text(), re.M).group(1)
    optional = " ".join(rc.parse(README)["optional"])
    assert f"torch=={pinned} " in optional


def test_ci_runs_the_readme_blocks_and_nothing_of_its_own_instead():
    ci = (ROOT / ".ci" / "run").read_text()
    assert ".ci/readme_commands.py --shell" in ci
    for array in ("README_SYSTEM_PACKAGES", "README_SETUP", "README_TEST", "README_BUILD"):
        assert f"${{{array}" in ci, f".ci/run no longer runs {array}"
    # CI spells out neither the install nor the tests nor the build itself
    for own in ("pip install -q --no-compile -r requirements.txt", "env MPLBACKEND=Agg pytest",
                "jupyter-book build . --warningiserror"):
        assert own not in ci, f".ci/run runs its own `{own}` instead of the README's"


def test_the_shell_form_round_trips():
    found = rc.parse(README)
    script = rc.as_shell(found) + '\nprintf "%s\\n" "${README_SETUP[@]}" "${README_TEST[@]}" "${README_BUILD[@]}"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == found["setup"] + found["test"] + found["build"]


def _with(old: str, new: str) -> str:
    assert old in README
    return README.replace(old, new, 1)


@pytest.mark.parametrize("text, names", [
    (lambda: _with("<!-- ci: test -->", "<!-- test -->"), "ci: test"),
    (lambda: _with("<!-- ci: build -->", "<!-- ci: bulid -->"), "unknown role"),
    (lambda: _with("python3 -m venv .venv && source .venv/bin/activate", "python3 -m venv env"), "create the venv"),
    (lambda: _with("python3 -m venv .venv && source .venv/bin/activate", "python3 -m venv .venv"), "activate"),
    (lambda: _with("pip install -r requirements.txt\n```", "pip install -e .\n```"), "requirements.txt"),
    (lambda: _with("```bash\npytest\n```", "```bash\npytest -q tests\n```"), "the one line `pytest`"),
    (lambda: _with(" --warningiserror --keep-going\n```", "\n```"), "strict"),
    (lambda: _with("sudo apt-get install python3-venv chromium", "sudo apt install chromium"), "apt-get install"),
    (lambda: README + "\n<!-- ci: test -->\n```bash\npytest\n```\n", "two README blocks"),
])
def test_a_readme_that_changed_shape_fails_naming_what(text, names):
    with pytest.raises(rc.ReadmeShapeError, match=re.escape(names)):
        rc.parse(text())


def test_the_command_line_fails_loudly_on_a_bad_readme(tmp_path, monkeypatch):
    bad = tmp_path / "README.md"
    bad.write_text(README.replace("<!-- ci: setup -->", ""))
    monkeypatch.setattr(rc, "README", bad)
    assert rc.main(["readme_commands.py", "--shell"]) == 2
    assert subprocess.run([sys.executable, str(ROOT / ".ci" / "readme_commands.py"), "--shell"],
                          capture_output=True, text=True).returncode == 0
