"""The package's layers: no import cycle among convexport's modules (function-level imports
included), and the pure layers import nothing heavy."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "convexport"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The convexport modules `name` imports anywhere in its code: `from X import a` counts as
    X.a where that is a module (Python imports the submodule), else as X."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {module for module in found if module in known and module != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_in_the_package():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert "convexport.folds" in graph["convexport.pipeline"]  # the walk sees imports
    assert cycles(graph) == []


def test_the_walk_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_algebra_imports_no_runtime():
    code = ("import sys, convexport.algebra; "
            "print(sorted({'torch', 'onnxruntime', 'onnxscript', 'convexport.pipeline'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr


def test_every_file_the_code_cites_is_in_the_repository():
    """docs/..., bench/..., tests/... as the code's and the rule files' comments name them."""
    import re

    root = PACKAGE.parent
    cited = re.compile(r"\b((?:docs|bench|tests|rules|sample_models|convexport)/[\w./-]*\w\.(?:py|md|yaml|json))")
    missing = []
    for path in [*PACKAGE.rglob("*.py"), *(root / "rules").glob("*.yaml")]:
        for name in cited.findall(path.read_text(encoding="utf-8")):
            if not (root / name).exists():
                missing.append(f"{path.relative_to(root)}: {name}")
    assert not missing, missing
