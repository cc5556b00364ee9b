"""The package's declared ranges admit what Colab preinstalls, read from the committed snapshot of
Colab's published package list (.ci/colab-runtime/), and the tool CI builds its Colab-like venv with
reads that snapshot as it says.

A range that Colab's version does not meet (say `plotly>=6` while Colab has 5.24.1) makes every
reader's setup cell reinstall that package, and often restart the runtime."""
from __future__ import annotations

import importlib.util
import json
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("colab_runtime", ROOT / ".ci" / "colab_runtime.py")
colab_runtime = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(colab_runtime)

SNAPSHOT = colab_runtime.read_freeze()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
# Colab's machine, for the requirements' markers
ENV = {"python_version": colab_runtime.colab_python(), "python_full_version": colab_runtime.colab_python() + ".0",
       "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
       "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def _chapter_extras() -> set[str]:
    from inflight.book.notebook import chapter_extras

    return {e for p in (ROOT / "chapters").glob("*.ipynb")
            for e in chapter_extras(json.loads(p.read_text(encoding="utf-8")))}


def _requirements() -> list[tuple[str, Requirement]]:
    reqs = [("dependencies", Requirement(r)) for r in PYPROJECT["dependencies"]]
    for extra, items in PYPROJECT.get("optional-dependencies", {}).items():
        reqs += [(f"[{extra}]", Requirement(r)) for r in items]
    return [(where, r) for where, r in reqs if r.marker is None or r.marker.evaluate(ENV)]


def test_snapshot_is_colabs_published_list_with_its_source():
    assert len(SNAPSHOT) > 300, "pip-freeze.gpu.txt holds a few hundred packages"
    readme = (ROOT / ".ci" / "colab-runtime" / "README.md").read_text(encoding="utf-8")
    assert colab_runtime.SOURCE_LINE.search(readme), "the snapshot's README names its commit and date"
    assert "googlecolab/backend-info" in readme
    date = re.search(r"dated (\d{4}-\d{2}-\d{2})", readme).group(1)
    assert f"Colab's published list of {date}" in (ROOT / "README.md").read_text(encoding="utf-8"), \
        "the README's Colab line carries the snapshot's date"


@pytest.mark.parametrize("where,req", _requirements(), ids=lambda x: str(x) if isinstance(x, str) else x.name)
def test_every_declared_range_admits_colabs_version(where, req):
    """Each dependency and each extra's package that Colab preinstalls: its range admits Colab's
    version (a package Colab lacks is a new install, not a reinstall)."""
    name = colab_runtime.normalize(req.name)
    if name not in SNAPSHOT:
        pytest.skip(f"{req.name} is not preinstalled on Colab")
    version = colab_runtime.public_version(SNAPSHOT[name])
    assert req.specifier.contains(version, prereleases=True), \
        f"{where}: {req} refuses Colab's {req.name}=={version}: every reader would reinstall it"


# What a chapter's setup cell adds on Colab on purpose, with why: nothing else may be missing there
# (.ci/colab's install check then proves that adding it moved none of Colab's own packages).
ADDED_ON_COLAB = {"vllm-router": "chapter 11's router, the vLLM project's (a Rust binary): Colab has no router"}


def test_what_the_notebooks_install_is_preinstalled_on_colab():
    """The runtime dependencies and the extras a chapter's setup cell installs are all on Colab
    already, but for what ADDED_ON_COLAB names: the setup cell then adds only the package itself
    (and those)."""
    wanted = set(PYPROJECT["dependencies"])
    for extra in _chapter_extras():
        wanted |= set(PYPROJECT["optional-dependencies"][extra])
    missing = sorted(r.name for r in map(Requirement, wanted)
                     if (r.marker is None or r.marker.evaluate(ENV)) and colab_runtime.normalize(r.name) not in SNAPSHOT
                     and colab_runtime.normalize(r.name) not in ADDED_ON_COLAB)
    assert not missing, f"not preinstalled on Colab: {missing}"


def test_the_colab_lane_installs_what_the_book_touches():
    """.ci/colab's sets cover what tests/test_notebooks.py calls Colab's preinstalled set (by import
    name), and chapter 9's extra."""
    from test_notebooks import COLAB_SET, IMPORT_NAMES

    script = (ROOT / ".ci" / "colab").read_text(encoding="utf-8")
    names = {n for m in re.finditer(r"(?ms)^(?:COLAB|SERVE)_SET=\((.*?)\)", script) for n in m.group(1).split()}
    imports = {IMPORT_NAMES.get(n, {"ipython": "IPython", "pillow": "PIL"}.get(n, n)) for n in names}
    assert COLAB_SET <= imports, sorted(COLAB_SET - imports)
    serve = {colab_runtime.normalize(Requirement(r).name) for r in PYPROJECT["optional-dependencies"]["serve"]}
    assert serve <= {colab_runtime.normalize(n) for n in names}, sorted(serve - {colab_runtime.normalize(n) for n in names})


def test_constraints_pin_public_versions_without_torchs_cuda_libraries(tmp_path):
    out = tmp_path / "c.txt"
    colab_runtime.write_constraints(out, ["torch", "ipywidgets"])
    pins = colab_runtime.read_freeze(out)
    assert pins["torch"] == colab_runtime.public_version(SNAPSHOT["torch"]) and "+" not in pins["torch"]
    assert pins["ipywidgets"] == SNAPSHOT["ipywidgets"]
    assert not [n for n in pins if n.startswith(("nvidia-", "cuda-"))]
    with pytest.raises(SystemExit, match="not in Colab's published list"):
        colab_runtime.write_constraints(out, ["no-such-package-on-colab"])


def test_verify_refuses_a_moved_package(tmp_path, capsys):
    name = "ipywidgets"
    before, after = tmp_path / "before.txt", tmp_path / "after.txt"
    before.write_text(f"{name}=={SNAPSHOT[name]}\nnumpy=={SNAPSHOT['numpy']}\n")
    after.write_text(f"{name}==99.0\nnumpy=={SNAPSHOT['numpy']}\ninflight @ git+file:///x@abc\n")
    assert colab_runtime.verify(before, after) == 1
    assert f"moved ipywidgets {SNAPSHOT[name]} -> 99.0" in capsys.readouterr().out
    after.write_text(before.read_text() + "inflight @ git+file:///x@abc\n")
    assert colab_runtime.verify(before, after) == 0
    assert "added inflight" in capsys.readouterr().out
    before.write_text(f"{name}==7.0.0\n")  # a venv not at Colab's versions
    assert colab_runtime.verify(before, before) == 1


def test_refresh_takes_a_new_list_and_records_its_source(tmp_path, monkeypatch):
    folder = tmp_path / ".ci" / "colab-runtime"
    folder.mkdir(parents=True)
    for f in ("pip-freeze.gpu.txt", "os-info-gpu.txt", "README.md"):
        (folder / f).write_text((ROOT / ".ci" / "colab-runtime" / f).read_text(encoding="utf-8"))
    (tmp_path / "README.md").write_text("runs Colab's published list of 2000-01-01, by ...\n")
    for attr, path in (("ROOT", tmp_path), ("FREEZE", folder / "pip-freeze.gpu.txt"),
                       ("OS_INFO", folder / "os-info-gpu.txt"), ("README", folder / "README.md")):
        monkeypatch.setattr(colab_runtime, attr, path)
    new = tmp_path / "new-freeze.txt"
    new.write_text("# a comment\nipywidgets==8.1.5\ntorch==2.12.0+cu128\n")
    assert colab_runtime.refresh(new, None, "a" * 40, "2027-01-02") == 0
    assert colab_runtime.read_freeze() == {"ipywidgets": "8.1.5", "torch": "2.12.0+cu128"}
    assert f"- commit: `{'a' * 40}`, dated 2027-01-02" in (folder / "README.md").read_text()
    assert "Colab's published list of 2027-01-02" in (tmp_path / "README.md").read_text()
    bad = tmp_path / "bad.txt"
    bad.write_text("not a freeze\n")
    with pytest.raises(SystemExit):
        colab_runtime.refresh(bad, None, "a" * 40, "2027-01-02")
