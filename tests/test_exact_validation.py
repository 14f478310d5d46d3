"""Validation judged against the exact (float64) result: a rewrite that is closer to it than the
original passes however far the two float32 graphs are from each other; a rewrite that is wrong
by one part in a thousand fails, on a well-conditioned model and inside an ill-conditioned one."""

from __future__ import annotations

import textwrap

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import convexport
from convexport.validate.exact_check import FACTOR, exact_reference
from convexport.validate.float64 import Float64Evaluator, as_float64
from helpers import IR_VERSION, op_counts, user_rule

RNG = np.random.default_rng(30)


def conv(name, x, weight, out, pads=0):
    return helper.make_node("Conv", [x, weight], [out], pads=[pads] * 4, name=name)


def ill_conditioned(scale_node: bool = False) -> onnx.ModelProto:
    """y = b(a(x)) - c(x), where c's 3x3 kernel is the composition b o a to within 1e-5 of it:
    y is a small difference of large terms, which float32 computes to a few per cent. a is an
    unpadded bias-free 1x1 (16 -> 32), b a padded 3x3 (32 -> 8), so b o a is one exact 3x3 conv.
    With `scale_node`, b's output goes through a Mul by a scalar first (for a user rule that
    folds it, wrongly)."""
    a = RNG.standard_normal((32, 16, 1, 1)) * 30
    b = RNG.standard_normal((8, 32, 3, 3)) * 30
    composed = np.einsum("omhw,mi->oihw", b, a[:, :, 0, 0])
    c = composed * (1 + 1e-5 * RNG.standard_normal(composed.shape))
    weights = {"a": a, "b": b, "c": c, "s": np.array(1.0)}
    nodes = [conv("a", "x", "a", "h"), conv("b", "h", "b", "ba", pads=1)]
    if scale_node:
        nodes.append(helper.make_node("Mul", ["ba", "s"], ["bas"], name="scale"))
    nodes += [conv("c", "x", "c", "cx", pads=1), helper.make_node("Sub", ["bas" if scale_node else "ba", "cx"], ["y"])]
    return model_of(nodes, [1, 16, 12, 12], [1, 8, 12, 12], weights)


def well_conditioned() -> onnx.ModelProto:
    """y = Mul(Conv(x), 0.5) + x-independent nothing: a plain conv and a scale."""
    weights = {"w": RNG.standard_normal((8, 4, 3, 3)), "s": np.array(0.5)}
    nodes = [conv("conv", "x", "w", "h", pads=1), helper.make_node("Mul", ["h", "s"], ["y"], name="scale")]
    return model_of(nodes, [1, 4, 10, 10], [1, 8, 10, 10], weights)


def model_of(nodes, input_shape, output_shape, weights) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, input_shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, output_shape)],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in weights.items()])
    return onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION))


def exact_error(model: onnx.ModelProto, reference: onnx.ModelProto, feeds: dict) -> float:
    """max |model's float32 run - reference's float64 run|."""
    from helpers import run

    exact = Float64Evaluator(reference).run(feeds)[0]
    return float(np.abs(run(model, feeds)[0].astype(np.float64) - exact).max())


def test_the_float64_graph_is_the_model_in_double():
    model = ill_conditioned()
    wide = as_float64(model)
    assert all(init.data_type == onnx.TensorProto.DOUBLE for init in wide.graph.initializer)
    assert wide.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.DOUBLE
    x = RNG.standard_normal((1, 16, 12, 12)).astype(np.float32)
    (exact,) = Float64Evaluator(model).run({"x": x})
    assert exact.dtype == np.float64
    # the float32 run is a few per cent off the exact result: the model amplifies rounding
    from helpers import run
    rounded = run(model, {"x": x})[0]
    assert np.abs(rounded - exact).max() > 1e-3 * np.sqrt(np.mean(exact ** 2))


def test_an_ill_conditioned_model_is_written_and_no_further_from_float64(tmp_path):
    model = ill_conditioned()
    result = convexport.optimize(model, output=tmp_path / "o.onnx", profile=False)
    validation = result.report["validation"]
    assert validation["passed"] and validation["reference"] == "float64"
    assert op_counts(result.model) == {"Conv": 1}  # b o a - c folded into one conv
    (error,) = validation["outputs"].values()
    assert error["exact_error"] <= error["exact_error_original"]
    feeds = {"x": RNG.standard_normal((1, 16, 12, 12)).astype(np.float32)}
    assert exact_error(onnx.load(tmp_path / "o.onnx"), model, feeds) <= exact_error(model, model, feeds)
    # and the float32-to-float32 comparison it used to fail says they are far apart
    assert error["max_rel"] > 1e-2


