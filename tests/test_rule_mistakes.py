"""Rules that are wrong in ways a rule author makes them (issue 32): a rewrite that breaks the
graph's shapes is found by the same bisection as one that breaks its values, and the rule is
named (exit 3), whether or not the model is validated."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import convexport
from helpers import IR_VERSION, assert_user_error, invoke, user_rule

# A MatMul chain fold with no check that the weights are 2-D: np.dot of batched weights is
# neither their product per batch nor a valid weight for a 1-D input.
CHAIN_PRIMITIVE = '''
import numpy as np
from convexport.primitive import Constant, Node, Rewrite, Variable, constant_value, reach


@reach(0)
def matmul_chain(match, context):
    first, root = match.nodes["h"], match.root
    w1, w2 = constant_value(first.inputs[1]), constant_value(root.inputs[1])
    merged = Constant(context.fresh("w"), np.dot(w1, w2).astype(np.float32))
    out = root.outputs[0]
    new = Variable(context.fresh(out.name), out.dtype, out.shape)
    return Rewrite([Node("MatMul", context.fresh("mm"), {}, [first.inputs[0], merged], [new])], [(out, new)], "chain")
'''

CHAIN_RULE = """rules:
  - name: matmul-chain
    doc: Two MatMuls by constants are one.
    match:
      - h = MatMul(x, w1:const)
      - y = MatMul(h, w2:const)
    require:
      private: [h]
    apply: chain.py:matmul_chain
"""


@pytest.fixture
def chain_rule(tmp_path):
    return user_rule(tmp_path, "chain", CHAIN_PRIMITIVE, CHAIN_RULE)


def batched_chain(path, input_shape):
    """x -> MatMul by [2, 4, 5] -> MatMul by [2, 5, 3] -> Relu."""
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal([2, 4, 5]).astype(np.float32), rng.standard_normal([2, 5, 3]).astype(np.float32)
    output = [2, 3] if len(input_shape) == 1 else [2, input_shape[0], 3]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"]),
         helper.make_node("Relu", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, input_shape)],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, output)],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION), path)
    return path


@pytest.mark.parametrize("validation", [[], ["--no-validate"]])
def test_a_rule_that_breaks_the_graphs_shapes_is_named_and_nothing_is_written(tmp_path, chain_rule, validation):
    model = batched_chain(tmp_path / "m.onnx", [4])
    out = tmp_path / "out.onnx"
    result = invoke("optimize", model, "--rules", chain_rule, "--no-profile", "-o", out, *validation)
    assert_user_error(result, "not a valid ONNX model", "rewrite #1 'matmul-chain'", "chain.yaml",
                      "nothing was written", code=3)
    assert not out.exists()


def test_the_api_raises_a_validation_error_with_the_culprit(tmp_path, chain_rule):
    model = batched_chain(tmp_path / "m.onnx", [4])
    with pytest.raises(convexport.ValidationError) as raised:
        convexport.optimize(str(model), rules=[str(chain_rule)], write=False, profile=False)
    validation = raised.value.report["validation"]
    assert not validation["passed"] and "Incompatible dimensions" in validation["invalid_model"]
    assert validation["culprit"]["rule"] == "matmul-chain" and validation["culprit"]["index"] == 1


def test_a_model_the_rule_does_not_break_is_written(tmp_path, chain_rule):
    """The same rule on 2-D weights is right: the check does not get in its way."""
    rng = np.random.default_rng(1)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 2])],
        [numpy_helper.from_array(rng.standard_normal([4, 5]).astype(np.float32), "w1"),
         numpy_helper.from_array(rng.standard_normal([5, 2]).astype(np.float32), "w2")])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION), model)
    result = invoke("optimize", model, "--rules", chain_rule, "--no-profile", "-o", tmp_path / "o.onnx")
    assert result.exit_code == 0, result.output
    assert [node.op_type for node in onnx.load(tmp_path / "o.onnx").graph.node] == ["MatMul"]


# --- pattern contracts: the pattern against what its primitive reads ----------------------------


def check(tmp_path, text, name="r.yaml"):
    (tmp_path / name).write_text(text)
    return invoke("rules", "check", tmp_path / name)


def rule(pattern: list[str], apply="compose_linear", extra=""):
    lines = "".join(f"      - {line}\n" for line in pattern)
    return f"rules:\n  - name: mine\n    doc: d\n    match:\n{lines}    apply: {apply}\n{extra}"


def test_a_line_the_primitive_does_not_read_is_refused_at_its_line(tmp_path):
    """compose_linear reads h and the root: the Mul between them would be dropped."""
    result = check(tmp_path, rule(["h = Conv(x, w:const, b:const?)", "m = Mul(h, k:const)", "y = Add(m, c:const)"]))
    assert_user_error(result, "r.yaml:6:1", "`m = Mul(h, k:const)`", "compose_linear does not read this line",
                      "would be dropped")


def test_a_name_the_primitive_reads_must_be_in_the_pattern(tmp_path):
    result = check(tmp_path, rule(["first = Conv(x, w:const)", "y = Mul(first, k:const)"]))
    assert result.exit_code == 1 and "compose_linear reads 'h', which the pattern does not name" in result.stdout


def test_an_op_the_primitive_does_not_handle_on_a_line_is_refused(tmp_path):
    result = check(tmp_path, rule(["h = Gemm(x, w:const)", "y = Mul(h, k:const)"]))
    assert_user_error(result, "`h = Gemm(x, w:const)`", "compose_linear handles", "not Gemm")


def test_a_user_primitive_declares_its_contract_too(tmp_path):
    (tmp_path / "mine.py").write_text(
        "from convexport.primitive import Refusal, consumes\n\n"
        "@consumes('h', h={'MatMul'}, root={'MatMul'})\n"
        "def declared(match, context):\n    raise Refusal('no', reported=False)\n\n"
        "def undeclared(match, context):\n    raise Refusal('no', reported=False)\n")
    three = ["h = MatMul(x, w1:const)", "m = MatMul(h, w2:const)", "y = MatMul(m, w3:const)"]
    assert_user_error(check(tmp_path, rule(three, "mine.py:declared")), "mine.py:declared does not read this line")
    assert check(tmp_path, rule(three, "mine.py:undeclared")).exit_code == 0  # nothing declared, nothing checked
    assert check(tmp_path, rule(three[:1] + ["y = MatMul(h, w2:const)"], "mine.py:declared")).exit_code == 0


def test_every_built_in_primitive_declares_what_it_reads():
    from convexport.folds import builtin_primitives
    from convexport.folds.primitives import contract_of

    undeclared = [name for name, primitive in builtin_primitives().items() if contract_of(primitive) is None]
    assert not undeclared


# --- every mistake at once, overrides, the public API -------------------------------------------


MANY_MISTAKES = """rules:
  - name: many-mistakes
    match:
      - h = Conv(x, w:const, b:const?)
      - m = Mul(h, k:const)
      - y = Add(m, c:const)
    require:
      rank: {q: [4]}
    apply: compose_linear
    with: {nonsense: 1}
    colour: blue
