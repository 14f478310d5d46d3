"""Rule authoring: the worked example shipped in docs/examples, `examples:` and `samplers:` in
a rule file, and a ConvTranspose rule that `rules test` can test."""

from __future__ import annotations

import shutil
from pathlib import Path

from typer.testing import CliRunner

from convexport.cli import app

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"


def rules_test(*args):
    return CliRunner().invoke(app, ["rules", "test", *map(str, args)])


def test_the_worked_example_passes_and_its_wrong_rule_fails(tmp_path):
    good = rules_test(EXAMPLES / "my_rules.yaml", "--examples", "30", "--out", tmp_path)
    assert good.exit_code == 0, good.output
    assert good.stdout.startswith("ok       constant-minus-conv")
    wrong = rules_test(EXAMPLES / "wrong.yaml", "--examples", "30", "--out", tmp_path)
    assert wrong.exit_code == 3 and "rule 'drop-constant-mul' is not exact" in wrong.stderr
    optimized = CliRunner().invoke(app, ["optimize", f"{EXAMPLES / 'k_minus_conv.py'}:build", "--rules",
                                         str(EXAMPLES / "my_rules.yaml"), "--no-profile", "-o", str(tmp_path / "k.onnx")])
    assert optimized.exit_code == 0 and "constant-minus-conv x1" in optimized.stdout


def test_an_example_that_goes_the_other_way_fails_the_rule(tmp_path):
    for name in ("k_minus_conv.onnx", "k_minus_conv_full_map.onnx"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    flipped = (EXAMPLES / "my_rules.yaml").read_text().replace("rewrites: true", "rewrites: X").replace(
        "rewrites: false", "rewrites: true").replace("rewrites: X", "rewrites: false")
    (tmp_path / "flipped.yaml").write_text(flipped)
    result = rules_test(tmp_path / "flipped.yaml", "--examples", "5", "--out", tmp_path)
    assert result.exit_code == 3, result.output
    assert "example k_minus_conv.onnx: rewritten, but the example says it must be left alone" in result.stdout


def test_an_authors_sampler_and_the_conv_transpose_sampler(tmp_path):
    (tmp_path / "mine.py").write_text(
        "import numpy as np\n"
        "from convexport.ruletest.samplers import Draft\n\n"
        "def neg(draws, slots, fixed, outputs):\n"
        "    value = draws.normal((2, 3)) if slots[0].shape is None else None\n"
        "    return Draft({}, [value])\n")
    (tmp_path / "rules.yaml").write_text(
        "rules:\n"
        "  - name: double-negation\n    doc: d\n    match:\n      - h = Neg(x)\n      - y = Neg(h)\n"
        "    require: {private: [h]}\n    apply: forward_input\n    samplers: {Neg: mine.py:neg}\n"
        "  - name: identity-after-conv-transpose\n    doc: d\n    match:\n"
        "      - h = ConvTranspose(x, w:const, b:const?)\n      - y = Identity(h)\n    apply: forward_input\n")
    result = rules_test(tmp_path / "rules.yaml", "--examples", "30", "--out", tmp_path)
    lines = result.stdout.splitlines()
    assert any(line.startswith("FAIL     double-negation") for line in lines), result.stdout  # y = -(-x) is not h
    assert any(line.startswith("ok       identity-after-conv-transpose") for line in lines), result.stdout


def test_rules_test_writes_some_constants_as_constant_nodes():
    """A primitive must read constants from initializers and Constant nodes alike: instances have both."""
    import random

    from hypothesis import HealthCheck, find, settings

    from convexport.folds import builtin_primitives
    from convexport.rewrite.rulefile import builtin_rule_files, load_rules
    from convexport.ruletest.instances import instances

    rule = next(r for r in load_rules(builtin_rule_files(), set(builtin_primitives())) if r.name == "conv-batchnorm")
    budget = settings(max_examples=200, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    has = lambda instance, kind: (  # noqa: E731
        any(n.op_type == "Constant" for n in instance.model.graph.node) if kind == "node"
        else bool(instance.model.graph.initializer))
    assert has(find(instances(rule), lambda i: has(i, "node"), settings=budget, random=random.Random(0)), "node")
    assert has(find(instances(rule), lambda i: has(i, "init"), settings=budget, random=random.Random(0)), "init")
