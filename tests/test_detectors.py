"""A YOLO-like detector (tests/fixtures/detectors.py) optimized and written with default
validation, folded like ultralytics' fuse(); inputs described by a range (`x:...:0..1`) or
given instead of random draws (`--input-data`) (issue 39, item 4)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import adapters
import convexport
import detectors
from convexport.errors import ConvexportError
from convexport.load.inputs import parse_input_spec, random_inputs
from helpers import assert_user_error, invoke

FACTORY = f"{Path(detectors.__file__)}:tiny_yolo"


@pytest.mark.parametrize("route", ["dynamo", "torchscript"])
def test_a_detector_is_written_with_default_validation_and_folded_like_fuse(route, tmp_path):
    module = detectors.tiny_yolo()
    example = torch.rand(1, 3, 64, 64)
    model = adapters.exported(module, example, route)
    name = model.graph.input[0].name
    result = convexport.optimize(model, inputs=[f"{name}:1x3x64x64"], output=tmp_path / "yolo.onnx", profile=False)
    validation = result.report["validation"]
    assert validation["passed"] and (tmp_path / "yolo.onnx").exists()
    # every input set judged against float64, by a reference that agrees with ONNX Runtime node by node
    assert validation["reference"] == "float64" and "reference_note" not in validation
    assert validation["reference_check"]["disagreement"] is None and validation["reference_check"]["nodes_checked"] > 50
    hand = adapters.exported(detectors.fused(module), example, route)
    convs = [Counter(node.op_type for node in graph.node)["Conv"] for graph in (result.model.graph, hand.graph)]
    assert convs[0] == convs[1] == 19


def test_a_range_draws_the_inputs_in_it():
    feeds = random_inputs([parse_input_spec("x:4096:0..1"), parse_input_spec("i:4096:int64:-2..3")], seed=0)
    assert 0 <= feeds["x"].min() and feeds["x"].max() <= 1 and feeds["x"].dtype == np.float32
    assert set(np.unique(feeds["i"])) == {-2, -1, 0, 1, 2, 3}


@pytest.mark.parametrize("text, wanted", [
    ("x:1x3x8x8:float32:0..1", ("float32", (0.0, 1.0))),
    ("x:1x3x8x8:0..255", ("float32", (0.0, 255.0))),
    ("x:1x3x8x8:float16:-1..1", ("float16", (-1.0, 1.0))),
    ("x:1x3x8x8", ("float32", None)),
])
def test_input_ranges_parse(text, wanted):
    spec = parse_input_spec(text)
    assert (spec.dtype, spec.value_range) == wanted
    assert parse_input_spec(str(spec)) == spec


@pytest.mark.parametrize("text, fragment", [
    ("x:1:1..0", "needs finite LOW < HIGH"),
    ("x:1:0..inf", "needs finite LOW < HIGH"),
    ("x:1:a..b", "is not LOW..HIGH"),
    ("x:1:bool:0..1", "a bool input takes no range"),
])
def test_a_bad_range_is_one_line(text, fragment, tmp_path):
    assert_user_error(invoke("optimize", FACTORY, "--input", text, "-o", tmp_path / "y.onnx"), fragment)


def test_the_report_says_the_range_validated_in(tmp_path):
    result = invoke("optimize", FACTORY, "--input", "x:1x3x64x64:0..1", "--no-profile", "-o", tmp_path / "y.onnx",
                    "--report", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["inputs"] == ["x:1x3x64x64:float32:0..1"]
    assert report["validation"]["passed"] and report["validation"]["runs"] == 3


def test_input_data_replaces_the_random_inputs(tmp_path):
    np.savez(tmp_path / "images.npz", x=np.random.default_rng(0).random((1, 3, 64, 64), np.float32))
    result = invoke("optimize", FACTORY, "--input", "x:1x3x64x64", "--input-data", tmp_path / "images.npz",
                    "--no-profile", "-o", tmp_path / "y.onnx", "--report", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["validation"]["runs"] == 1 and "replaces them" in report["made_up_inputs"]
    assert "validation: passed over 1 run against" in result.stdout


def test_inputs_and_input_data_together_are_refused(tmp_path):
    np.savez(tmp_path / "images.npz", x=np.zeros((1, 3, 64, 64), np.float32))
    result = invoke("optimize", FACTORY, "--inputs", tmp_path / "images.npz", "--input-data", tmp_path / "images.npz",
                    "-o", tmp_path / "y.onnx")
    assert_user_error(result, "--inputs and --input-data: give one")


def test_no_made_up_inputs_needs_input_data():
    with pytest.raises(ConvexportError, match="made_up_inputs=False needs input_data"):
        convexport.optimize(detectors.tiny_yolo(), inputs=["x:1x3x64x64"], write=False, made_up_inputs=False)
