"""Layering checks over the source tree: the shared layering rules, no import cycles, and
no concrete store outside kvgate.store.

The import graph is read statically (ast) and counts every import, as the shared
``arch_check.py --cycles`` does: inside functions, under ``TYPE_CHECKING``, and a
submodule's import of its own package. A lazy or typing-only import that only hides a
cycle still counts.
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
    """(line, kvgate module) for every import in the file, resolved to a module.

    Every import counts, as in ``arch_check.py --cycles``: module level, function-local
    and under ``if TYPE_CHECKING:``; ``from pkg import name`` imports ``pkg`` itself
    (its ``__init__``) and the submodule ``pkg.name`` when there is one.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            targets = [base, *(f"{base}.{a.name}" for a in node.names)]
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


def test_the_import_graph_has_no_cycles() -> None:
    # every edge counts, a package's __init__ and its submodules' included: a submodule
    # that imports its own package back, while the package imports it, is a cycle
    assert _cycles(_graph()) == []


def test_the_shared_tool_finds_no_cycles_either() -> None:
    tool = _arch_check()
    if tool is None:
        pytest.skip("shared/tools/arch_check.py is not beside this checkout")
    done = subprocess.run(
        [sys.executable, str(tool), "--cycles", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "ok", done.stdout + done.stderr


def test_every_kind_of_import_is_an_edge(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pkg.a import A\n")
    (pkg / "b.py").write_text("")
    (pkg / "c.py").write_text("")
    source = pkg / "a.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from pkg import helper\n"  # an attribute of the package: the package itself
        "if TYPE_CHECKING:\n"
        "    from pkg.b import B\n"
        "def f() -> None:\n"
        "    from . import c\n"
    )
    known = {
        "pkg": pkg / "__init__.py",
        "pkg.a": source,
        "pkg.b": pkg / "b.py",
        "pkg.c": pkg / "c.py",
    }
    assert {t for _, t in _imports("pkg.a", source, known)} == {"pkg", "pkg.b", "pkg.c"}


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
