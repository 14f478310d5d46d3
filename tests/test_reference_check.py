"""The float64 reference that judges validation is itself checked (issue 48): ONNX's opset-13
BatchNormalization no longer inflates the original's "own error"; a reference that disagrees
with ONNX Runtime node by node is named and the stricter check applies; input sets without a
reference are judged by the noise floor measured on those with one."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import convexport
from convexport.validate import float64
from convexport.validate.exact_check import noise_floor_bound
from convexport.load.inputs import InputSets, InputSpec
from convexport.validate.results import Tolerances
from convexport.validate.judges import compare_by_noise_floor
from convexport.validate.compare import compare_models
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
    result = compare_models(conv_bn(13), conv_bn(13, tamper=0.05), InputSets(INPUTS))
    assert not result.passed  # the float64 bound alone (4 x 2.46) would have passed it
    assert "the float64 reference is suspect" in result.reference_note and "'bn' (BatchNormalization)" in (
        result.reference_note
    )
    check = result.to_report()["reference_check"]
    assert check["disagreement"]["node"] == "bn" and check["disagreement"]["difference"] > 0.1


def test_a_wrong_reference_still_passes_an_identical_model(monkeypatch):
    without_our_batch_norm(monkeypatch)
    result = compare_models(conv_bn(13), conv_bn(13), InputSets(INPUTS))
    assert result.passed and "suspect" in result.reference_note
    (output,) = result.outputs.values()
    assert output.rtol == 1e-4  # judged by the float32 tolerance as well


def test_input_sets_without_a_reference_are_judged_by_the_noise_floor(monkeypatch):
    import convexport.validate.exact_check as exact_check

    monkeypatch.setattr(exact_check, "_float64_runs", lambda evaluator, feeds, budget: [None] * len(feeds))
    result = compare_models(conv_bn(17), conv_bn(17), InputSets(INPUTS, 3))
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


# ---------------------------------------------------------------------------------------------
# A torch source's own float64 run


class ConvBNNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 4)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        return self.fc(self.bn(self.conv(x)).mean((2, 3)))


class Branchy(torch.nn.Module):
    """A branch on the input's value: torch.export refuses it and the TorchScript tracer keeps
    the branch its example took, so the ONNX graph is not the model for every input."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.conv(x)
        if x[0, 0, 0, 0] > 0:
            return y * 2.0
        return y - 1.0


def test_a_torch_run_not_compared_says_why_in_a_report_the_schema_accepts(monkeypatch):
    """Where torch's own run cannot be the reference (TorchUnavailable: the graph's inputs are not
    the arguments, too many weights, no float64 copy), export_check is the note alone; the shipped
    schema required its comparison's fields (the autouse schema check fails such a report)."""
    from convexport.stages import load
    from convexport.validate.torch_reference import TorchUnavailable

    monkeypatch.setattr(load, "torch_float64", lambda *args: TorchUnavailable("the reason"))
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)).eval()
    validation = convexport.optimize(module, inputs=["x:1x3x8x8"], write=False, profile=False).report["validation"]
    assert validation["passed"] and validation["export_check"] == {"note": "the reason"}


@pytest.mark.parametrize("slowdown, source", [(None, "torch"), (1e9, "onnx")])
def test_a_torch_run_estimated_over_its_time_is_not_made(slowdown, source, monkeypatch, tmp_path):
    """torch's float64 convolution has no fast path for a large kernel (seed 003's 135x135 took
    24 s a run, the ONNX graph's through the FFT 1 s): where torch's first run is estimated over
    what the reference may take, the ONNX graph's float64 run is the reference, on every set."""
    from convexport.validate import torch_reference

    if slowdown is not None:  # as if torch's large-kernel convolution were this much slower
        monkeypatch.setattr(torch_reference, "LARGE_KERNEL_SLOWDOWN", slowdown)
    module = torch.nn.Sequential(torch.nn.Conv2d(1, 3, 11, padding=5), torch.nn.Conv2d(3, 2, 1)).eval()
    validation = convexport.optimize(module, inputs=["x:1x1x24x24"], write=False, profile=False).report["validation"]
    assert validation["passed"] and validation["reference"] == "float64"
    assert validation["reference_source"] == source and "reference_note" not in validation


