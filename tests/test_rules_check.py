"""`convexport rules check` reports every error in every file given, each as file:line:col."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from convexport.cli import app

BROKEN = """rules:
  - name: relu-two
    doc: d
    match:
      - y = Relu(h, k)
    apply: forward_input
  - name: nested
    doc: d
    match: [y = Identity(x)]
    where: {same: [[x, y]]}
    apply: forward_input
  - name: conv-conv
    doc: d
    match: [y = Identity(x)]
    apply: forward_input
  - name: fine
    doc: d
    match: [y = Identity(x)]
    apply: forward_input
  - name: fine
    doc: d
    match: [y = Identity(x)]
    apply: forward_input
"""

UNKNOWN_OP = "rules:\n  - name: unknown-op\n    doc: d\n    match: [y = Frobnicate(x)]\n    apply: forward_input\n"


def test_every_error_in_every_file(tmp_path):
    (tmp_path / "a.yaml").write_text(BROKEN)
    (tmp_path / "b.yaml").write_text(UNKNOWN_OP)
    result = CliRunner().invoke(app, ["rules", "check", str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")])
    assert result.exit_code == 1
    lines = result.stdout.strip().splitlines()
    assert [line.split(": ", 1)[0].rsplit("/", 1)[1] for line in lines] == [
        "a.yaml:5:9", "a.yaml:10:19", "a.yaml:12:1", "a.yaml:20:1", "b.yaml:4:13"]
    assert "Relu takes at most 1 input(s); the line names 2" in lines[0]
    assert "condition 'same' takes names" in lines[1]
    assert "has the name of the built-in rule at rules/20_linear_chain.yaml" in lines[2]
    assert "is already defined in" in lines[3] and "unknown ONNX op 'Frobnicate'" in lines[4]
    assert result.stderr.strip() == "convexport: 5 error(s) in the rule files given (1 rule(s) OK), listed on stdout"


def test_the_built_in_rules_check_clean():
    from convexport.rewrite.rulefile import builtin_rule_files

    result = CliRunner().invoke(app, ["rules", "check", *map(str, builtin_rule_files())])
    assert result.exit_code == 0 and result.stdout.strip() == "54 rule(s) OK"


def test_the_checkouts_rule_files_check_clean_against_an_installed_package(tmp_path, monkeypatch):
    """Installed, the built-in files are copies in site-packages: `rules check rules/*.yaml` in
    the checkout (docs/commands.md's example) is the same rules, not 54 clashes."""
    import shutil

    from convexport.rewrite import rulefile

    checkout = sorted(Path(__file__).resolve().parents[1].joinpath("rules").glob("*.yaml"))
    installed = tmp_path / "site-packages" / "convexport" / "builtin_rules"
    installed.mkdir(parents=True)
    for path in checkout:
        shutil.copy(path, installed / path.name)
    monkeypatch.setattr(rulefile, "builtin_rule_files", lambda: sorted(installed.glob("*.yaml")))
    result = CliRunner().invoke(app, ["rules", "check", *map(str, checkout)])
    assert result.exit_code == 0 and result.stdout.strip() == "54 rule(s) OK", result.output


def test_a_user_rule_with_a_built_in_name_is_one_clash_naming_both_places(tmp_path):
    from convexport.rewrite.rulefile import builtin_rule_files

    (tmp_path / "mine.yaml").write_text(
        "rules:\n  - name: drop-identity\n    doc: d\n    match: [y = Identity(x)]\n    apply: forward_input\n"
    )
    result = CliRunner().invoke(app, ["rules", "check", *map(str, builtin_rule_files()), str(tmp_path / "mine.yaml")])
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"convexport: {tmp_path / 'mine.yaml'}:2:1: rule 'drop-identity' has the name of the built-in rule at "
        "rules/10_cleanup.yaml:3"
    )


def test_rule_files_run_in_file_name_order_built_ins_included(tmp_path):
    """A user file named to sort between two built-in ones runs between them."""
    from convexport.folds import builtin_primitives
    from convexport.rewrite.rulefile import builtin_rule_files, load_rules

    early = tmp_path / "15_early.yaml"
    early.write_text("rules:\n  - name: early\n    doc: d\n    match: [y = Identity(x)]\n    apply: forward_input\n")
    late = tmp_path / "mine.yaml"
    late.write_text(early.read_text().replace("early", "late"))
    names = [rule.name for rule in load_rules([*builtin_rule_files(), late, early], set(builtin_primitives()))]
    assert names.index("drop-dropout") < names.index("early") < names.index("conv-batchnorm")
    assert names[-1] == "late"


