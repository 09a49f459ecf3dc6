"""The package's shape: imports point one way between its layers, no cycle, no module over 350 lines.

Every module under src/tokenswift_cli is parsed (not imported), and every import in it counts, those
inside functions and under TYPE_CHECKING included: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = "tokenswift_cli"
ROOT = Path(__file__).resolve().parents[1] / "src" / PACKAGE
MAX_LINES = 350

BOTTOM = {"model", "backends", "sampling", "config", "paths", "data", "parsing"}
BESIDE_CLI = {"bench", "train", "quality"}
# Each layer and what it must never import.
NEVER = {
    **dict.fromkeys(BOTTOM, {"engine", "runs", "cli", *BESIDE_CLI}),
    "engine": {"runs", "cli", *BESIDE_CLI},
    "runs": {"cli", *BESIDE_CLI},
    **dict.fromkeys(BESIDE_CLI, {"cli"}),
}
CLI_USERS = {"cli", "__main__"}


def _modules() -> dict[str, Path]:
    """Dotted module name -> file; a package is named by its folder (`tokenswift_cli.cli`)."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The package's modules that one import statement of `module` loads."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names if alias.name in MODULES)
        return
    if node.level:  # relative: from the module's package, `level - 1` packages up
        package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    for alias in node.names:
        if f"{base}.{alias.name}" in MODULES:
            yield f"{base}.{alias.name}"
        elif base in MODULES:
            yield base


def _graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports. The root package's lazy `__init__` is left out."""
    edges: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes = (node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom))
        edges[module] = {name for node in nodes for name in _imported(module, node)} - {module, PACKAGE}
    return edges


GRAPH = _graph()


def _layer(module: str) -> str:
    """The top-level subpackage (or module) below the package: `engine`, `config`, `__main__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_sees_every_kind_of_import() -> None:
    assert "tokenswift_cli.cli.app" in GRAPH["tokenswift_cli.__main__"]
    assert "tokenswift_cli.runs.runner" in GRAPH["tokenswift_cli.cli.write"]  # inside the command's function
    assert "tokenswift_cli.cli.write" in GRAPH["tokenswift_cli.cli.app"]  # `from tokenswift_cli.cli import write`
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle() -> None:
    assert _cycles(GRAPH) == []


def test_no_module_over_350_lines() -> None:
    sizes = {module: len(path.read_text(encoding="utf-8").splitlines()) for module, path in MODULES.items()}
    assert {module: n for module, n in sizes.items() if n > MAX_LINES} == {}


@pytest.mark.parametrize("layer", sorted(NEVER))
def test_layers_point_one_way(layer: str) -> None:
    """cli -> runs -> engine -> model / backends, with sampling, config, paths, data, parsing at the bottom;
    bench, train and quality beside the cli (they may use everything below it)."""
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if _layer(module) == layer
        for target in targets
        if _layer(target) in NEVER[layer]
    )
    assert wrong == []


def test_only_the_entry_point_imports_the_cli() -> None:
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if _layer(module) not in CLI_USERS
        for target in targets
        if _layer(target) == "cli"
    )
    assert wrong == []
    users = {module for module, targets in GRAPH.items() if "tokenswift_cli.cli.app" in targets}
    assert users == {"tokenswift_cli.__main__"}


def test_llama_cpp_stays_inside_bench() -> None:
    """llama.cpp is an optional extra of the benchmark: the core package never reaches it."""
    users = {module for module, targets in GRAPH.items() if "tokenswift_cli.bench.llamacpp" in targets}
    assert users and all(_layer(module) == "bench" for module in users)
