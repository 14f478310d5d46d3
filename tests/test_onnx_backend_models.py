"""Every model of ONNX's own backend test data (shipped in the onnx package: opsets 6 to 9 and
IR version 3 among them, ResNet50, DenseNet121, Inception, VGG19, SqueezeNet, ShuffleNet, AlexNet
among the "light" zoo nets) is optimized and exact: converted to the opset the rules are
written for, its weights constants though IR 3 lists them as inputs, validated against the model
as given (ONNX Runtime, or ONNX's reference evaluator where ORT has no kernel for an old opset)
on made-up inputs and on its own test data, whose expected outputs the result matches too."""

from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import convexport
from convexport import ir
from convexport.load.onnx_route import MIN_OPSET
from helpers import run

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
MODELS = sorted(
    glob.glob(os.path.join(DATA, "pytorch-converted", "*", "model.onnx"))
    + glob.glob(os.path.join(DATA, "pytorch-operator", "*", "model.onnx"))
    + glob.glob(os.path.join(DATA, "simple", "*", "model.onnx"))
    + glob.glob(os.path.join(DATA, "light", "*.onnx"))
)


def tensors(paths: list[str]) -> list[np.ndarray]:
    arrays = []
    for path in paths:
        proto = onnx.TensorProto()
        with open(path, "rb") as stream:
            proto.ParseFromString(stream.read())
        arrays.append(numpy_helper.to_array(proto))
    return [a.astype(str) if a.dtype == object else a for a in arrays]


def its_test_data(path: str, model: onnx.ModelProto) -> tuple[dict, list[np.ndarray]] | None:
    """The model's first test data set as (feeds, expected outputs), or None."""
    folder = os.path.join(os.path.dirname(path), "test_data_set_0")
    if not os.path.isdir(folder):
        return None
    weights = {init.name for init in model.graph.initializer}
    names = [value.name for value in model.graph.input if value.name not in weights]
    feeds = dict(zip(names, tensors([os.path.join(folder, f"input_{i}.pb") for i in range(len(names))])))
    outputs = tensors(sorted(glob.glob(os.path.join(folder, "output_*.pb"))))
    return feeds, outputs


def runs_somewhere(path: str, feeds: dict | None) -> bool:
    """ORT runs the model on its test data, or has no kernel for the old opset (then ONNX's
    reference evaluator is the reference); False for a model neither can be asked to run here
    (string normalisation without the locale it names)."""
    try:
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as exc:
        return "NOT_IMPLEMENTED" in str(exc)
    try:
        if feeds is not None:
            session.run(None, feeds)
    except Exception:
        return False
    return True


@pytest.mark.long
@pytest.mark.parametrize("path", MODELS, ids=lambda p: os.path.relpath(p, DATA).removesuffix("/model.onnx"))
def test_every_backend_model_is_optimized_and_exact(path, tmp_path):
    model = onnx.load(path)
    data = its_test_data(path, model)
    if not runs_somewhere(path, data[0] if data else None):
        pytest.skip("neither ONNX Runtime nor the reference evaluator runs it here")
    npz = None
    if data is not None:
        npz = tmp_path / "data.npz"
        np.savez(npz, **data[0])
    result = convexport.optimize(path, output=tmp_path / "out.onnx", profile=False, input_data=npz)
    assert result.report["validation"]["passed"]
    written = onnx.load(tmp_path / "out.onnx")
    onnx.checker.check_model(written, full_check=True)
    assert ir.onnx_opset(written) >= MIN_OPSET
    if data is not None:
        feeds, expected = data
        for got, want in zip(run(written, feeds), expected):
            if want.dtype.kind in "USO":
                assert (got == want).all()
            else:
                np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


@pytest.mark.long
def test_ir3_weights_are_folded_and_the_conversion_is_said():
    """(Validated on its test data by test_every_backend_model_is_optimized_and_exact.)"""
    path = os.path.join(DATA, "light", "light_resnet50.onnx")
    result = convexport.optimize(path, write=False, profile=False, validate=False)
    report = result.report
    assert report["before"]["ops"]["BatchNormalization"] == 53 and "BatchNormalization" not in report["after"]["ops"]
    assert report["conversions"][0].startswith("opset 9 -> 18")
    assert "IR version 3" in report["conversions"][1]
