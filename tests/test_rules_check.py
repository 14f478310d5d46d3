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
