"""The tree shows the data flow: packages import one way, never in a circle.

Every import counts here, lazy ones and ``TYPE_CHECKING`` ones included: a circle that
only shows at run time, or only to the type checker, is still a circle for the reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "nightshift"

# Earlier stages first; a package may import only packages to its left (and itself).
LAYERS = [
    {"errors", "faults", "console", "intervals", "memory"},
    {"io", "engines"},
    {"capacity"},
    {"jobs"},
    {"scheduling"},
    {"running"},
    {"evaluation"},  # scores committed results; reports set its figures beside cost
    {"reports"},
    {"pipelines"},
    {"tuning"},  # runs a job's own steps (pipelines.direct) once per candidate setting
    {"batch"},
    {"demo"},
    {"cli"},
    {"command"},  # the console script: Prefect's server launched first, then the CLI
]
PURE_PLANNING = ["prompts", "budget", "order", "reuse"]  # scheduling's core: no I/O, no engine


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every nightshift module (or package) ``path`` imports, at any depth of the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


MODULES = {_module_name(p): _imports(p) for p in SRC.rglob("*.py")}


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "nightshift" else None


def _rank(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def test_every_package_has_a_layer():
    packages = {_package(m) for m in MODULES} - {None}
    assert packages <= set().union(*LAYERS)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_only_earlier_stages(module):
    mine = _package(module)
    if mine is None:  # nightshift/__init__.py: the public names, from any stage
        return
    later = {
        name
        for name in MODULES[module]
        if _package(name) and _package(name) != mine and _rank(_package(name)) > _rank(mine)
    }
    assert not later, f"{module} imports later stages: {sorted(later)}"


def test_no_module_imports_another_in_a_circle():
    known = set(MODULES)
    graph = {m: {n for n in deps if n in known and n != m} for m, deps in MODULES.items()}
    for parent in known:  # importing a.b.c runs a/__init__ and a/b/__init__ too
        graph[parent] |= set()
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt]
                pytest.fail(f"import circle: {' -> '.join(cycle)}")
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


@pytest.mark.parametrize("name", PURE_PLANNING)
def test_the_planning_core_is_pure(name):
    imported = MODULES[f"nightshift.scheduling.{name}"]
    impure = {
        m
        for m in imported
        if _package(m) in {"io", "engines", "running", "pipelines"}
        or m.split(".")[0] in {"vllm", "prefect", "boto3", "transformers"}
    }
    assert not impure, f"scheduling.{name} imports {sorted(impure)}"


@pytest.mark.parametrize(("library", "home"), [("vllm", "engines"), ("prefect", "pipelines")])
def test_only_one_package_imports_each_framework(library, home):
    outside = sorted(
        m
        for m, deps in MODULES.items()
        if _package(m) != home and any(d.split(".")[0] == library for d in deps)
    )
    assert not outside, f"{library} imported outside {home}/: {outside}"


def test_no_function_in_batch_is_longer_than_40_lines():
    """A batch/ function reads in one screen: route handlers are one per endpoint, the
    routers only wire them, and long shapes are split into named parts."""
    too_long = []
    for path in sorted((SRC / "batch").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines >= 40:
                    too_long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} {lines}")
    assert not too_long, "functions of 40 lines or more: " + ", ".join(too_long)
