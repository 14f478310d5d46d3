"""Every MODEL kind through optimize: the output equals torch at 1e-5; the report's fields."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from rich.console import Console

import convexport
from convexport.ir.large import _data_bytes as held_bytes
from convexport.report.sections import print_optimize_summary, render
from helpers import op_counts, run
from small_net import example_inputs, make_module


def torch_output() -> np.ndarray:
    with torch.no_grad():
        return make_module()(*example_inputs()).numpy()


def check_against_torch(path) -> onnx.ModelProto:
    model = onnx.load(str(path))
    (actual,) = run(model, {model.graph.input[0].name: example_inputs()[0].numpy()})
    np.testing.assert_allclose(actual, torch_output(), rtol=1e-5, atol=1e-5)
    return model


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    module, inputs = make_module(), example_inputs()
    torch.jit.save(torch.jit.trace(module, inputs), folder / "net.pt")
    torch.export.save(torch.export.export(module, inputs), folder / "net.pt2")
    torch.save(module, folder / "pickled.pth")
    convexport.export_only(str(folder / "net.pt"), folder / "net.onnx", inputs=["x:1x3x16x16"])
    # Both exporters fold eval-mode BatchNorm themselves; keep it, as other producers do.
    torch.onnx.export(module, inputs, str(folder / "with_bn.onnx"), dynamo=False, opset_version=18,
                      training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False, input_names=["x"])
    return folder


def optimize_quietly(model, tmp_path, **kwargs):
    return convexport.optimize(model, output=tmp_path / "out.onnx", profile=False, **kwargs)


def test_factory_file(small_net_path, tmp_path):
    result = optimize_quietly(f"{small_net_path}:build", tmp_path)
    optimized = check_against_torch(result.output)
    assert "BatchNormalization" not in op_counts(optimized)
    assert {"Dropout", "Identity"}.isdisjoint(op_counts(optimized))
    assert result.report["validation"]["passed"]


def test_factory_module_only_needs_example_inputs_from_the_file(small_net_path, tmp_path):
    result = optimize_quietly(f"{small_net_path}:build_module_only", tmp_path)
    check_against_torch(result.output)


def test_default_factory_is_build(small_net_path, tmp_path):
    check_against_torch(optimize_quietly(str(small_net_path), tmp_path).output)


def test_package_module_callable(tmp_path):
    check_against_torch(optimize_quietly("small_net:build", tmp_path).output)


def test_torchscript_archive_with_input(model_files, tmp_path):
    result = optimize_quietly(str(model_files / "net.pt"), tmp_path, inputs=["x:1x3x16x16"])
    assert result.report["exporter"] == "torchscript"
    check_against_torch(result.output)


def test_exported_program_takes_its_traced_shapes(model_files, tmp_path):
    result = optimize_quietly(str(model_files / "net.pt2"), tmp_path)
    assert result.report["exporter"] == "dynamo"
    check_against_torch(result.output)


def test_pickled_module_with_trust(model_files, tmp_path):
    result = optimize_quietly(str(model_files / "pickled.pth"), tmp_path, trust_pickle=True, inputs=["x:1x3x16x16"])
    check_against_torch(result.output)


def test_onnx_file_is_never_modified(model_files, tmp_path):
    source = model_files / "net.onnx"
    before = source.read_bytes()
    result = optimize_quietly(str(source), tmp_path)
    assert source.read_bytes() == before
    check_against_torch(result.output)


def test_onnx_with_batchnorm_folds_to_two_convs(model_files, tmp_path):
    result = optimize_quietly(str(model_files / "with_bn.onnx"), tmp_path)
    optimized = check_against_torch(result.output)
    assert op_counts(optimized) == {"Conv": 2, "Relu": 1}
    applied = [entry["rule"] for entry in result.report["rewrites"]]
    assert applied.count("conv-batchnorm") == 2 and "conv-conv" in applied


def test_default_output_beside_the_model(model_files):
    source = model_files / "net.onnx"
    result = convexport.optimize(str(source), profile=False)
    assert result.output == model_files / "net.opt.onnx" and result.output.exists()


def test_dynamic_batch(small_net_path, tmp_path):
    result = optimize_quietly(f"{small_net_path}:build", tmp_path, dynamic_batch=True)
    model = onnx.load(str(result.output))
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    batch = torch.randn(3, 3, 16, 16)
    (actual,) = run(model, {model.graph.input[0].name: batch.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(actual, make_module()(batch).numpy(), rtol=1e-5, atol=1e-5)


def test_named_dynamic_dim_in_input_spec(model_files, tmp_path):
    result = optimize_quietly(str(model_files / "net.pt"), tmp_path, inputs=["x:Nx3x16x16"])
    dim = onnx.load(str(result.output)).graph.input[0].type.tensor_type.shape.dim[0]
    assert dim.dim_param


def test_nn_module_object_through_the_api(tmp_path):
    result = convexport.optimize(make_module(), inputs=["x:1x3x16x16"], output=tmp_path / "m.onnx", profile=False)
    assert result.report["before"]["ops"]["Conv"] == 3 and result.report["after"]["ops"]["Conv"] == 2


def test_report_fields(small_net_path, tmp_path):
    result = convexport.optimize(f"{small_net_path}:build", output=tmp_path / "o.onnx", device="cpu")
    report = json.loads(json.dumps(result.report))
    for key in ("convexport_version", "model", "output", "before", "after", "rewrites", "skipped",
                "validation", "profile"):
        assert key in report
    for side in ("before", "after"):
        assert set(report[side]) >= {"nodes", "ops", "flops", "params"}
    assert report["before"]["nodes"] > report["after"]["nodes"]
    assert report["after"]["flops"] < report["before"]["flops"]
    assert report["after"]["params"] < report["before"]["params"]
    rules = {entry["rule"] for entry in report["rewrites"]}
    assert rules >= {"conv-conv"}
    for entry in report["rewrites"]:
        assert set(entry) >= {"rule", "file", "nodes", "reason"} and entry["nodes"]
    assert report["validation"]["passed"] and report["validation"]["runs"] == 3
    for stats in report["validation"]["outputs"].values():
        assert 0 <= stats["max_abs"] < 1e-4
    profile = report["profile"]
    assert profile["device"] == "cpu" and profile["provider"] == "CPUExecutionProvider"
    assert profile["before"]["latency_ms"]["median"] > 0 and profile["after"]["latency_ms"]["p90"] > 0
    assert profile["speedup"] > 0
    assert report["exporter"] == "dynamo" and report["export_warnings"] == []


def test_a_traced_branch_on_a_tensor_value_is_reported(tmp_path):
    """torch.export refuses data-dependent control flow, the TorchScript tracer then keeps only
    the branch the example input took and warns: the report and the summary carry the warning."""
    path = tmp_path / "branchy.py"
    path.write_text("import torch\n\nclass Branchy(torch.nn.Module):\n    def forward(self, x):\n"
                    "        return x.relu() if x.sum() > 0 else x\n\n"
                    "def build():\n    return Branchy(), (torch.ones(1, 3),)\n")
    report = convexport.optimize(str(path), write=False, profile=False).report
    assert report["exporter"] == "torchscript"
    assert len(report["export_warnings"]) == 1 and "might not generalize" in report["export_warnings"][0]
    console = Console(record=True, width=200)
    print_optimize_summary(report, console)
    assert "the TorchScript tracer warned: Converting a tensor to a Python boolean" in console.export_text()
    assert "the TorchScript tracer warned: Converting a tensor to a Python boolean" in render(report)
    warned = []
    convexport.export_only(str(path), tmp_path / "branchy.onnx", warn=warned.append)
    assert warned == report["export_warnings"] and (tmp_path / "branchy.onnx").exists()


def test_shape_inference_runs_without_the_weights_and_gives_them_back(monkeypatch):
    """infer_shapes hands ONNX a skeleton (weights of 1 KiB or more without data): the same
    shapes as inference on the whole model, a small shape initializer still read (data_prop
    through Reshape), and every weight back in the result, byte for byte."""
    from onnx import helper, numpy_helper

    from convexport.ir import infer_shapes

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal([16, 8, 3, 3]).astype(np.float32), "w")
    target = numpy_helper.from_array(np.array([2, -1], np.int64), "target")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Reshape", ["c", "target"], ["y"])],
        "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8, 5, 5])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], [weight, target])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    whole = onnx.shape_inference.infer_shapes(model, data_prop=True)
    seen = []
    real = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes",
                        lambda light, *args, **kwargs: seen.append(light) or real(light, *args, **kwargs))
    inferred = infer_shapes(model, "test")
    assert not seen[0].graph.initializer[0].raw_data and seen[0].graph.initializer[1].raw_data
    assert [v.SerializeToString() for v in inferred.graph.value_info] == [v.SerializeToString() for v in whole.graph.value_info]
    assert [d.dim_value for d in inferred.graph.output[0].type.tensor_type.shape.dim] == [2, 16 * 5 * 5]   # [2, 16, 5, 5] as [2, -1]
    assert [t.SerializeToString() for t in inferred.graph.initializer] == [weight.SerializeToString(), target.SerializeToString()]


def test_large_weights_go_to_external_data(model_files, tmp_path, monkeypatch):
    """With the thresholds lowered, a small model takes the path of one over 2 GiB: sessions
    from external-data files, shape inference on a skeleton, no SerializeToString."""
    monkeypatch.setattr("convexport.ir.large.EXTERNAL_DATA_THRESHOLD", 1000)
    monkeypatch.setattr("convexport.ir.large.EXTERNAL_TENSOR_MIN_BYTES", 100)
    serialize = onnx.ModelProto.SerializeToString

    def only_small(model, *args, **kwargs):
        held = sum(map(held_bytes, model.graph.initializer))  # (a skeleton names its weights, holds none)
        assert held < 1000, "a model holding weights over the threshold was serialised"
        return serialize(model, *args, **kwargs)
    monkeypatch.setattr(onnx.ModelProto, "SerializeToString", only_small)
    result = convexport.optimize(str(model_files / "with_bn.onnx"), output=tmp_path / "out.onnx")
    monkeypatch.undo()
    assert result.report["validation"]["passed"] and result.report["profile"]["speedup"] > 0
    weights = [init for init in result.model.graph.initializer if init.dims and init.dims[0] == 8]
    locations = {entry.value for init in weights for entry in init.external_data if entry.key == "location"}
    data = result.output_weights  # named as onnx.load(OUT, load_external_data=False) gives it
    assert weights and locations == {data.name} and data.parent == tmp_path
    assert data.exists() and data.stat().st_size >= 864          # the folded 8x3x3x3 float weight
    assert data.stat().st_mode & 0o044 == 0o044                    # readable like any output
    check_against_torch(result.output)            # onnx.load reads the data file back
    (tmp_path / "again").mkdir()
    again = convexport.optimize(str(result.output), output=tmp_path / "again" / "o.onnx", profile=False)
    assert again.report["validation"]["passed"]


def test_an_opset_below_13_is_converted_and_said(tmp_path):
    from onnx import helper

    from helpers import tensor
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [tensor("x", [2])],
                                                [tensor("y", [2])]), opset_imports=[helper.make_opsetid("", 11)],
                              ir_version=7)
    path = tmp_path / "old.onnx"
    onnx.save(model, str(path))
    result = convexport.optimize(str(path), profile=False, output=tmp_path / "new.onnx")
    assert result.report["conversions"] == ["opset 11 -> 18 (onnx's version converter)", "IR version 7 -> 8"]
    assert result.report["validation"]["passed"] and result.original.opset_import[0].version == 11
    assert onnx.load(tmp_path / "new.onnx").opset_import[0].version == 18




class GeluNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.nn.functional.gelu(self.conv(x))


@pytest.mark.parametrize("route", ["module", "torchscript"])
def test_the_default_opset_is_the_installed_exporters(route, tmp_path):
    from convexport.load.export import exporter_default_opset

    model, inputs = GeluNet().eval(), (torch.randn(1, 3, 8, 8),)
    if route == "torchscript":
        path = tmp_path / "net.pt"
        torch.jit.trace(model, inputs).save(str(path))
        model, inputs = str(path), ["x:1x3x8x8"]
    default = convexport.optimize(model, inputs=inputs, write=False, profile=False)
    assert default.report["opset"] == exporter_default_opset() == torch.onnx._constants.ONNX_DEFAULT_OPSET
    if exporter_default_opset() >= 20:  # Gelu is an ONNX op from opset 20
        assert op_counts(default.model).get("Gelu") == 1 and "Erf" not in op_counts(default.model)
    older = convexport.optimize(model, inputs=inputs, opset=18, write=False, profile=False)
    assert older.report["opset"] == 18 and "Gelu" not in op_counts(older.model)