"""


def test_every_mistake_in_a_rule_is_reported_at_once(tmp_path):
    result = check(tmp_path, MANY_MISTAKES)
    assert result.exit_code == 1
    for fragment in ("unknown key 'colour'", "rule lacks 'doc'", "names 'q', which the pattern does not bind",
                     "takes no parameter 'nonsense'", "does not read this line"):
        assert fragment in result.stdout, fragment
    assert "5 error(s)" in result.stderr
    model = batched_chain(tmp_path / "m.onnx", [3, 4])
    optimized = invoke("optimize", model, "--rules", tmp_path / "r.yaml", "--no-profile")
    assert_user_error(optimized, "unknown key 'colour'", "(and 4 more in this rule: convexport rules check lists them)")


def test_an_override_file_alone_is_tested_in_the_built_in_rules_place(tmp_path):
    (tmp_path / "o.yaml").write_text(
        "rules:\n  - name: drop-identity\n    doc: mine\n    override: true\n    match:\n      - y = Identity(x)\n"
        "    apply: forward_input\n")
    result = invoke("rules", "test", tmp_path / "o.yaml", "--examples", "10", "--out", tmp_path / "cex")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ok       drop-identity") and "1 rule(s): 1 passed" in result.stdout


@pytest.mark.parametrize("where", ["first", "after the subcommand", "last"])
def test_debug_is_taken_anywhere_on_the_line(tmp_path, where):
    (tmp_path / "r.yaml").write_text(rule(["h = Conv(x, w:const)", "m = Mul(h, k:const)", "y = Add(m, c:const)"]))
    arguments = ["rules", "check", str(tmp_path / "r.yaml")]
    arguments.insert({"first": 0, "after the subcommand": 1, "last": 3}[where], "--debug")
    result = subprocess.run([sys.executable, "-m", "convexport", *arguments], capture_output=True, text=True)
    assert result.returncode == 1 and "Traceback" in result.stderr  # --debug shows it
    assert "compose_linear does not read this line" in result.stderr


def test_a_constant_takes_a_numpy_scalar_and_is_any_graph_constant():
    import onnx_graphsurgeon as gs

    from convexport.primitive import Constant

    made = Constant("k", np.float32(2) * np.float32(3))  # a product of 0-d arrays is a NumPy scalar
    assert made.values.shape == () and float(made.values) == 6.0
    assert isinstance(gs.Constant("w", np.zeros(2)), Constant) and not isinstance(gs.Variable("v"), Constant)


# --- rules test: draws that reach the cases that matter, and says what it covered ---------------

# A Pad -> Conv fold that moves the pads into the Conv and never looks at the fill value.
PAD_PRIMITIVE = '''
import numpy as np
from convexport.primitive import Node, Refusal, Rewrite, Variable, constant_value, reach


@reach(0)
def pad_into_conv(match, context):
    pad, conv = match.nodes["h"], match.root
    pads = constant_value(pad.inputs[1])
    rank = len(pads) // 2
    if conv.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        raise Refusal('not a case', reported=False)
    if rank < 3 or np.any(pads < 0) or np.any(pads[[0, 1, rank, rank + 1]]):
        raise Refusal('not a case', reported=False)
    own = list(conv.attrs.get("pads", [0] * (2 * rank - 4)))
    added = list(pads[2:rank]) + list(pads[rank + 2:])
    if ONLY_EMPTY and any(added):
        raise Refusal('not a case', reported=False)
    out = conv.outputs[0]
    new = Variable(context.fresh(out.name), out.dtype, out.shape)
    attrs = {**conv.attrs, "pads": [int(a) + int(b) for a, b in zip(own, added)]}
    return Rewrite([Node("Conv", context.fresh("conv"), attrs, [pad.inputs[0], *conv.inputs[1:]], [new])],
                   [(out, new)], "pad into conv")
'''

PAD_RULE = """rules:
  - name: pad-into-conv
    doc: A constant Pad before a Conv is the Conv's own padding.
    match:
      - h = Pad[mode=constant](x, pads:const, value?)
      - y = Conv(h, w:const, b:const?)
    require:
      private: [h]
    apply: pad.py:pad_into_conv
