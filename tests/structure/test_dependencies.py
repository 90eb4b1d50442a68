"""Dependencies point one way: the kernels import nothing from titan_delta, and no module of titan_delta
imports itself back through others (imports inside functions and under TYPE_CHECKING count too)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _modules(folder: str, package: str) -> dict[str, Path]:
    base = ROOT / folder
    found = {}
    for path in base.rglob("*.py"):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([package, *parts])] = path
    return found


def _imports(path: Path, module: str, is_package: bool) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _graph(folder: str, package: str) -> dict[str, set[str]]:
    modules = _modules(folder, package)
    graph = {}
    for name, path in modules.items():
        targets = _imports(path, name, path.name == "__init__.py")
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the list of modules around it, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_kernels_import_nothing_from_titan_delta():
    offenders = sorted(
        f"{name} imports {target}"
        for name, path in _modules("kernels", "titan_delta_kernels").items()
        for target in _imports(path, name, path.name == "__init__.py")
        if target == "titan_delta" or target.startswith("titan_delta.")
    )
    assert not offenders, offenders


def test_no_import_cycle_in_titan_delta():
    graph = _graph("titan_delta", "titan_delta")
    # edges from a package to its own submodules (re-exports) and back are one idea, not a circle
    pruned = {a: {b for b in targets if not b.startswith(a + ".")} for a, targets in graph.items()}
    cycle = _cycle(pruned)
    assert cycle is None, " -> ".join(cycle)


def _test_imports(path: Path) -> list[str]:
    """Imports of a test file that reach another test module, a conftest or a tool."""
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    bad = []
    for target in _imports(path, module, False):
        leaf = target.rsplit(".", 1)[-1]
        in_tests = target.startswith("tests.")
        if (in_tests and (leaf.startswith("test_") or leaf == "conftest")) or target.split(".")[0] == "tools":
            bad.append(target)
    return bad


def test_tests_import_helpers_only():
    """Shared test code lives in helper modules: no test imports another test module, a conftest or a tool."""
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if (found := _test_imports(path))
    }
    assert not offenders, offenders


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
