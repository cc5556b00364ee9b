"""The package's plan holds: layers import only downward, no import cycles, small files and
functions, and the scheduling chapters' code runs where torch is not installed."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "inflight"
MAX_FILE_LINES = 400      # "no file over ~400 lines"
MAX_FUNCTION_LINES = 62   # "no function over ~60 lines" (Triton kernels excepted)

# what each layer may not import (lower layers never import upper ones)
FORBIDDEN = {
    "model": ("inflight.engine", "inflight.sim", "inflight.bench", "inflight.book", "inflight.exercises"),
    "engine": ("inflight.sim", "inflight.bench", "inflight.book", "inflight.exercises", "inflight.serve"),
    "sim": ("inflight.bench", "inflight.book", "inflight.exercises", "inflight.serve"),
    # the server stands on the engine and the model only
    "serve": ("inflight.sim", "inflight.bench", "inflight.book", "inflight.exercises"),
}
FORBIDDEN["model"] += ("inflight.serve",)
# the load generator is a pure HTTP client (it must measure vLLM's server too): no engine, model or
# server code, and of the benchmark only its own client modules
# (the package `inflight.bench.serve` itself only exports the load generator's names, lazily)
PURE_CLIENT = ("inflight.bench.serve", "inflight.bench.serve.loadgen", "inflight.bench.serve.client",
               "inflight.bench.serve.stats")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file, except those under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for child in node.body for n in ast.walk(child))
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, node.lineno))
            out += [(f"{node.module}.{a.name}", node.lineno) for a in node.names]  # `from inflight.x import module`
    return out


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PKG.rglob("*.py")}


def test_no_relative_imports():
    # absolute imports name the layer, so a reader sees where each dependency lives
    bad = [f"{p.relative_to(ROOT)}:{n.lineno}" for p in PKG.rglob("*.py")
           for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))) if isinstance(n, ast.ImportFrom) and n.level]
    assert not bad, f"relative imports: {bad}"


def test_layers_import_only_downward():
    bad = []
    for name, path in _modules().items():
        layer = name.split(".")[1] if name.count(".") else ""
        for imported, line in _imports(path):
            if any(imported == f or imported.startswith(f + ".") for f in FORBIDDEN.get(layer, ())):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
    assert not bad, "layer rule broken:\n" + "\n".join(bad)


def test_the_load_generator_is_a_pure_http_client():
    mods = _modules()
    bad = []
    for name in PURE_CLIENT:
        for imported, line in _imports(mods[name]):
            # a name from one of them (not another module of the folder: `from ..serve import cost`)
            own = imported in PURE_CLIENT or imported.startswith("inflight._lazy") or \
                (imported.rsplit(".", 1)[0] in PURE_CLIENT and imported not in mods)
            if imported.startswith("inflight") and not own or \
                    imported.split(".")[0] in ("torch", "triton", "transformers", "fastapi", "uvicorn"):
                bad.append(f"{name}:{line} imports {imported}")
    assert not bad, "bench.serve must import no engine code:\n" + "\n".join(bad)


def test_the_load_generator_runs_without_torch(tmp_path):
    script = BLOCK_TORCH + textwrap.dedent("""
        from inflight.bench.serve import client, loadgen, stats
        assert loadgen.arrival_times(5, 2.0)[0] == 0.0
        assert "torch" not in sys.modules and "inflight.engine" not in sys.modules
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr


def test_root_modules_import_no_layer():
    # checks, stats, device, threads, blocks: the common ground every layer stands on
    layers = tuple(f"inflight.{d.name}" for d in PKG.iterdir() if d.is_dir() and (d / "__init__.py").exists())
    bad = [f"{p.relative_to(ROOT)}:{line} imports {imported}" for p in PKG.glob("*.py") if p.name != "__init__.py"
           for imported, line in _imports(p) if any(imported == f or imported.startswith(f + ".") for f in layers)]
    assert not bad, "a root module imports a layer:\n" + "\n".join(bad)


def test_sim_imports_no_torch_even_indirectly():
    mods = _modules()
    seen, stack = set(), [m for m in mods if m.startswith("inflight.sim")]
    while stack:
        m = stack.pop()
        if m in seen or m not in mods:
            continue
        seen.add(m)
        for imported, line in _imports(mods[m]):
            assert imported.split(".")[0] not in ("torch", "triton"), \
                f"{m} (reached from inflight.sim) imports {imported} at line {line}"
            if imported.startswith("inflight"):
                stack.append(imported)


def test_no_import_cycles():
    mods = _modules()
    graph = {m: sorted({i for i, _ in _imports(p) if i in mods and i != m and not m.startswith(i + ".")})
             for m, p in mods.items()}
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in graph[m]:
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [m])


def test_files_and_functions_are_small():
    big_files, big_functions = [], []
    for path in PKG.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(ROOT)
        if len(text.splitlines()) > MAX_FILE_LINES:
            big_files.append(f"{rel}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if any("jit" in ast.unparse(d) for d in node.decorator_list):
                    continue  # a Triton kernel is one GPU program: it stays whole
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    big_functions.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    assert not big_files and not big_functions, "\n".join(big_files + big_functions)


BLOCK_TORCH = textwrap.dedent("""
    import sys
    class _NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "triton"):
                raise ImportError(f"{name} is blocked: the scheduling chapters must run without torch")
    sys.meta_path.insert(0, _NoTorch())
""")


def test_part_one_runs_without_torch(tmp_path):
    """The Part I API (schedulers, workloads, simulator, KV simulator, plots) works with torch blocked."""
    script = BLOCK_TORCH + textwrap.dedent("""
        import matplotlib
        matplotlib.use("Agg")
        import inflight
        from inflight import ContinuousBatchScheduler, StaticBatchScheduler, PriorityScheduler, SkipAheadScheduler
        from inflight.sim import workloads, kv_sim
        from inflight.sim.simulate import simulate
        from inflight.book import plots, widgets
        w = workloads.long_tailed(40, seed=0)
        for cls in (StaticBatchScheduler, ContinuousBatchScheduler, SkipAheadScheduler, PriorityScheduler):
            assert simulate(cls(4), w).unfinished == []
        assert kv_sim.simulate_kv(workloads.short_chat(50), "paged").finished == 50
        print(inflight.describe_device())
        assert "torch" not in sys.modules
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("chapter", ["02_static_batching", "03_continuous_batching", "04_memory_aware_admission"])
def test_scheduling_chapters_run_without_torch(chapter, tmp_path):
    """Every code cell of chapters 2-4, run in order in one process with torch blocked."""
    nb = json.loads((ROOT / "chapters" / f"{chapter}.ipynb").read_text(encoding="utf-8"))
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    body = "\n".join(f"exec(compile({src!r}, 'cell {i}', 'exec'))" for i, src in enumerate(cells))
    script = BLOCK_TORCH + "import matplotlib\nmatplotlib.use('Agg')\n" + body + "\nassert 'torch' not in sys.modules\n"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
