"""export_model on an ONNX model: shape inference, skipped where the model is already fully
shaped (export._fully_shaped) because it would give the model back as it is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from convexport.load.export import export_model
from convexport.load.inputs import parse_input_spec
from convexport.load.model import LoadedModel
from convexport.load.routes import load_model
from helpers import make_model, tensor

SAMPLES = Path(__file__).resolve().parent.parent / "sample_models"


def loaded(model: onnx.ModelProto) -> LoadedModel:
    return load_model(model)


def inferred(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)


def conv_relu(batch=2) -> onnx.ModelProto:
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return make_model(nodes, [tensor("x", [batch, 3, 5, 5])], [tensor("y", None)],
                      {"w": np.ones([4, 3, 3, 3], np.float32)})


@pytest.fixture
def inference_counted(monkeypatch):
    calls = []
    real = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_a_fully_shaped_model_is_taken_as_it_is(inference_counted):
    model = inferred(conv_relu())
    inference_counted.clear()
    result = export_model(loaded(model))
    assert inference_counted == []
    assert result.model.SerializeToString() == inferred(model).SerializeToString()
    assert result.model is model       # no copy: nothing after export_model writes to it (test_robustness)


def test_sample_exports_come_out_as_inference_gives_them(inference_counted):
    import convexport

    exported = convexport.optimize(str(SAMPLES / "seed001_bottleneck3d.py"), write=False, validate=False,
                                   profile=False).original
    inference_counted.clear()
    result = export_model(loaded(exported))
    assert inference_counted == []
    assert result.model.SerializeToString() == inferred(exported).SerializeToString()


def without_value_info(model, name):
    kept = [value for value in model.graph.value_info if value.name != name]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    return model


def with_symbolic_dim(model):
    model.graph.value_info[0].type.tensor_type.shape.dim[0].dim_param = "N"
    return model


def without_element_type(model):
    model.graph.value_info[0].type.tensor_type.elem_type = 0
    return model


def with_unshaped_output(model):
    model.graph.output[0].type.tensor_type.ClearField("shape")
    return model


@pytest.mark.parametrize("damage", [lambda m: without_value_info(m, "c"), with_symbolic_dim, without_element_type,
                                    with_unshaped_output],
                         ids=["missing", "symbolic", "untyped", "unshaped-output"])
def test_inference_runs_where_a_shape_is_missing(inference_counted, damage):
    model = damage(inferred(conv_relu()))
    inference_counted.clear()
    result = export_model(loaded(model))
    assert inference_counted
    assert result.model.SerializeToString() == inferred(model).SerializeToString()


def test_inference_runs_after_the_inputs_change(inference_counted):
    model = inferred(conv_relu(batch=2))
    inference_counted.clear()
    result = export_model(loaded(model), [parse_input_spec("x:1x3x5x5")])
    assert inference_counted
    assert [d.dim_value for d in result.model.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 5, 5]
    export_model(loaded(model), dynamic_batch=True)
    export_model(loaded(model), freeze_input_defaults=True)
    assert len(inference_counted) == 3


def test_inference_runs_for_subgraphs(inference_counted):
    branch = helper.make_graph([helper.make_node("Relu", ["x"], ["o"])], "branch", [],
                               [helper.make_tensor_value_info("o", onnx.TensorProto.FLOAT, [2, 3])])
    model = make_model([helper.make_node("If", ["cond"], ["y"], name="if", then_branch=branch, else_branch=branch)],
                       [tensor("cond", [], onnx.TensorProto.BOOL), tensor("x", [2, 3])], [tensor("y", [2, 3])])
    model = inferred(model)
    inference_counted.clear()
    export_model(loaded(model))
    assert inference_counted
