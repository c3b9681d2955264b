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
LAYERS = ("core", "profiling", "schedules", "sim", "search", "report", "interop", "plan", "studies", "cli")


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
    # __main__.py is the `python -m zbsearch` entry point, not a step of the flow.
    flat = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
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


# Inside a layer, its subpackages flow one way too, lowest first; a module at the layer's root (search's
# problem and budget) is below all of them.
SUBLAYERS = {
    "search": ("greedy", "bounds", "exact", "solve", "partition", "recompute", "entry"),
    "interop": ("formats", "run"),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, tree: ast.AST | None = None) -> list[tuple[ast.ImportFrom | ast.Import, list[str]]]:
    """Every import of the package's own modules in a module (parsed as `tree` when given), each with
    the module names it reaches (`from .a import b` reaches a.b when b is a module, else a)."""
    here = _module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out = []
    for node in ast.walk(tree if tree is not None else ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = base + (node.module.split(".") if node.module else [])
            if not target or target[0] != "zbsearch":
                continue
            name = ".".join(target)
            reached = [f"{name}.{a.name}" if (ROOT / Path(*target) / f"{a.name}.py").exists()
                       or (ROOT / Path(*target) / a.name / "__init__.py").exists() else name for a in node.names]
            out.append((node, reached))
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("zbsearch")]
            if names:
                out.append((node, names))
    return out


def _package_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(SUBLAYERS))
def test_subpackages_import_only_down_their_layer(layer: str) -> None:
    order = SUBLAYERS[layer]
    upward = {}
    for path in (PACKAGE / layer).rglob("*.py"):
        parts = path.relative_to(PACKAGE / layer).parts
        mine = order.index(parts[0]) if len(parts) > 1 else -1
        for _, reached in _imports(path):
            for name in reached:
                bits = name.split(".")
                if len(bits) > 2 and bits[1] == layer and bits[2] in order and order.index(bits[2]) > mine:
                    upward.setdefault(str(path.relative_to(PACKAGE)), []).append(name)
    assert upward == {}


def test_no_import_circles() -> None:
    graph = {_module_name(path): set() for path in _package_modules()}
    for path in _package_modules():
        for _, reached in _imports(path):
            graph[_module_name(path)].update(n for n in reached if n in graph and n != _module_name(path))
    # A package's __init__ importing its own modules is how a package is built, not a circle.
    for name in graph:
        graph[name] = {n for n in graph[name] if not name.startswith(n + ".")}
    seen: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(graph[node]):
            if seen.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in seen:
                visit(nxt, stack + [nxt])
        seen[node] = 2

    for node in sorted(graph):
        if node not in seen:
            visit(node, [node])
    assert cycles == []


def test_no_private_names_across_modules() -> None:
    found = [f"{path.relative_to(PACKAGE)}:{node.lineno} {alias.name}" for path in _package_modules()
             for node, _ in _imports(path) if isinstance(node, ast.ImportFrom)
             for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert found == []


def test_lazy_imports_of_own_modules_say_what_they_defer() -> None:
    """An import inside a function hides a dependency from the reader; it is there only to put off an
    optional or slow one (torch, OR-Tools, matplotlib), and the comment above it says which."""
    bare = []
    for path in _package_modules():
        lines = path.read_text().split("\n")
        tree = ast.parse("\n".join(lines))
        own = {id(node) for node, _ in _imports(path, tree)}
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if id(node) in own and "# defers" not in lines[node.lineno - 2] \
                        and "# defers" not in lines[node.lineno - 3]:
                    bare.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert bare == []
