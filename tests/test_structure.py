"""The package's structure: no import circle anywhere in ``condreg/`` (type-only and function-
level imports counted), and no module reads another module's private name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "condreg"


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The condreg modules ``name`` imports (a package's own submodules it names count as the
    submodule, not the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("condreg")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            if not base.startswith("condreg"):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.add(sub if sub in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _is_package_init_edge(a: str, b: str) -> bool:
    """``condreg.x`` importing its own package ``condreg`` (or a package its submodule): Python
    resolves those while the package initialises, not a circle between modules."""
    return a.startswith(b + ".") or b.startswith(a + ".")


def test_no_import_circle():
    graph = {
        name: {m for m in _imports(name, path) if not _is_package_init_edge(name, m)}
        for name, path in MODULES.items()
    }
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_check_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_private_name_read_across_modules(name):
    """``module._name`` attribute reads of another condreg module's private names (a module
    itself, ``_core``, may be private; a name inside it may not)."""
    tree = ast.parse(MODULES[name].read_text())
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("condreg"):
            for a in node.names:
                if f"{node.module}.{a.name}" in MODULES:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    bad = [
        f"{node.value.id}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in aliases
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and f"{aliases[node.value.id]}.{node.attr}" not in MODULES
    ]
    assert not bad, f"{name} reads {bad}"
