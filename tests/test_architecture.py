"""The layout is the architecture: dependencies point one way (flows -> tasks -> ntp.run -> ntp.engine, storage),
the engine runs without the driver's libraries, one module talks over the network, and no module sprawls."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ntp", "storage", "tasks", "flows")
#: package (or module prefix) -> top-level names or project modules it must never import, even lazily
FORBIDDEN = {
    "ntp": {"prefect", "tasks", "flows"},
    "ntp.engine": {"mlflow", "prefect", "subprocess", "argparse", "matplotlib", "pandas", "ntp.run"},
    "ntp.config": {"ntp.engine", "ntp.run"},
    "ntp.config_checks": {"ntp.engine", "ntp.run"},
    "ntp.options": {"ntp.engine", "ntp.run"},
    "ntp.model_specs": {"ntp.engine", "ntp.run"},
    "ntp.spec": {"ntp.engine", "ntp.run"},
    "ntp.records": {"ntp.engine", "ntp.run"},
    "ntp.errors": {"ntp.engine", "ntp.run"},
    "storage": {"prefect", "tasks", "flows", "ntp", "mlflow"},
    "tasks": {"flows"},
}
#: torch.distributed calls that move data or synchronise ranks (ntp/engine/distributed/collectives.py is their only home)
COMMUNICATION = {
    "all_to_all",
    "all_to_all_single",
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "gather",
    "scatter",
    "send",
    "recv",
    "isend",
    "irecv",
    "barrier",
    "monitored_barrier",
    "batch_isend_irecv",
    "gather_object",
    "scatter_object_list",
}
#: Lines of a module as ruff formats it (one argument a line where a call does not fit in 120 columns).
MAX_LINES = 500
#: The engine's packages, lowest first: a package imports only from those before it (and itself).
ENGINE_LAYERS = ("kernels", "device", "distributed", "graph", "memory", "parallel", "nn", "tasks", "train", "infer")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    """Every module name ``path`` imports, at module level or inside functions (a lazy import is a dependency
    too); ``from pkg import name`` counts as ``pkg.name`` when that is a module of the project."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            submodules = {f"{node.module}.{a.name}" for a in node.names} & set(MODULES)
            names.update(submodules)
            if len(submodules) < len(node.names):  # some names come from the module itself
                names.add(node.module)
    return names


def _matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize("owner", sorted(FORBIDDEN))
def test_imports_point_one_way(owner: str) -> None:
    offenders = {}
    for module, path in MODULES.items():
        if not _matches(module, owner):
            continue
        bad = {n for n in _imports(path) for f in FORBIDDEN[owner] if _matches(n, f)}
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert not offenders, f"{owner} must not import {sorted(FORBIDDEN[owner])}: {offenders}"


def _project_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (a package's import of its own submodules included)."""
    graph = {}
    for module, path in MODULES.items():
        deps = set()
        for name in _imports(path):
            while name and name not in MODULES:  # `from a.b import func`: the module a.b
                name = name.rpartition(".")[0]
            if name and not _matches(module, name):  # a module's own packages are imported before it anyway
                deps.add(name)
        graph[module] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a path that starts and ends at the same module, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_import_graph_has_no_cycles() -> None:
    cycle = find_cycle(_project_graph())
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def _engine_package(module: str) -> str | None:
    """``ntp.engine.graph.aggregate`` -> ``graph``; None outside the engine's packages."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["ntp", "engine"] and len(parts) > 2 else None


def test_the_engine_is_packages_in_layers() -> None:
    """The engine's modules all live in its packages (no flat module beside them), and each package imports only
    from the packages below it."""
    flat = [m for m in MODULES if _engine_package(m) and _engine_package(m) not in ENGINE_LAYERS]
    assert not flat, f"engine modules outside its packages {ENGINE_LAYERS}: {flat}"
    upward = {}
    for module, deps in _project_graph().items():
        own = _engine_package(module)
        if own is None:
            continue
        above = sorted(
            d for d in deps if (p := _engine_package(d)) and ENGINE_LAYERS.index(p) > ENGINE_LAYERS.index(own)
        )
        if above:
            upward[module] = above
    assert not upward, f"engine packages import only from lower layers {ENGINE_LAYERS}: {upward}"


def test_no_task_imports_another() -> None:
    """A task package (ntp.engine.tasks.X) may use the tasks' shared modules, never another task's."""
    task_of = {
        m: m.split(".")[3]
        for m in MODULES
        if m.startswith("ntp.engine.tasks.") and (ROOT / "ntp/engine/tasks" / m.split(".")[3]).is_dir()
    }
    crossing = {
        m: sorted(d for d in deps if task_of.get(d, task_of[m]) != task_of[m])
        for m, deps in _project_graph().items()
        if m in task_of
    }
    crossing = {m: d for m, d in crossing.items() if d}
    assert set(task_of.values()) >= {"link", "hetero"}, "the scan must see the task packages"
    assert not crossing, f"task packages import one another: {crossing}"


def _communication_calls(path: Path) -> list[str]:
    """``dist.X`` / ``torch.distributed.X`` communication functions that ``path`` calls or passes on."""
    tree = ast.parse(path.read_text())
    aliases = {
        a.asname or a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.Import)
        for a in n.names
        if a.name == "torch.distributed"
    } | {"torch.distributed"}
    found = []
    for node in ast.walk(tree):  # a call, or the function passed on (collectives.py stages some through host copies)
        if isinstance(node, ast.Attribute) and node.attr in COMMUNICATION:
            owner = ast.unparse(node.value)
            if owner in aliases:
                found.append(f"{owner}.{node.attr} (line {node.lineno})")
    return found


def test_only_collectives_communicates() -> None:
    offenders = {
        str(p.relative_to(ROOT)): calls
        for m, p in MODULES.items()
        if m != "ntp.engine.distributed.collectives" and (calls := _communication_calls(p))
    }
    assert not offenders, f"torch.distributed communication outside ntp/engine/distributed/collectives.py: {offenders}"
    assert _communication_calls(ROOT / "ntp/engine/distributed/collectives.py"), (
        "the scan must see collectives.py's calls"
    )


def test_no_module_sprawls() -> None:
    long = {str(p.relative_to(ROOT)): n for p in MODULES.values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by job): {long}"


def test_a_worker_trains_without_the_drivers_libraries() -> None:
    """What a rank imports (the torchrun entry point, the engine, the store reader) pulls in no MLflow, Prefect,
    pandas or matplotlib: a GPU worker image needs only the core dependencies."""
    code = (
        "import sys, ntp.run.worker, ntp.engine.train.loop, ntp.engine.infer.inference, storage;"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'mlflow', 'prefect', 'pandas', 'matplotlib'});"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)
