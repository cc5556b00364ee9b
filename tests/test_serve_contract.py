"""The server against its own OpenAPI document, checked by a contract tester nobody here wrote
(schemathesis): `python -m inflight.serve` on a free loopback port, every operation of
`/openapi.json` called with generated requests (the coverage phase: each field's boundary and
wrong-typed values; the fuzzing phase: random bodies), and every answer checked — no 5xx, only
documented status codes and content types, bodies (also each Server-Sent Event of a stream) as the
document describes them, every request the document calls invalid refused with a 4xx, a 405 with
its Allow header. A fixed seed and example budget keep it short and the same run every time;
the context is kept small (--max-model-len) so that generated requests generate little."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("schemathesis")

from serve_helpers import ROOT, ServerProcess  # noqa: E402

CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance", "response_schema_conformance",
          "response_headers_conformance", "negative_data_rejection", "unsupported_method")


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--max-model-len", "48", "--num-blocks", "16", "--max-num-seqs", "8")
    yield srv
    srv.stop()


def test_the_server_keeps_the_contract_of_its_openapi_document(server, tmp_path):
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or shutil.which("st")
    assert st, "schemathesis is installed but its command `st` is not on the PATH"
    run = subprocess.run([st, "run", f"{server.base}/openapi.json", "--checks", ",".join(CHECKS),
                          "--phases", "coverage,fuzzing", "--max-examples", "15", "--seed", "1",
                          "--generation-database", "none", "--request-timeout", "120", "--no-color"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600, env=dict(os.environ, NO_COLOR="1"))
    report = run.stdout[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, report
    assert "6 selected" in run.stdout and " passed" in run.stdout, report
    assert server.proc.poll() is None  # (and the server is still up)
    server.stop()
    assert "Traceback" not in "".join(server.output), "".join(server.output)[-4000:]
