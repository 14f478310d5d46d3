"""Constant folding before the rules (issue 22, item 1): a graph folds the same from each
export route, what depends on the inputs' values or overrides stays, large results stay."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from torch import nn
from torch.nn import functional as F

import convexport
from convexport import ir
from helpers import make_model, op_counts, tensor


class PaddedRepBlock(nn.Module):
    """A RepVGG-style block whose 3x3 branch pads with F.pad: 3x3 conv-BN + 1x1 conv-BN + BN skip."""

    def __init__(self, channels=8):
        super().__init__()
        self.dense = nn.Sequential(nn.Conv2d(channels, channels, 3, bias=False), nn.BatchNorm2d(channels))
        self.point = nn.Sequential(nn.Conv2d(channels, channels, 1, bias=False), nn.BatchNorm2d(channels))
        self.skip = nn.BatchNorm2d(channels)
        for module in self.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-1, 1)
                module.running_var.uniform_(0.5, 2)
        self.eval()

    def forward(self, x):
        return torch.relu(self.dense(F.pad(x, (1, 1, 1, 1))) + self.point(x) + self.skip(x))


def exported(route: str) -> onnx.ModelProto:
    torch.manual_seed(0)
    module, args = PaddedRepBlock(), (torch.randn(1, 8, 10, 10),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if route.startswith("dynamo"):
            return torch.onnx.export(module, args, dynamo=True, optimize=route == "dynamo", verbose=False).model_proto
        buffer = io.BytesIO()
        torch.onnx.export(module, args, buffer, dynamo=False, opset_version=18,
                          do_constant_folding=route == "torchscript", training=torch.onnx.TrainingMode.EVAL)
    return onnx.load_from_string(buffer.getvalue())


@pytest.mark.parametrize("route", ["dynamo", "dynamo-unoptimized", "torchscript", "torchscript-unfolded"])
def test_every_export_route_folds_to_one_conv(route):
    model = exported(route)
    before = model.SerializeToString()
    result = convexport.optimize(model, write=False, profile=False)
    assert result.report["validation"]["passed"]
    assert op_counts(result.model) == {"Conv": 1, "Relu": 1}, (route, result.report["constant_folding"])
    assert model.SerializeToString() == before


def test_the_model_folded_is_not_changed():
    """onnx-ir holds the model's tensors without copying them: lifting a Constant node's tensor
    to an initializer named that tensor in the caller's model too (a tensor without a name had
    one after), and a node moved to the hidden domain and back had its domain field written."""
    shape = helper.make_tensor("", onnx.TensorProto.INT64, [2], [4, 6])
    shape.ClearField("name")
    nodes = [
        helper.make_node("Constant", [], ["shape"], value=shape),
        helper.make_node("Reshape", ["x", "shape"], ["h"]),
        helper.make_node("Relu", ["h"], ["y"]),
    ]
    model = make_model(nodes, [tensor("x", [2, 3, 4])], [tensor("y", [4, 6])])
    before = model.SerializeToString()
    folded = ir.fold_constants(model, keep=frozenset({"Reshape"} | {node.name for node in model.graph.node}))
    assert folded is not model and not any(node.op_type == "Constant" for node in folded.graph.node)
    assert model.SerializeToString() == before
    convexport.optimize(model, write=False, profile=False)
    assert model.SerializeToString() == before


def test_nothing_to_fold_gives_the_model_itself():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [1, 4])], [tensor("y", [1, 4])])
    assert ir.fold_constants(model) is model


def test_a_shape_read_from_an_input_folds_its_values_do_not():
    """Shape(x) of a static input is a constant; x + 1 is not."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Cast", ["s"], ["sf"], to=1),
             helper.make_node("ReduceSum", ["sf"], ["total"], keepdims=0),
             helper.make_node("Add", ["x", "total"], ["y"])]
    model = make_model(nodes, [tensor("x", [2, 3])], [tensor("y", [2, 3])])
    folded = ir.fold_constants(model)
    assert op_counts(folded) == {"Add": 1}
    x = np.ones([2, 3], np.float32)
    from helpers import run

    np.testing.assert_array_equal(run(folded, {"x": x})[0], run(model, {"x": x})[0])


def test_an_initializer_the_caller_may_override_is_not_folded():
    w = numpy_helper.from_array(np.ones([4], np.float32), "w")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["w", "two"], ["w2"]), helper.make_node("Add", ["x", "w2"], ["y"])], "g",
        [tensor("x", [4]), tensor("w", [4])], [tensor("y", [4])], [w, two])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    assert ir.fold_constants(model) is model