WRONG_PRIMITIVE = textwrap.dedent("""
    import numpy as np
    from convexport.primitive import Constant, Node, Refusal, Rewrite, Variable, constant_value

    def scaled_conv(match, context):
        '''Conv(x, w) * s -> Conv(x, w * s), except that it scales by 1.001 too much.'''
        conv, scale = match.nodes["h"], constant_value(match.values["s"])
        if scale.size != 1:
            raise Refusal("not a scalar", reported=False)
        weight = constant_value(conv.inputs[1]) * float(scale.reshape(-1)[0]) * 1.001
        out = Variable(context.fresh("scaled"), np.float32, match.root.outputs[0].shape)
        node = Node("Conv", context.fresh("scaled_conv"), dict(conv.attrs),
                    [conv.inputs[0], Constant(context.fresh("w"), weight.astype(np.float32))], [out])
        return Rewrite([node], [(match.root.outputs[0], out)], "conv and scale as one conv")
""")

WRONG_RULE = textwrap.dedent("""
    rules:
      - name: conv-times-scalar-off-by-a-thousandth
        doc: Conv(x) * s as one Conv, its weights scaled by 1.001 too much.
        match:
          - h = Conv(x, w:const)
          - y = Mul(h, s:const)
        require:
          private: [h]
        apply: wrong.py:scaled_conv
""")


@pytest.fixture
def wrong_rule(tmp_path):
    return user_rule(tmp_path, "wrong", WRONG_PRIMITIVE, WRONG_RULE)


@pytest.mark.parametrize("model", [well_conditioned, lambda: ill_conditioned(scale_node=True)],
                         ids=["well-conditioned", "inside an ill-conditioned model"])
def test_a_rewrite_wrong_by_a_thousandth_is_refused_and_named(model, wrong_rule, tmp_path):
    with pytest.raises(convexport.ValidationError, match="conv-times-scalar-off-by-a-thousandth") as failed:
        convexport.optimize(model(), output=tmp_path / "o.onnx", profile=False, rules=[wrong_rule],
                            builtin_rules=False)
    assert not (tmp_path / "o.onnx").exists()
    validation = failed.value.report["validation"]
    assert validation["reference"] == "float64" and validation["culprit"]["rule"] == "conv-times-scalar-off-by-a-thousandth"
    (error,) = validation["outputs"].values()
    assert error["exact_error"] > FACTOR * error["exact_error_original"]
    assert error["exact_error_float64"] > error["exact_bound"]  # the float64 run shows it at its own size


def test_explicit_tolerances_are_a_bound_besides(tmp_path):
    """--rtol/--atol keep their meaning: the optimized graph against the original's own run."""
    with pytest.raises(convexport.ValidationError):
        convexport.optimize(ill_conditioned(), write=False, profile=False, rtol=1e-4, atol=1e-5)


def test_a_model_over_the_budget_is_checked_against_float32_and_says_so(monkeypatch):
    monkeypatch.setattr("convexport.validate.exact_check.reference_rate", lambda: 1.0)
    monkeypatch.setattr("convexport.stages.validate.FULL_REFERENCE_FLOPS", 0)  # no floor for models this size
    result = convexport.optimize(well_conditioned(), write=False, profile=False)
    validation = result.report["validation"]
    assert validation["passed"] and validation["reference"] == "float32" and "skipped" in validation["reference_note"]
    (error,) = validation["outputs"].values()
    assert error["exact_error"] is None and error["rtol"] == 1e-4  # judged as before, by the tolerances


def test_a_model_of_real_size_gets_the_float64_reference_on_every_input_set(monkeypatch):
    """optimize's budget covers every input set of a model of up to 10 GFLOPs a run, however
    little the run spent before validating (the share of that time alone gave 1 of 3 sets)."""
    import convexport.stages.validate as check

    monkeypatch.setattr(check, "FLOAT64_SHARE", 0.0)
    monkeypatch.setattr(check, "FLOAT64_MIN_S", 1e-6)
    result = convexport.optimize(well_conditioned(), write=False, profile=False)
    validation = result.report["validation"]
    assert validation["reference"] == "float64" and validation.get("reference_note") is None, validation


def test_the_budget_takes_what_fits():
    model = well_conditioned()
    feeds = [{"x": RNG.standard_normal((1, 4, 10, 10)).astype(np.float32)} for _ in range(3)]
    assert [exact_reference(model, feeds).available(i) for i in range(3)] == [True] * 3
    reference = exact_reference(model, feeds, budget_s=1e-4)  # the first set always, if its estimate fits
    assert [reference.available(i) for i in range(3)] == [True, False, False] and "1 of 3" in reference.note