"""


def pad_rule(folder, only_empty=False):
    return user_rule(folder, "pad", f"ONLY_EMPTY = {only_empty}\n" + PAD_PRIMITIVE, PAD_RULE)


@pytest.mark.parametrize("seed", ["0", "1"])
def test_a_pad_fold_that_ignores_the_fill_value_fails_at_the_default_settings(tmp_path, seed):
    result = invoke("rules", "test", pad_rule(tmp_path), "--seed", seed, "--out", tmp_path / "cex")
    assert result.exit_code == 3 and "rule 'pad-into-conv' is not exact: differs" in result.stderr, result.output


@pytest.mark.parametrize("seed", ["0", "1"])
def test_a_matmul_fold_without_a_rank_check_fails_at_the_default_settings(tmp_path, chain_rule, seed):
    """The sampler draws 1-D inputs and stacked weights, which MatMul's broadcasting allows."""
    result = invoke("rules", "test", chain_rule, "--seed", seed, "--out", tmp_path / "cex")
    assert result.exit_code == 3 and "rule 'matmul-chain' is not exact" in result.stderr, result.output


def test_a_rule_verified_only_where_its_pad_pads_nothing_is_warned_about(tmp_path):
    result = invoke("rules", "test", pad_rule(tmp_path, only_empty=True), "--seed", "0", "--out", tmp_path / "cex")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("WARN     pad-into-conv")
    assert "verified only on degenerate instances" in result.stdout
    assert "covered: Conv: " in result.stdout and "Pad: pads nothing" in result.stdout


def test_the_seed_is_new_each_run_printed_and_repeats_the_run(tmp_path):
    runs = [invoke("rules", "test", "--builtin", "--rule", "conv-mul", "--out", tmp_path, *seed)
            for seed in ([], [], ["--seed", "7"], ["--seed", "7"])]
    seeds = [run.stdout.rsplit("(seed ", 1)[1].split(";")[0] for run in runs]
    assert seeds[0] != seeds[1] and seeds[2:] == ["7", "7"]
    assert runs[2].stdout == runs[3].stdout and "--seed 7 repeats these instances" in runs[2].stdout


def test_rounds_are_drawn_until_enough_instances_were_rewritten_and_every_case_held(tmp_path):
    """drop-empty-pad rewrites one drawn Pad in ten or so (padding that pads is what the sampler
    steers to): one round of 20 gives a couple, more rounds give the 10 asked for."""
    from convexport.folds import builtin_primitives
    from convexport.rewrite.rulefile import builtin_rule_files, load_rules
    from convexport.ruletest.verify import verify_rule

    (rule,) = [r for r in load_rules(builtin_rule_files(), set(builtin_primitives())) if r.name == "drop-empty-pad"]
    once = verify_rule(rule, builtin_primitives(), 20, 0, tmp_path)
    more = verify_rule(rule, builtin_primitives(), 20, 0, tmp_path, rewritten=10, budget_s=60)
    assert once.rounds == 1 and once.applied < 10
    assert more.rounds > 1 and more.applied >= 10 and more.possible <= more.drawn
