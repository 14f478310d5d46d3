"""`convexport rules check` reports every error in every file given, each as file:line:col."""

from __future__ import annotations

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
    assert result.exit_code == 0 and result.stdout.strip() == "30 rule(s) OK"


def test_rule_files_run_in_file_name_order_built_ins_included(tmp_path):
    """A user file named to sort between two built-in ones runs between them."""
    from convexport.rewrite.primitives import builtin_primitives
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
    from convexport.rewrite.primitives import builtin_primitives
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

    from convexport.validate import compare_arrays

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