def test_a_result_over_the_size_limit_stays_computed(monkeypatch):
    """A Tile of a small constant would become a large weight: over the limit, it stays a Tile."""
    monkeypatch.setattr("convexport.ir.folding.FOLD_LIMIT_ELEMENTS", 100)
    small = numpy_helper.from_array(np.ones([1, 1], np.float32), "small")
    repeats = numpy_helper.from_array(np.array([64, 64], np.int64), "repeats")
    nodes = [helper.make_node("Tile", ["small", "repeats"], ["t"]), helper.make_node("MatMul", ["x", "t"], ["y"])]
    graph = helper.make_graph(nodes, "g", [tensor("x", [1, 64])], [tensor("y", [1, 64])], [small, repeats])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    assert "Tile" in op_counts(ir.fold_constants(model))
    monkeypatch.setattr("convexport.ir.folding.FOLD_LIMIT_ELEMENTS", 1 << 20)
    assert "Tile" not in op_counts(ir.fold_constants(model))


@pytest.mark.parametrize("option", [["--input", "x:2x3x8x8"], ["--dynamic-batch"]])
def test_new_input_dims_on_an_onnx_model_give_outputs_of_the_new_dims(tmp_path, option):
    """The declared output shapes were those of the old inputs: inferred again, the model
    passes the checker's full check and its output follows the input."""
    from typer.testing import CliRunner

    from convexport.cli import app
    from test_hostile import conv_bn

    onnx.save(conv_bn(), tmp_path / "m.onnx")
    result = CliRunner().invoke(app, ["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"),
                                      "--no-profile", *option])
    assert result.exit_code == 0, result.output
    out = onnx.load(tmp_path / "o.onnx")
    onnx.checker.check_model(out, full_check=True)
    batch = out.graph.output[0].type.tensor_type.shape.dim[0]
    assert (batch.dim_value == 2) if option[0] == "--input" else (batch.dim_param and not batch.dim_value)


def test_a_dynamic_batch_asked_of_a_pt2_program_is_refused(tmp_path):
    module = nn.Conv2d(3, 4, 1).eval()
    torch.export.save(torch.export.export(module, (torch.randn(1, 3, 4, 4),)), tmp_path / "m.pt2")
    with pytest.raises(convexport.ConvexportError, match="dims are fixed when it is exported"):
        convexport.optimize(str(tmp_path / "m.pt2"), dynamic_batch=True, write=False)


def test_a_node_a_pass_leaves_reading_only_constants_is_folded_before_the_next_pass():
    """Conv -> Mul(h, Div(k1, Identity(k2))): drop-identity's pass leaves Div reading two
    constants; folded between the passes, conv-mul folds the Mul into the Conv in the next."""
    from graphs import rewrite

    x, w = tensor("x", [1, 2, 5, 5]), np.random.default_rng(0).standard_normal([3, 2, 3, 3]).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1]),
             helper.make_node("Identity", ["k2"], ["k2_copy"]),
             helper.make_node("Div", ["k1", "k2_copy"], ["k"]),
             helper.make_node("Mul", ["h", "k"], ["y"])]
    k1, k2 = np.full([3, 1, 1], 3.0, np.float32), np.full([3, 1, 1], 2.0, np.float32)
    model = make_model(nodes, [x], [tensor("y", None)], {"w": w, "k1": k1, "k2": k2})
    outcome = rewrite(model, "all")
    assert op_counts(outcome.model) == {"Conv": 1} and outcome.folded == 1
    feeds = {"x": np.random.default_rng(1).standard_normal([1, 2, 5, 5]).astype(np.float32)}
    from helpers import run

    np.testing.assert_allclose(run(outcome.model, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-6)


def test_a_node_of_constants_folded_between_passes_may_be_read_inside_a_subgraph():
    """c = Add(k1, Identity(k2)) read by an If branch: after drop-identity, c is computed and
    the branch reads the constant; the model stays valid and computes the same."""
    from graphs import rewrite
    from helpers import run

    then = helper.make_graph([helper.make_node("Mul", ["x", "c"], ["yt"])], "then", [], [tensor("yt", [2])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["ye"])], "else", [], [tensor("ye", [2])])
    nodes = [helper.make_node("Identity", ["k2"], ["k2_copy"]), helper.make_node("Add", ["k1", "k2_copy"], ["c"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)]
    model = make_model(nodes, [tensor("x", [2]), tensor("cond", [], onnx.TensorProto.BOOL)], [tensor("y", [2])],
                       {"k1": np.ones(2, np.float32), "k2": np.full(2, 2.0, np.float32)})
    outcome = rewrite(model, "all")
    assert outcome.folded == 1 and op_counts(outcome.model) == {"If": 1}
    onnx.checker.check_model(outcome.model, full_check=True)
    feeds = {"x": np.array([1.0, -2.0], np.float32), "cond": np.array(True)}
    np.testing.assert_array_equal(run(outcome.model, feeds)[0], run(model, feeds)[0])