def test_override_replaces_a_built_in_rule_in_its_place(tmp_path):
    import pytest

    from convexport.errors import ConvexportError
    from convexport.folds import builtin_primitives
    from convexport.rewrite.rulefile import builtin_rule_files, load_rules

    mine = tmp_path / "mine.yaml"
    mine.write_text("rules:\n  - name: conv-batchnorm\n    doc: mine\n    override: true\n"
                    "    match:\n      - y = BatchNormalization(x, s, t, m, v)\n    apply: forward_input\n")
    builtins = load_rules(builtin_rule_files(), set(builtin_primitives()))
    rules = load_rules([*builtin_rule_files(), mine], set(builtin_primitives()))
    assert [rule.name for rule in rules] == [rule.name for rule in builtins]
    assert next(rule for rule in rules if rule.name == "conv-batchnorm").doc == "mine"
    mine.write_text(mine.read_text().replace("    override: true\n", ""))
    with pytest.raises(ConvexportError, match="say override: true to replace it"):
        load_rules([*builtin_rule_files(), mine], set(builtin_primitives()))
    mine.write_text(mine.read_text().replace("conv-batchnorm", "no-such-rule").replace("doc: mine", "doc: mine\n    override: true"))
    with pytest.raises(ConvexportError, match="overrides no rule of that name"):
        load_rules([*builtin_rule_files(), mine], set(builtin_primitives()))


def test_a_primitive_that_raises_is_reported_as_a_crash_not_as_inexact(tmp_path):
    (tmp_path / "boom.py").write_text("def boom(match, context):\n    raise RuntimeError('kaboom')\n")
    (tmp_path / "boom.yaml").write_text(
        "rules:\n  - name: boom\n    doc: d\n    match: [y = Relu(x)]\n    apply: boom.py:boom\n")
    result = CliRunner().invoke(app, ["rules", "test", str(tmp_path / "boom.yaml"), "--examples", "5",
                                      "--out", str(tmp_path / "cx")])
    assert result.exit_code == 3, result.output
    assert result.stdout.startswith("CRASH") and "kaboom" in result.stdout
    assert "rule 'boom' crashed: " in result.stderr and "not exact" not in result.stderr


def test_a_relative_error_against_zero_is_infinite_not_huge():
    import numpy as np

    from convexport.validate.judges import compare_arrays

    error = compare_arrays(np.zeros(4, np.float32), np.array([0, 0, 1e-3, 0], np.float32), 1e-4, 1e-5)
    assert error.max_rel == float("inf") and error.mismatches == 1
    assert compare_arrays(np.zeros(4, np.float32), np.zeros(4, np.float32), 1e-4, 1e-5).max_rel == 0.0


def test_rules_test_says_why_instances_were_not_rewritten(tmp_path):
    result = CliRunner().invoke(app, ["rules", "test", "--builtin", "--rule", "drop-identity", "--examples", "40",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    line = result.stdout.splitlines()[0]
    assert line.startswith("ok       drop-identity") and "; not in " in line
    assert "refused: would rename graph output" in line


def test_a_user_primitive_needs_only_the_primitive_module(tmp_path):
    """A plugin written against convexport.primitive alone folds x * k with k a Constant node."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    import convexport
    from helpers import make_model, op_counts, tensor

    (tmp_path / "mine.py").write_text(
        "import numpy as np\n"
        "from convexport.primitive import Constant, Node, Refusal, Rewrite, Variable, constant_value, reach\n\n"
        "@reach(0)\n"
        "def double_mul(match, context):\n"
        "    a, b = constant_value(match.values['a']), constant_value(match.values['b'])\n"
        "    if a is None or b is None:\n"
        "        raise Refusal('not constants')\n"
        "    out = match.root.outputs[0]\n"
        "    new = Variable(context.fresh('prod'), out.dtype, out.shape)\n"
        "    node = Node('Mul', context.fresh('mul'), {}, [match.values['x'], Constant(context.fresh('k'), np.asarray(a * b))], [new])\n"
        "    return Rewrite([node], [(out, new)], 'two Muls by constants as one')\n")
    (tmp_path / "mine.yaml").write_text("rules:\n  - name: mul-mul\n    doc: d\n    match:\n      - h = Mul(x, a:const)\n"
                                        "      - y = Mul(h, b:const)\n    require: {private: [h]}\n"
                                        "    apply: mine.py:double_mul\n")
    nodes = [helper.make_node("Constant", [], ["a"], value=numpy_helper.from_array(np.float32(2.0))),
             helper.make_node("Mul", ["x", "a"], ["h"]), helper.make_node("Mul", ["h", "b"], ["y"])]
    model = make_model(nodes, [tensor("x", [3])], [tensor("y", [3])], {"b": np.float32(3.0)})
    result = convexport.optimize(model, rules=str(tmp_path / "mine.yaml"), write=False, profile=False,
                                 strategy="all")
    assert op_counts(result.model) == {"Mul": 1} and result.report["validation"]["passed"]


def test_a_yaml_error_points_at_the_bracket_or_quote_left_open(tmp_path):
    unclosed = "rules:\n  - name: a\n    doc: d\n    match: [y = Identity(x)\n    apply: forward_input\n"
    quote = 'rules:\n  - name: a\n    doc: "d\n    match: [y = Identity(x)]\n    apply: forward_input\n'
    tab = "rules:\n  - name: a\n    doc: d\n\tmatch: [y = Identity(x)]\n    apply: forward_input\n"
    for text, where in ((unclosed, ":4:12: "), (quote, ":3:10: "), (tab, ":4:1: ")):
        (tmp_path / "r.yaml").write_text(text)
        result = CliRunner().invoke(app, ["rules", "check", str(tmp_path / "r.yaml")])
        assert result.exit_code == 1 and f"r.yaml{where}not valid YAML" in result.stderr, result.stderr
