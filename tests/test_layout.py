"""The code layout stays as docs/architecture.md draws it: layered modules without import cycles.

``lint-imports`` checks the contracts of pyproject.toml ``[tool.importlinter]`` (compiler layers, targets
independent of each other, runtimes and frontends apart from code generation); grimp (import-linter's graph)
finds cycles between modules, which the layers cannot see inside one layer.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    path = Path(sys.executable).with_name(name)
    found = str(path) if path.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed (pip install -e '.[test]')")
    return found


def test_import_contracts():
    r = subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_no_import_cycles():
    import grimp

    graph = grimp.build_graph("kiln", exclude_type_checking_imports=True, cache_dir=None)
    modules = sorted(graph.modules)
    # strongly connected components of the module graph (Tarjan), ignoring a package's own __init__ edges
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def edges(m: str) -> set[str]:
        return {d for d in graph.find_modules_directly_imported_by(m) if not m.startswith(d + ".")}

    def visit(v: str) -> None:
        work = [(v, iter(sorted(edges(v))))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges(w)))))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))

    for m in modules:
        if m not in index:
            visit(m)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_modules_stay_small():
    """One responsibility a module: none grows past 800 lines (the developers' guide)."""
    big = {str(p.relative_to(ROOT)): n for p in (ROOT / "kiln").rglob("*.py")
           if (n := len(p.read_text().splitlines())) > 800}
    assert not big, f"modules over 800 lines: {big}"


def test_ruff_clean():
    r = subprocess.run([_tool("ruff"), "check", "kiln", "tests", "bench", "tools", "examples"], cwd=ROOT, check=False,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:]
