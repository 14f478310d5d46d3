"""User primitives named in a rule file as file.py:function or module:function."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import convexport
from convexport.errors import ConvexportError
from convexport.rewrite.engine import RewriteSettings, rewrite_model
from convexport.folds import builtin_primitives
from convexport.rewrite.rulefile import parse_rule_file
from helpers import make_model, op_counts, run, tensor

PLUGIN = '''
from convexport.folds.primitives import Rewrite


def drop_double_negation(match, context):
    """Neg(Neg(x)) is x."""
    return Rewrite([], [(match.root.outputs[0], match.values["x"])], "double negation dropped")


def explode(match, context):
    raise RuntimeError("plugin bug")


def wrong_type(match, context):
    return 42


def returns_none(match, context):
    return None


def returns_refusal(match, context):
    from convexport.primitive import Refusal

    return Refusal("no")


def identity_by_builder(match, context):
    from convexport.primitive import NodeBuilder

    out = match.root.outputs[0]
    build = NodeBuilder(context, out.dtype, out.name)
    result = build.node("Identity", [match.values["x"]], shape=out.shape)
    return Rewrite(build.nodes, [(out, result)], "double negation as an Identity")


def refuses(match, context):
    from convexport.primitive import Refusal

    raise Refusal("the user's reason")
'''

RULE = """rules:
  - name: no-double-negation
    doc: Neg(Neg(x)) is x.
    match:
      - h = Neg(x)
      - y = Neg(h)
    require: {{private: [h]}}
    apply: {apply}
"""


def double_negation_model():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["h"]),
             helper.make_node("Neg", ["h"], ["y"])]
    return make_model(nodes, [tensor("x", [3])], [tensor("y", [3])])


def rule_file(tmp_path, apply):
    (tmp_path / "my_primitives.py").write_text(PLUGIN)
    path = tmp_path / "rules.yaml"
    path.write_text(RULE.format(apply=apply))
    return path


def test_file_plugin_applies(tmp_path):
    rules = parse_rule_file(rule_file(tmp_path, "my_primitives.py:drop_double_negation"), set(builtin_primitives()))
    model = double_negation_model()
    outcome = rewrite_model(model, rules, builtin_primitives(), RewriteSettings("all"))
    assert op_counts(outcome.model) == {"Relu": 1}
    feeds = {"x": np.array([-1, 0, 2], np.float32)}
    np.testing.assert_array_equal(run(outcome.model, feeds)[0], run(model, feeds)[0])


def test_module_plugin_applies(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    rules = parse_rule_file(rule_file(tmp_path, "my_primitives:drop_double_negation"), set(builtin_primitives()))
    assert rules[0].plugin is not None


@pytest.mark.parametrize("apply, fragment", [
    ("my_primitives.py:nothing_here", "has no function 'nothing_here'"),
    ("missing.py:f", "no such file"),
    ("no_such_module_anywhere:f", "cannot import"),
])
def test_bad_plugin_names_are_rule_file_errors(tmp_path, apply, fragment):
    path = rule_file(tmp_path, apply)
    with pytest.raises(ConvexportError) as caught:
        parse_rule_file(path, set(builtin_primitives()))
    assert str(caught.value).startswith(f"{path}:8:") and fragment in str(caught.value)


@pytest.mark.parametrize("function, fragment", [
    ("explode", "raised RuntimeError: plugin bug"),
    ("wrong_type", "returned a int, not a Rewrite (a primitive says no by raising Refusal)"),
    ("returns_none", "returned None, not a Rewrite"),
    ("returns_refusal", "returned a Refusal, not a Rewrite"),
])
def test_errors_inside_a_plugin_name_the_rule(tmp_path, function, fragment):
    path = rule_file(tmp_path, f"my_primitives.py:{function}")
    with pytest.raises(ConvexportError) as caught:
        convexport.optimize(double_negation_model(), rules=[path], write=False, profile=False)
    message = str(caught.value)
    assert "no-double-negation" in message and fragment in message and str(path) in message


def test_a_builtin_primitive_on_a_pattern_it_cannot_read_names_the_rule(tmp_path):
    path = tmp_path / "misfit.yaml"
    path.write_text("rules:\n  - name: misfit\n    doc: d\n    match:\n      - h = Conv(x, w:const)\n"
                    "      - y = Sub(k:const, h)\n    apply: sum_branches\n")
    rules = parse_rule_file(path, set(builtin_primitives()))
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"]), helper.make_node("Sub", ["k", "h"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, 2, 3, 3])], [tensor("y", [1, 2, 3, 3])],
                       {"w": np.ones((2, 2, 1, 1), np.float32), "k": np.ones((2, 1, 1), np.float32)})
    with pytest.raises(ConvexportError, match=r"misfit.yaml:2: rule 'misfit': primitive sum_branches raised "
                                              r"IndexError.*does the pattern bind the names sum_branches reads"):
        rewrite_model(model, rules, builtin_primitives(), RewriteSettings("all"))


def test_a_plugin_says_no_by_raising_refusal(tmp_path):
    path = rule_file(tmp_path, "my_primitives.py:refuses")
    result = convexport.optimize(double_negation_model(), rules=[path], write=False, profile=False,
                                 builtin_rules=False)
    assert [entry["reason"] for entry in result.report["skipped"]] == ["the user's reason"]


def test_a_plugin_builds_with_the_builtin_builder(tmp_path):
    path = rule_file(tmp_path, "my_primitives.py:identity_by_builder")
    model = double_negation_model()
    outcome = rewrite_model(model, parse_rule_file(path, set(builtin_primitives())), builtin_primitives(), RewriteSettings("all"))
    assert op_counts(outcome.model) == {"Relu": 1, "Identity": 1}
    feeds = {"x": np.array([-1, 0, 2], np.float32)}
    np.testing.assert_array_equal(run(outcome.model, feeds)[0], run(model, feeds)[0])


@pytest.mark.parametrize("command", [
    ["rules", "check", "{rules}"],
    ["rules", "list", "--rules", "{rules}"],
    ["optimize", "{model}", "--rules", "{rules}", "-o", "{out}", "--no-profile"],
])
def test_a_rule_file_that_runs_python_code_says_so_first(tmp_path, command):
    """Issue 49, item 3: the command line's first line on stderr names the rule file, the code
    it runs and which key of which rule named it; the command itself goes on (exit 0)."""
    import subprocess
    import sys

    import onnx

    rules = rule_file(tmp_path, "my_primitives.py:drop_double_negation")
    onnx.save(double_negation_model(), tmp_path / "m.onnx")
    paths = {"rules": rules, "model": tmp_path / "m.onnx", "out": tmp_path / "out.onnx"}
    argv = [part.format(**paths) for part in command]
    done = subprocess.run([sys.executable, "-m", "convexport", *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines and lines[0] == (
        f"convexport: note: {rules}: runs the Python code of my_primitives.py (apply: of rule 'no-double-negation'); "
        "give only rule files you trust"
    )
    assert len(lines) == 1, done.stderr


def test_loading_a_plugin_is_announced_to_the_python_api(tmp_path):
    from convexport.rewrite.plugins import RuleFileRunsCode

    with pytest.warns(RuleFileRunsCode, match="runs the Python code of my_primitives.py"):
        parse_rule_file(rule_file(tmp_path, "my_primitives.py:drop_double_negation"), set(builtin_primitives()))
