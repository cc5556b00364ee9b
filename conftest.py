"""Root conftest: a run that covers chapters/ must execute every chapter (nbval --nbval-lax)."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
CHAPTERS = ROOT / "chapters"


def _covers_chapters(config) -> bool:
    args = [a for a in config.invocation_params.args if not a.startswith("-")]
    if not args:  # plain `pytest`: testpaths (tests/ only; `pytest chapters` executes the chapters)
        return False
    return any(Path(a.split("::")[0]).resolve() in (CHAPTERS, ROOT) for a in args)


def pytest_collection_modifyitems(session, config, items):
    if not _covers_chapters(config):
        return
    collected = {Path(str(item.fspath)).resolve() for item in items if str(item.fspath).endswith(".ipynb")}
    missing = sorted(p.name for p in CHAPTERS.glob("*.ipynb") if p.resolve() not in collected)
    if missing:
        raise pytest.UsageError(f"nbval did not collect these chapters (is nbval installed?): {missing}")
