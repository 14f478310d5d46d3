"""`convexport rules test`: random instances of a rule's pattern, checked with ONNX Runtime."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from typer.testing import CliRunner

from convexport.cli import app
from convexport.folds import builtin_primitives
from convexport.rewrite.rulefile import builtin_rule_files, load_rules, parse_rule_file
from convexport.ruletest.instances import instances
from convexport.ruletest.verify import verify_rule

PRIMITIVES = builtin_primitives()
BUILTIN = load_rules(builtin_rule_files(), set(PRIMITIVES))
EXAMPLES = int(os.environ.get("CONVEXPORT_RULETEST_EXAMPLES", "60"))
REWRITTEN = 10  # rounds of EXAMPLES more until this many instances were rewritten (30 s at most)
runner = CliRunner()

WRONG_PATTERN = """rules:
  - name: drop-constant-mul
    doc: WRONG on purpose - takes a product with a constant for its input.
    match:
      - y = Mul(x, k:const)
    apply: forward_input
"""

# A plausible bug: the Mul scales the conv's weights but the bias is forgotten.
FORGETFUL_PLUGIN = '''
import numpy as np
import onnx_graphsurgeon as gs

from convexport.ir import constant_value
from convexport.folds.primitives import Rewrite


def scale_weights(match, context):
    conv = match.nodes["h"]
    weight = constant_value(match.values["w"])
    scale = np.broadcast_to(constant_value(match.values["k"]).reshape(-1), weight.shape[:1])
    scaled = gs.Constant(context.fresh("scaled"), (weight * scale.reshape(-1, *[1] * (weight.ndim - 1))).astype(weight.dtype))
    output = gs.Variable(context.fresh("y"), dtype=weight.dtype)
    node = gs.Node("Conv", context.fresh("conv"), dict(conv.attrs), [match.values["x"], scaled, *conv.inputs[2:]], [output])
    return Rewrite([node], [(match.root.outputs[0], output)], "Mul folded into the weights")
'''

FORGETFUL_RULE = """rules:
  - name: conv-mul-forgetful
    doc: A Conv times a constant, folded (but the bias is not scaled).
    match:
      - h = Conv(x, w:const, b:const?)
      - y = Mul(h, k:const)
    where:
      per_channel: {k: h}
    require:
      private: [h]
    apply: forgetful.py:scale_weights
"""


@pytest.mark.long
@pytest.mark.parametrize("rule", BUILTIN, ids=lambda rule: rule.name)
def test_builtin_rule_is_exact_on_random_instances(rule, tmp_path):
    result = verify_rule(rule, PRIMITIVES, EXAMPLES, seed=0, out_dir=tmp_path, rewritten=REWRITTEN, budget_s=30)
    assert result.failure is None, result.failure
    assert result.untested is None, result.untested
    assert result.applied >= 1 and result.instances >= EXAMPLES // 2
    assert not result.only_degenerate, sorted(result.exercised)


@pytest.mark.parametrize("rule", [r for r in BUILTIN if r.name in ("concat-linear-branches", "split-branches", "pad-conv",
                                                                   "gathered-linear-branches")], ids=lambda r: r.name)
def test_instances_are_valid_models_holding_the_pattern(rule):
    ops = {line.op_type for line in rule.pattern if not line.is_class}   # (an op class: any of its ops)

    @settings(max_examples=15, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(instances(rule))
    def check(instance):
        onnx.checker.check_model(instance.model, full_check=True)
        assert ops <= {node.op_type for node in instance.model.graph.node}
        assert set(instance.feeds) == {value.name for value in instance.model.graph.input}

    check()


def test_a_wrong_rule_gets_a_small_saved_counterexample(tmp_path):
    rules = tmp_path / "wrong.yaml"
    rules.write_text(WRONG_PATTERN)
    out = tmp_path / "found"
    result = runner.invoke(app, ["rules", "test", str(rules), "--examples", "50", "--out", str(out)])
    assert result.exit_code == 3, result.output
    assert "FAIL     drop-constant-mul" in result.stdout
    assert result.stderr.count("\n") == 1 and "rule 'drop-constant-mul' is not exact" in result.stderr
    counterexample = out / "drop-constant-mul.counterexample.onnx"
    model = onnx.load(counterexample)
    assert len(model.graph.node) <= 2          # shrunk: the Mul and at most its reader
    assert all(np.prod(list(init.dims)) <= 2 for init in model.graph.initializer)
    # the saved files reproduce the failure through `convexport validate`
    replay = runner.invoke(app, ["validate", str(counterexample), str(out / "drop-constant-mul.rewritten.onnx"),
                                 "--inputs", str(out / "drop-constant-mul.counterexample.npz")])
    assert replay.exit_code == 3, replay.output


def test_a_plugin_that_forgets_the_bias_is_caught(tmp_path):
    (tmp_path / "forgetful.py").write_text(FORGETFUL_PLUGIN)
    path = tmp_path / "forgetful.yaml"
    path.write_text(FORGETFUL_RULE)
    (rule,) = parse_rule_file(path, set(PRIMITIVES))
    result = verify_rule(rule, PRIMITIVES, 100, seed=0, out_dir=tmp_path / "found")
    assert result.failure and "differs" in result.failure
    conv = next(node for node in onnx.load(result.saved[0]).graph.node if node.op_type == "Conv")
    assert len(conv.input) == 3 and conv.input[2]     # only instances with a bias fail


def test_rules_test_passes_a_correct_user_rule(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(FORGETFUL_RULE.replace("forgetful.py:scale_weights", "compose_linear")
                    .replace("conv-mul-forgetful", "my-conv-mul"))
    result = runner.invoke(app, ["rules", "test", str(path), "--examples", "30", "--out", str(tmp_path / "none")])
    assert result.exit_code == 0, result.output
    assert "ok       my-conv-mul" in result.stdout and "1 rule(s): 1 passed" in result.stdout
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("match, where, fragment", [
    ("y = Softmax(x)", "", "no random instances of Softmax"),
    ("y = Conv(x, w:const)", "    where:\n      rank: {x: [7]}\n", "none of"),
])
def test_untestable_rules_exit_1(tmp_path, match, where, fragment):
    path = tmp_path / "r.yaml"
    path.write_text(f"rules:\n  - name: r\n    doc: d\n    match:\n      - {match}\n{where}    apply: forward_input\n")
    # one round of 10 (the first always runs): a rule no instance of which is rewritten stays so
    result = runner.invoke(app, ["rules", "test", str(path), "--examples", "10", "--budget", "0", "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert "UNTESTED r" in result.stdout and fragment in result.stdout
    assert "1 rule(s) could not be tested: r" in result.stderr


def test_rules_test_usage(tmp_path):
    assert runner.invoke(app, ["rules", "test"]).exit_code == 2
    result = runner.invoke(app, ["rules", "test", "--builtin", "--rule", "no-such-rule"])
    assert result.exit_code == 1 and "no rule named no-such-rule" in result.stderr


def test_rules_test_is_reproducible(tmp_path):
    rule = next(r for r in BUILTIN if r.name == "concat-linear-branches")
    first, second = (verify_rule(rule, PRIMITIVES, 20, seed=3, out_dir=tmp_path) for _ in range(2))
    assert (first.instances, first.applied) == (second.instances, second.applied)
