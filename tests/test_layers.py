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
    assert "convexport.folds" in graph["convexport.stages.rewrite"]  # the walk sees imports
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


# The floors docs/architecture.md states, lowest first: a package (or a top-level module) imports
# only from its own floor and those below it. A module is placed by its package, its name's
# second part (convexport.folds.conv_chain is convexport.folds); one that no floor names fails
# the test until it is placed.
FLOORS = {
    "base": {"convexport", "convexport.errors", "convexport.options", "convexport.flops", "convexport.util",
             "convexport.algebra"},
    "report": {"convexport.report"},
    "graph": {"convexport.ir"},
    "model": {"convexport.runtime", "convexport.load", "convexport.profile"},
    "folds": {"convexport.folds"},
    "rewrite": {"convexport.rewrite", "convexport.primitive"},
    "checks": {"convexport.validate", "convexport.half", "convexport.ruletest"},
    "stages": {"convexport.stages"},
    "front": {"convexport.pipeline", "convexport.cli", "convexport.console", "convexport.__main__"},
}  # fmt: skip


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def floor_of(module: str) -> int:
    for level, members in enumerate(FLOORS.values()):
        if package_of(module) in members:
            return level
    raise AssertionError(f"{module}: on no floor of tests/test_layers.py (and docs/architecture.md)")


def upward_imports(known: dict[str, Path]) -> list[str]:
    return [
        f"{name} ({list(FLOORS)[floor_of(name)]}) imports {other} ({list(FLOORS)[floor_of(other)]})"
        for name, path in known.items()
        for other in imports(name, path, known)
        if floor_of(other) > floor_of(name)
    ]


def package_graph(known: dict[str, Path]) -> dict[str, set[str]]:
    """Which package imports which (a top-level module is a package of its own)."""
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        edges = graph.setdefault(package_of(name), set())
        edges.update(package_of(other) for other in imports(name, path, known) if package_of(other) != package_of(name))
    return graph


def test_no_module_imports_from_a_floor_above_it():
    assert upward_imports(modules()) == []


def test_no_import_cycle_between_packages():
    """Packages on one floor import each other one way only (validate and half: half's runs in
    half precision take validate's; validate never takes half's)."""
    assert cycles(package_graph(modules())) == []


def test_the_floor_check_finds_an_import_upward(tmp_path):
    assert floor_of("convexport.folds.conv_chain") > floor_of("convexport.ir.graph")
    assert floor_of("convexport.pipeline") > floor_of("convexport.stages.validate")
    planted = tmp_path / "convexport" / "folds" / "planted.py"  # a fold that reaches up into the rewrite engine
    planted.parent.mkdir(parents=True)
    planted.write_text("from ..rewrite.engine import rewrite_model\n", encoding="utf-8")
    known = {**modules(), "convexport.folds.planted": planted}
    assert upward_imports(known) == [
        "convexport.folds.planted (folds) imports convexport.rewrite.engine (rewrite)"
    ]


def test_the_package_check_finds_a_cycle_on_one_floor(tmp_path):
    planted = tmp_path / "convexport" / "validate" / "planted.py"  # validate taking half's choice: half takes validate's runs
    planted.parent.mkdir(parents=True)
    planted.write_text("from ..half.choose import chosen\n", encoding="utf-8")
    known = {**modules(), "convexport.validate.planted": planted}
    assert cycles(package_graph(known)) == [["convexport.half", "convexport.validate"]]


def test_folds_import_only_the_algebra_the_graph_and_flops():
    known = modules()
    allowed = ("convexport.folds", "convexport.algebra", "convexport.ir", "convexport.flops")
    reached = {
        other
        for name, path in known.items()
        if name.startswith("convexport.folds")
        for other in imports(name, path, known)
        if not other.startswith(allowed)
    }
    assert reached == set()


def flop_arithmetic(path: Path) -> list[str]:
    """Where a function about FLOPs (its name says so) multiplies by a number of its own: a
    count made outside flops.py."""
    found = []
    for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(function, ast.FunctionDef) and "flop" in function.name.lower():
            for node in ast.walk(function):
                if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult | ast.Pow):
                    if any(isinstance(side, ast.Constant) and isinstance(side.value, int | float)
                           for side in (node.left, node.right)):  # fmt: skip
                        found.append(f"{path.name}:{node.lineno} in {function.name}")
    return found


