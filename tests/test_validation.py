"""Validation: tolerances that catch real changes and pass fp32 noise, NaN/Inf, per-output
overrides, and localisation of the rewrite that broke a graph."""

from __future__ import annotations

import io
import json

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from typer.testing import CliRunner

import convexport
from convexport.cli import app
from convexport.load.inputs import InputSets, InputSpec
from convexport.validate.results import Tolerances
from convexport.validate.judges import compare_arrays
from convexport.validate.compare import compare_models
from helpers import make_model, tensor
from resnet import build as build_resnet


@pytest.fixture(scope="module")
def resnet():
    module, inputs = build_resnet()
    buffer = io.BytesIO()
    torch.onnx.export(module, inputs, buffer, dynamo=False, opset_version=18, input_names=["x"])
    return onnx.load_from_string(buffer.getvalue())


INPUTS = [InputSpec("x", (1, 3, 64, 64))]


def with_weights(model, change):
    """A copy of the model with every float weight passed through change(name, array)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for init in copy.graph.initializer:
        values = numpy_helper.to_array(init)
        if values.dtype == np.float32 and values.ndim >= 1:
            init.CopyFrom(numpy_helper.from_array(change(init.name, values).astype(np.float32), init.name))
    return copy


def conv_weights(model):
    return [init.name for init in model.graph.initializer if len(init.dims) == 4]


def test_fp32_level_noise_passes(resnet):
    rng = np.random.default_rng(0)
    noisy = with_weights(resnet, lambda name, w: w * (1 + rng.uniform(-2e-7, 2e-7, w.shape)))
    assert compare_models(resnet, noisy, InputSets(INPUTS)).passed


@pytest.mark.parametrize("which", [0, 9, -1])       # the stem, a middle block, the last block
def test_one_percent_change_of_one_weight_tensor_fails(resnet, which):
    target = conv_weights(resnet)[which]
    nudged = with_weights(resnet, lambda name, w: w * 1.01 if name == target else w)
    result = compare_models(resnet, nudged, InputSets(INPUTS))
    assert not result.passed, result.summary()


def test_statistics_of_an_output():
    ref = np.array([1.0, -2.0, 0.0, 4.0], np.float32)
    error = compare_arrays(ref, ref + np.array([0, 0, 1e-7, 0], np.float32), 1e-4, 1e-5)
    assert error.mismatches == 0 and error.max_abs == pytest.approx(1e-7, rel=1e-3)
    assert error.cosine == pytest.approx(1.0)
    assert error.max_rel == pytest.approx(1e-7 / np.sqrt(np.mean(ref.astype(np.float64) ** 2)), rel=1e-3)
    assert compare_arrays(ref, -ref, 1e-4, 1e-5).cosine == pytest.approx(-1.0)


@pytest.mark.parametrize("ref, cand, mismatches", [
    ([np.nan, 1.0], [np.nan, 1.0], 0), ([np.nan, 1.0], [0.0, 1.0], 1), ([1.0, 2.0], [np.nan, 2.0], 1),
    ([np.inf, -np.inf], [np.inf, -np.inf], 0), ([np.inf, 1.0], [-np.inf, 1.0], 1), ([np.inf, 1.0], [1e30, 1.0], 1),
])
def test_nan_and_inf_are_explicit(ref, cand, mismatches):
    assert compare_arrays(np.array(ref), np.array(cand), 1e-4, 1e-5).mismatches == mismatches


def two_output_model(scale_b, scale_a=2.0):
    nodes = [helper.make_node("Mul", ["x", "k"], ["a"]), helper.make_node("Mul", ["x", "kb"], ["b"])]
    return make_model(nodes, [tensor("x", [4])], [tensor("a", [4]), tensor("b", [4])],
                      {"k": np.float32(scale_a), "kb": np.float32(scale_b)})


def test_per_output_tolerances_are_a_bound_besides_the_exact_result():
    """Judged against the float64 result, an output one part in a thousand off fails whatever
    tolerance is given for it; a tolerance bounds an output's difference from the original's
    run besides: one as tight as 1e-8 fails a difference of one float32 unit that the float64
    criterion lets through."""
    reference, inputs = two_output_model(1.0), [InputSpec("x", (4,))]
    wrong_b = two_output_model(1.001)
    assert not compare_models(reference, wrong_b, InputSets(inputs)).passed
    assert not compare_models(reference, wrong_b, InputSets(inputs), tolerances=Tolerances.parse(None, ["b:1e-2"])).passed
    one_unit_off = two_output_model(1.0, scale_a=float(np.nextafter(np.float32(2.0), np.float32(3.0))))
    assert compare_models(reference, one_unit_off, InputSets(inputs)).passed
    tight = Tolerances.parse(["a:1e-8"], ["0"])
    assert not compare_models(reference, one_unit_off, InputSets(inputs), tolerances=tight).passed
    assert compare_models(reference, one_unit_off, InputSets(inputs), tolerances=Tolerances.parse(["b:1e-8"], ["0"])).passed


def test_cli_validate_with_per_output_tolerance(tmp_path):
    onnx.save(two_output_model(1.0), str(tmp_path / "ref.onnx"))
    onnx.save(two_output_model(1.0, scale_a=float(np.nextafter(np.float32(2.0), np.float32(3.0)))),
              str(tmp_path / "cand.onnx"))
    runner = CliRunner()
    passed = runner.invoke(app, ["validate", str(tmp_path / "ref.onnx"), str(tmp_path / "cand.onnx"),
                                 "--report", str(tmp_path / "v.json")])
    assert passed.exit_code == 0, passed.output
    report = json.loads((tmp_path / "v.json").read_text())
    assert report["reference"] == "float64" and report["outputs"]["a"]["rtol"] is None
    failed = runner.invoke(app, ["validate", str(tmp_path / "ref.onnx"), str(tmp_path / "cand.onnx"),
                                 "--rtol", "a:1e-8", "--atol", "0", "--report", str(tmp_path / "v.json")])
    assert failed.exit_code == 3 and "output 'a'" in failed.stderr
    report = json.loads((tmp_path / "v.json").read_text())
    assert report["outputs"]["a"]["rtol"] == 1e-8 and report["outputs"]["b"]["rtol"] == 1e-4
    bad = runner.invoke(app, ["validate", str(tmp_path / "ref.onnx"), str(tmp_path / "cand.onnx"), "--rtol", "b:x"])
    assert bad.exit_code == 1 and "--rtol 'b:x'" in bad.stderr


WRONG_RULE = """rules:
  - name: relu-is-identity
    doc: Deliberately wrong, for the localisation test.
    match:
      - y = Relu(x)
    apply: forward_input
