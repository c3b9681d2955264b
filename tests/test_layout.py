"""The package's shape, as docs/architecture.md describes it: small modules, short functions, and a data
flow that only points one way (a lower layer never imports a higher one)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "zbsearch"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
# The flow, lowest first: a module may import from its own layer and the ones before it. `plan` holds
# the planner and the research comparisons, which read everything below them (solver, runtime, figures).
LAYERS = ("core", "profiling", "schedules", "sim", "search", "report", "interop", "plan", "cli")


def _sources() -> list[Path]:
    return sorted(list(PACKAGE.rglob("*.py")) + list((ROOT / "bench").glob("*.py")))


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_and_functions_are_small(path: Path) -> None:
    source = path.read_text()
    assert source.count("\n") <= MAX_MODULE_LINES, f"{path.name}: split it by responsibility"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == []


def test_no_flat_modules_beside_the_subpackages() -> None:
    flat = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert flat == []
    assert sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()) == sorted(LAYERS)


def _imported_layers(path: Path) -> set[str]:
    """Subpackages a module imports, module-level or inside functions, relative or absolute."""
    here = path.relative_to(PACKAGE).parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(here[:-1])[: len(here) - node.level]
                target = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.startswith("zbsearch."):
                target = node.module.split(".")[1:]
            else:
                continue
            names = target[:1] or [alias.name for alias in node.names]
            found.update(n for n in names if n in LAYERS)
    return found


@pytest.mark.parametrize("layer", LAYERS)
def test_imports_only_point_down_the_flow(layer: str) -> None:
    allowed = set(LAYERS[: LAYERS.index(layer) + 1])
    upward = {
        str(path.relative_to(PACKAGE)): sorted(_imported_layers(path) - allowed)
        for path in (PACKAGE / layer).rglob("*.py")
    }
    assert {k: v for k, v in upward.items() if v} == {}
