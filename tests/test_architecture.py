"""Layering checks over the source tree: the shared layering rules, no import cycles, and
no concrete store outside kvgate.store.

The import graph is read statically (ast), including imports inside functions and
``TYPE_CHECKING`` blocks: a lazy import that only hides a cycle still counts.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
CONCRETE_STORES = (
    "kvgate.store.memory",
    "kvgate.store.redis_store",
    "kvgate.store.etcd_store",
    "kvgate.store.composite",
)


def _arch_check() -> Path | None:
    # the shared tools sit beside the repository (/work/main → /work/shared); a worktree
    # one level deeper (/work/wt/<name>) finds them one level further up
    for up in (ROOT / "..", ROOT / ".." / ".."):
        candidate = (up / "shared" / "tools" / "arch_check.py").resolve()
        if candidate.is_file():
            return candidate
    return None


def test_shared_layering_rules_hold() -> None:
    tool = _arch_check()
    if tool is None:
        pytest.skip("shared/tools/arch_check.py is not beside this checkout")
    done = subprocess.run(
        [sys.executable, str(tool), str(ROOT)], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "ok", done.stdout + done.stderr


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "kvgate").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[int, str]]:
    """(line, kvgate module) for every import in the file, resolved to a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {  # imports under ``if TYPE_CHECKING:`` never run
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING")
        for stmt in block.body
        for n in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            # ``from pkg import sub`` imports the submodule when there is one
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        for target in targets:
            while target and target not in known:  # an attribute: its module
                target = target.rpartition(".")[0]
            if target:
                yield node.lineno, target


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {
        name: {t for _, t in _imports(name, path, known) if t != name}
        for name, path in known.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _is_package_edge(a: str, b: str) -> bool:
    # a package __init__ re-exporting its submodules, and a submodule importing a sibling
    # through the package, are one unit: Python initialises the package first
    return a.startswith(b + ".") or b.startswith(a + ".")


def test_the_import_graph_has_no_cycles() -> None:
    graph = _graph()
    pruned = {a: {b for b in bs if not _is_package_edge(a, b)} for a, bs in graph.items()}
    assert _cycles(pruned) == []


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_only_kvgate_store_imports_a_concrete_store() -> None:
    known = _modules()
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {name} imports {target}"
        for name, path in known.items()
        if not (name == "kvgate.store" or name.startswith("kvgate.store."))
        for line, target in _imports(name, path, known)
        if target in CONCRETE_STORES
    ]
    assert bad == []