@pytest.mark.parametrize("route", ["module", "torchscript", "exported_program"])
def test_a_torch_model_is_judged_against_its_own_float64_run(route, tmp_path):
    module = ConvBNNet().eval()
    example = torch.randn(1, 3, 8, 8)
    if route == "torchscript":
        torch.jit.save(torch.jit.trace(module, example), tmp_path / "m.pt")
        source, inputs = str(tmp_path / "m.pt"), ["x:1x3x8x8"]
    elif route == "exported_program":
        torch.export.save(torch.export.export(module, (example,)), tmp_path / "m.pt2")
        source, inputs = str(tmp_path / "m.pt2"), None
    else:
        source, inputs = module, ["x:1x3x8x8"]
    result = convexport.optimize(source, inputs=inputs, output=tmp_path / "o.onnx", profile=False)
    validation = result.report["validation"]
    assert validation["passed"] and validation["reference_source"] == "torch", validation.get("export_check")
    assert validation["export_check"]["agrees"] is True
    assert validation["export_check"]["max_abs_difference"] <= validation["export_check"]["bound"]


def test_an_exporter_that_changed_the_model_is_caught_and_the_rewrite_judged_against_the_graph(tmp_path):
    result = convexport.optimize(Branchy().eval(), inputs=["x:1x3x4x4"], output=tmp_path / "o.onnx", profile=False)
    validation = result.report["validation"]
    assert validation["passed"]  # the rewrite computes the ONNX graph it was given
    assert validation["export_check"]["agrees"] is False
    from convexport.report.words import export_check_line

    assert "the exporter changed it" in export_check_line(validation)


def test_the_user_module_is_left_as_it_was(tmp_path):
    module = ConvBNNet().eval()
    before = {name: tensor.clone() for name, tensor in module.state_dict().items()}
    convexport.optimize(module, inputs=["x:1x3x8x8"], output=tmp_path / "o.onnx", profile=False)
    assert all(tensor.dtype != torch.float64 for tensor in module.state_dict().values())
    assert all(torch.equal(before[name], tensor) for name, tensor in module.state_dict().items())


def _difference_of_two_products(fold: bool) -> onnx.ModelProto:
    """x W - x W' with W' within 1e-3 of W (a difference of large terms: its float32 error is
    large against its result), or the same folded, x (W - W'): what a rewrite makes of it."""
    rng = np.random.default_rng(4)
    w = rng.normal(size=(256, 64)).astype(np.float32)
    w2 = (w + rng.normal(scale=1e-3, size=w.shape)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 256])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64])
    if fold:
        nodes = [helper.make_node("MatMul", ["x", "d"], ["y"])]
        weights = [numpy_helper.from_array((w.astype(np.float64) - w2).astype(np.float32), "d")]
    else:
        nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("MatMul", ["x", "w2"], ["b"]),
                 helper.make_node("Sub", ["a", "b"], ["y"])]  # fmt: skip
        weights = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w2, "w2")]
    graph = helper.make_graph(nodes, "g", [x], [y], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_an_input_set_without_a_reference_is_judged_by_the_originals_noise_there(monkeypatch):
    """The float64 result on the first set only; the second set's input 100x larger, so the
    original's own float32 error there is 100x what the first set measured. The fold, nearer
    the exact result than the original on both, is judged there by the original's float32
    noise on that set (its run summed in another order), not by the first set's alone, which
    refused it."""
    import convexport.validate.exact_check as exact_check

    monkeypatch.setattr(exact_check, "_float64_runs", lambda evaluator, feeds, budget: [None] * len(feeds))
    loud = {"x": (np.random.default_rng(9).normal(size=(8, 256)) * 100).astype(np.float32)}
    result = compare_models(_difference_of_two_products(False), _difference_of_two_products(True),
                            InputSets([InputSpec("x", (8, 256))], 1, [loud]))  # fmt: skip
    assert "on 1 of 2 input sets" in result.reference_note
    assert result.passed, result.summary()
    # and a wrong fold still fails on that set
    wrong = _difference_of_two_products(True)
    d = numpy_helper.to_array(wrong.graph.initializer[0])
    wrong.graph.initializer[0].CopyFrom(numpy_helper.from_array(d * np.float32(1.01), "d"))
    assert not compare_models(_difference_of_two_products(False), wrong,
                              InputSets([InputSpec("x", (8, 256))], 1, [loud])).passed  # fmt: skip