def test_rules_test_fails_a_rule_wrong_by_a_ten_thousandth(tmp_path):
    """rules test judges its instances as optimize does: a fold whose weights are 1e-4 off,
    which a tolerance of 1e-4 of the scale let through, fails against the float64 result."""
    from helpers import invoke

    (tmp_path / "wrong.py").write_text(WRONG_PRIMITIVE.replace("1.001", "1.0001"))
    (tmp_path / "wrong.yaml").write_text(WRONG_RULE)
    result = invoke("rules", "test", tmp_path / "wrong.yaml", "--examples", "30", "--out", tmp_path / "cx")
    assert result.exit_code == 3, result.output
    assert "error against the float64 result" in result.stdout and "is not exact" in result.stderr


@pytest.mark.parametrize("group, per_group, stride, output_padding", [(2, 3, 2, 1), (4, 1, 1, 0), (1, 2, 2, 1), (3, 2, 3, 2)])
def test_the_float64_run_of_a_grouped_conv_transpose_with_bias_is_right(group, per_group, stride, output_padding):
    """ONNX's reference ConvTranspose (onnx 1.23) gives every group the first group's bias and
    one output channel per group; the float64 evaluator runs it group by group."""
    from convexport.runtime import create_session

    rng = np.random.default_rng(group)
    channels = 2 * group
    weight = rng.standard_normal([channels, per_group, 3]).astype(np.float32)
    bias = rng.standard_normal(per_group * group).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], group=group, strides=[stride],
                            output_padding=[output_padding], pads=[1, 0])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, channels, 5])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    x = rng.standard_normal([2, channels, 5]).astype(np.float32)
    exact = Float64Evaluator(model).run({"x": x})[0]
    runtime = create_session(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(exact, runtime, rtol=1e-5, atol=1e-5)


def test_an_unchanged_graph_is_judged_by_the_reference_runs_alone(monkeypatch):
    """A candidate that is the reference with renamed tensors (ir/same.py) computes alike: it is
    neither run on ONNX Runtime nor widened to float64 again, and its error is the original's."""
    from convexport.validate import compare as validate
    from convexport.load.inputs import InputSets, parse_input_spec

    model = well_conditioned()
    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    renamed.graph.node[0].output[0] = renamed.graph.node[1].input[0] = "renamed"

    def never(*args, **kwargs):
        raise AssertionError("the unchanged graph was run again")

    monkeypatch.setattr(validate, "candidate_runs", never)
    monkeypatch.setattr(validate, "float64_or_none", never)
    result = validate.compare_models(model, renamed, InputSets([parse_input_spec("x:1x4x10x10")], 2))
    (error,) = result.outputs.values()
    assert result.passed and result.reference == "float64" and error.exact_error == error.exact_error_original


def test_the_float64_reference_stops_at_its_budget_within_a_run(monkeypatch):
    """100,000 chained Identity nodes took 87 s against a budget of 4.5 s: the estimate (no
    FLOPs) let the first run start, and nothing stopped it. A run now stops at the first node
    past its deadline, and the note says so; the node check stops too and says where."""
    from convexport.validate import exact_check
    from convexport.validate.float64 import Float64Evaluator
    from convexport.validate.float64.node_check import check_nodes

    nodes = [helper.make_node("Identity", [f"t{i}"], [f"t{i + 1}"]) for i in range(3000)]
    nodes[0].input[0], nodes[-1].output[0] = "x", "y"
    model = model_of(nodes, [1, 4], [1, 4], {})
    feeds = [{"x": RNG.standard_normal((1, 4)).astype(np.float32)} for _ in range(3)]
    monkeypatch.setattr(exact_check, "Float64Evaluator", lambda m: _SlowEvaluator(m))
    monkeypatch.setattr(exact_check, "FIRST_RUN_LEAST_S", 0.1)
    reference = exact_reference(model, feeds, budget_s=0.05)
    assert not reference.available(0) and "did not finish within its time budget" in reference.note
    stopped = check_nodes(model, feeds[0], Float64Evaluator(model), deadline=0.0)  # a deadline long past
    assert stopped.nodes_checked == 0 and stopped.stopped_at == 3000 and stopped.disagreement is None


class _SlowEvaluator:
    """The float64 evaluator with each node 1 ms slower (the 100,000-node model's pace)."""

    def __init__(self, model):
        import time

        from convexport.validate.float64 import Float64Evaluator

        self.inner = Float64Evaluator(model)
        for node in self.inner.evaluator.rt_nodes_:
            node._run = (lambda run: lambda *a, **k: (time.sleep(1e-3), run(*a, **k))[1])(node._run)
        self.evaluator = self.inner.evaluator

    def run(self, feeds, intermediate=False, deadline=None):
        return self.inner.run(feeds, intermediate, deadline)