"""


def test_localisation_names_the_wrong_rule(small_net_path, tmp_path):
    rules = tmp_path / "wrong.yaml"
    rules.write_text(WRONG_RULE)
    out = tmp_path / "o.onnx"
    with pytest.raises(convexport.ValidationError) as caught:
        convexport.optimize(f"{small_net_path}:build", output=out, rules=[rules], profile=False)
    culprit = caught.value.report["validation"]["culprit"]
    assert culprit["rule"] == "relu-is-identity" and culprit["file"] == str(rules) and culprit["nodes"]
    assert "relu-is-identity" in str(caught.value) and str(rules) in str(caught.value)
    assert not out.exists()


def test_localisation_through_the_cli(small_net_path, tmp_path):
    rules = tmp_path / "wrong.yaml"
    rules.write_text(WRONG_RULE)
    report = tmp_path / "r.json"
    result = CliRunner().invoke(app, ["optimize", f"{small_net_path}:build", "-o", str(tmp_path / "o.onnx"),
                                      "--rules", str(rules), "--no-profile", "--report", str(report)])
    assert result.exit_code == 3
    assert "relu-is-identity" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert json.loads(report.read_text())["validation"]["culprit"]["rule"] == "relu-is-identity"
    assert not (tmp_path / "o.onnx").exists()


def test_validate_takes_dynamic_dims_from_input(small_net_path, tmp_path):
    runner = CliRunner()
    for name, extra in (("ref", []), ("cand", [])):
        assert runner.invoke(app, ["export", f"{small_net_path}:build", "-o", str(tmp_path / f"{name}.onnx"),
                                   "--dynamic-batch", *extra]).exit_code == 0
    result = runner.invoke(app, ["validate", str(tmp_path / "ref.onnx"), str(tmp_path / "cand.onnx"),
                                 "--input", "input:5x3x16x16", "--runs", "1", "--report", str(tmp_path / "v.json")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "v.json").read_text())["inputs"] == ["input:5x3x16x16:float32"]
    unknown = runner.invoke(app, ["validate", str(tmp_path / "ref.onnx"), str(tmp_path / "cand.onnx"),
                                  "--input", "nope:1x3x16x16"])
    assert unknown.exit_code == 1 and "no such input" in unknown.stderr


def test_tolerances_follow_the_output_dtype():
    tolerances = Tolerances.parse(None, None)
    assert tolerances.for_output("y", "float32") == (1e-4, 1e-5)
    assert tolerances.for_output("y", "float16") == (5e-3, 1e-3)
    assert Tolerances.parse(["1e-6"], None).for_output("y", "float16") == (1e-6, 1e-3)


def test_fp16_model_folds_in_float64_and_validates_against_float64(tmp_path):
    from torch import nn

    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(3, 8, 1), nn.Conv2d(8, 8, 3, padding=1, bias=False)).eval().half()
    result = convexport.optimize(module, inputs=["x:1x3x16x16:float16"], output=tmp_path / "h.onnx", profile=False)
    assert result.report["after"]["ops"]["Conv"] == 1 and result.report["validation"]["passed"]
    output = next(iter(result.report["validation"]["outputs"].values()))
    assert result.report["validation"]["reference"] == "float64" and output["rtol"] is None
    assert output["exact_error"] <= output["exact_bound"] and output["max_rel"] < 5e-3
    weights = [init for init in onnx.load(str(result.output)).graph.initializer if len(init.dims) == 4]
    assert all(init.data_type == onnx.TensorProto.FLOAT16 for init in weights)


def test_a_candidate_that_cannot_run_where_the_reference_runs_fails_validation():
    """Not an error of the inputs: the reference runs on them, so the candidate is wrong."""
    relu = make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [1, 3, 8, 8])], [tensor("y", [1, 3, 8, 8])])
    broken = make_model([helper.make_node("Conv", ["x", "w"], ["y"])], [tensor("x", [1, 3, 8, 8])],
                        [tensor("y", [1, 3, 8, 8])], {"w": np.ones((3, 5, 1, 1), np.float32)})
    result = compare_models(relu, broken, InputSets([InputSpec("x", (1, 3, 8, 8))]))
    assert not result.passed and "cannot run the candidate on x:1x3x8x8:float32" in result.problem, result.problem


def test_each_input_set_is_judged_by_one_criterion_chosen_for_it():
    """judge_of_set: a set with a float64 result against it; a later one by the noise floor
    measured there (an output not judged yet by the tolerances); without any, the tolerances."""
    import numpy as np

    from convexport.validate.exact_check import ExactReference
    from convexport.validate.judges import AgainstFloat64, ByNoiseFloor, ByTolerances, NoiseFloor, judge_of_set

    ref = np.linspace(-1, 1, 64, dtype=np.float32)
    exact = ExactReference([[ref.astype(np.float64)], None])
    floor = NoiseFloor({"y": 1.0}, {})
    first = judge_of_set(0, ["y"], exact, floor, {}, None, Tolerances(), None)
    assert type(first) is AgainstFloat64
    judged = {"y": first(0, "y", ref, ref + 1e-7, None)}
    second = judge_of_set(1, ["y"], exact, floor, judged, None, Tolerances(), None)
    assert type(second) is ByNoiseFloor and second(0, "y", ref, ref, None).rtol is None  # bound by the floor
    assert second(0, "z", ref, ref, None).rtol is not None  # not judged before: the tolerances
    assert type(judge_of_set(0, ["y"], None, None, {}, None, Tolerances(), None)) is ByTolerances
