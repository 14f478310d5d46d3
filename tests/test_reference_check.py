"""The float64 reference that judges validation is itself checked (issue 48): ONNX's opset-13
BatchNormalization no longer inflates the original's "own error"; a reference that disagrees
with ONNX Runtime node by node is named and the stricter check applies; input sets without a
reference are judged by the noise floor measured on those with one."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import convexport
from convexport import float64
from convexport.exact_check import noise_floor_bound
from convexport.inputs import InputSpec
from convexport.validate import Tolerances, compare_by_noise_floor, compare_models
from helpers import invoke


def conv_bn(opset: int, tamper: float = 0.0) -> onnx.ModelProto:
    """Conv -> BatchNormalization as TorchScript writes them at opset 13, `tamper` added to
    the output."""
    rng = np.random.default_rng(0)
    weights = {
        "w": rng.normal(size=(8, 3, 3, 3)), "s": rng.uniform(0.5, 1.5, 8), "b": rng.normal(size=8),
        "m": rng.normal(size=8), "v": rng.uniform(0.5, 2, 8),
    }  # fmt: skip
    initializers = [numpy_helper.from_array(value.astype(np.float32), name) for name, value in weights.items()]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["z" if tamper else "y"], name="bn"),
    ]
    if tamper:
        initializers.append(numpy_helper.from_array(np.array(tamper, np.float32), "t"))
        nodes.append(helper.make_node("Add", ["z", "t"], ["y"], name="tamper"))
    graph = helper.make_graph(
        nodes, "conv_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], initializers,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


INPUTS = [InputSpec("x", (1, 3, 16, 16))]


@pytest.mark.parametrize("opset", [9, 13, 17])
def test_a_tampered_conv_bn_fails_validate_at_every_opset(opset, tmp_path):
    onnx.save(conv_bn(opset), tmp_path / "orig.onnx")
    onnx.save(conv_bn(opset, tamper=0.05), tmp_path / "bad.onnx")
    result = invoke("validate", str(tmp_path / "orig.onnx"), str(tmp_path / "bad.onnx"))
    assert result.exit_code == 3, result.output


def test_the_original_own_error_at_opset_13_is_its_rounding(tmp_path):
    onnx.save(conv_bn(13), tmp_path / "orig.onnx")
    result = convexport.optimize(str(tmp_path / "orig.onnx"), output=tmp_path / "o.onnx", profile=False)
    validation = result.report["validation"]
    (output,) = validation["outputs"].values()
    assert validation["reference"] == "float64" and output["exact_error_original"] < 1e-4  # it was 2.46
    assert validation["reference_check"] == {"nodes_checked": 2, "disagreement": None}
    assert "suspect" not in validation.get("reference_note", "")


def without_our_batch_norm(monkeypatch):
    """The float64 path with ONNX's own BatchNormalization kernel: a reference known to be wrong
    below opset 14."""
    kernels = [kernel for kernel in float64.KERNELS if kernel.__name__ != "BatchNormalization"]
    monkeypatch.setattr(float64, "KERNELS", kernels)


def test_a_wrong_reference_is_named_and_the_stricter_check_refuses(monkeypatch):
    without_our_batch_norm(monkeypatch)
    result = compare_models(conv_bn(13), conv_bn(13, tamper=0.05), INPUTS)
    assert not result.passed  # the float64 bound alone (4 x 2.46) would have passed it
    assert "the float64 reference is suspect" in result.reference_note and "'bn' (BatchNormalization)" in (
        result.reference_note
    )
    check = result.to_report()["reference_check"]
    assert check["disagreement"]["node"] == "bn" and check["disagreement"]["difference"] > 0.1


def test_a_wrong_reference_still_passes_an_identical_model(monkeypatch):
    without_our_batch_norm(monkeypatch)
    result = compare_models(conv_bn(13), conv_bn(13), INPUTS)
    assert result.passed and "suspect" in result.reference_note
    (output,) = result.outputs.values()
    assert output.rtol == 1e-4  # judged by the float32 tolerance as well


def test_input_sets_without_a_reference_are_judged_by_the_noise_floor(monkeypatch):
    import convexport.exact_check as exact_check

    monkeypatch.setattr(exact_check, "_float64_runs", lambda evaluator, feeds, budget: [None] * len(feeds))
    result = compare_models(conv_bn(17), conv_bn(17), INPUTS, runs=3)
    assert result.passed and result.reference == "float64"
    assert "on 1 of 3 input sets" in result.reference_note and "noise floor" in result.reference_note


def test_the_noise_floor_bound_is_tighter_than_the_float32_tolerance():
    rng = np.random.default_rng(0)
    original = rng.normal(size=1000).astype(np.float32)
    own = 1e-7  # a well-conditioned model's own error
    bound = noise_floor_bound(original, own, "float32")
    assert bound < 1e-5  # the float32 tolerance, rtol 1e-4, would allow 1e-4 of the scale
    off = original + np.float32(3e-5)
    assert compare_by_noise_floor(original, off, own, Tolerances(), "y").mismatches == original.size
    assert compare_by_noise_floor(original, original.copy(), own, Tolerances(), "y").mismatches == 0