def test_flops_are_counted_only_in_flops_py():
    counted_elsewhere = [
        place for path in PACKAGE.rglob("*.py") if path.name != "flops.py" for place in flop_arithmetic(path)
    ]
    assert counted_elsewhere == []


def test_the_flop_check_finds_a_count_of_its_own(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def _branch_flops(shape):\n    return 2.0 * shape[0] * shape[1]\n", encoding="utf-8")
    assert flop_arithmetic(planted) == ["planted.py:2 in _branch_flops"]


def test_only_ir_touches_graphsurgeon():
    users = [
        name
        for name, path in modules().items()
        if not name.startswith("convexport.ir")
        and any(
            alias.name.startswith("onnx_graphsurgeon")
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
        )
    ]
    assert users == []


def test_a_stage_calls_no_other_stage():
    """stages/* import each other's types (a Request, a Rewritten) but no stage runs another:
    the orchestrator (pipeline.py) calls each once, in order."""
    known = modules()
    entry_points = {"load": "exported", "rewrite": "rewritten", "validate": "checked", "half": "in_half",
                    "profile": "profiled", "report": "written"}  # fmt: skip
    for name, path in known.items():
        if not name.startswith("convexport.stages."):
            continue
        text = path.read_text(encoding="utf-8")
        for stage, entry in entry_points.items():
            if name != f"convexport.stages.{stage}":
                assert f"{stage}.{entry}(" not in text and f"import {entry}" not in text, f"{name} runs {stage}"


def test_the_orchestrator_and_its_stages_are_read_a_function_at_a_time():
    """pipeline.py and stages/*: no function over 60 lines (issue 53: `_optimized` was 210)."""
    package = PACKAGE
    long = [
        f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in [package / "pipeline.py", *sorted((package / "stages").glob("*.py"))]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 60
    ]
    assert long == []


def test_every_relative_import_names_a_module_of_the_package():
    """A function-level `from .x import y` left behind when code moves names a module that is
    not there, and fails only when that function runs (load/routes/onnx_file.py's `from .ir`)."""
    known = modules()
    broken = []
    for name, path in known.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level and node.module:
                target = ".".join(package[: len(package) - node.level + 1] + [node.module])
                if target not in known:
                    broken.append(f"{name}:{node.lineno}: {target}")
    assert broken == []


def test_every_builtin_primitive_is_registered_where_it_is_defined():
    """A primitive of folds/ is registered by @builtin on its definition, under its own name (the
    registry was a list of 27 names in folds/__init__.py, imported and listed again)."""
    from convexport.folds import builtin_primitives

    registered = builtin_primitives()
    decorated = {
        node.name
        for path in (PACKAGE / "folds").glob("*.py")
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, ast.FunctionDef) and any(ast.unparse(d) == "builtin" for d in node.decorator_list)
    }
    assert set(registered) == decorated and len(decorated) >= 27
    assert all(primitive.__name__ == name for name, primitive in registered.items())



def _report_writes(source: str) -> list[str]:
    """Where `source` takes a report (a parameter named report, or typed OptimizeReport) or
    assigns to a key of one."""
    writes = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            writes += [f"{node.name} takes {arg.arg}" for arg in arguments
                       if arg.arg == "report" or (arg.annotation and "OptimizeReport" in ast.unparse(arg.annotation))]
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
        writes += [f"line {node.lineno}: {ast.unparse(target)} =" for target in targets
                   if isinstance(target, ast.Subscript) and ast.unparse(target.value).split("[")[0] == "report"]
    return writes


def test_no_stage_writes_into_the_report():
    """Each stage hands its sections back; the orchestrator (pipeline.py) alone places them: no
    stage takes the report or assigns to a key of it (the report stage builds the first one)."""
    writes = {path.name: _report_writes(path.read_text(encoding="utf-8"))
              for path in sorted((PACKAGE / "stages").glob("*.py"))}
    assert {name: found for name, found in writes.items() if found} == {}
    planted = "def checked(graph, report: OptimizeReport):\n    report['validation']['culprit'] = None\n"
    assert _report_writes(planted) == ["checked takes report", "line 2: report['validation']['culprit'] ="]
