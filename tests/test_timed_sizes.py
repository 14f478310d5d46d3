"""The sizes the profile times a model at where it leaves dims dynamic (profile/timed_sizes.py): a
transformer's made-up sequence of one token measured ONNX Runtime's per-node cost, and the
verdict held only there (optimum's wav2vec2: "faster 1.07x" at 40 samples, 0.78x at 2 x 1600)."""

from __future__ import annotations

import json
import time

import numpy as np
from onnx import TensorProto, helper
from typer.testing import CliRunner

from convexport.profile import timed_sizes
from convexport.cli import app
from convexport.load.inputs import InputSpec
from helpers import make_model, tensor


def specs(*shapes) -> list[InputSpec]:
    return [InputSpec(f"x{i}", tuple(shape)) for i, shape in enumerate(shapes)]


def test_the_batch_is_a_dim_only_ever_first():
    graph = specs(("batch", "seq"), ("batch", 2, "past", 16), ("n", 3))
    assert timed_sizes.batch_dims(graph) == {"batch", "n"}
    assert timed_sizes.batch_dims(specs(("seq", 4), (2, "seq"))) == set()


def test_dims_grow_together_the_batch_stays_and_expressions_follow():
    graph = [
        InputSpec("ids", ("batch", "seq"), "int64"),
        InputSpec("mask", ("batch", "past + seq"), "int64"),
        InputSpec("past", ("batch", 2, "past", 16)),
    ]
    sized = timed_sizes.grown(graph, graph, 8)
    assert [spec.dims for spec in sized] == [(1, 8), (1, 16), (1, 2, 8, 16)]
    image = [InputSpec("x", ("batch", 3, "h", "w"))]
    validated = [InputSpec("x", ("batch", 3, 32, 32))]  # the size validation found it runs at
    assert timed_sizes.grown(image, validated, 4)[0].dims == (1, 3, 128, 128)


def test_a_model_with_only_a_dynamic_batch_is_timed_as_validated():
    def run(feeds):
        raise AssertionError("nothing to try")

    graph = specs(("batch", 3, 8, 8))
    assert timed_sizes.timed_sizes(graph, graph, run)[0].dims == (1, 3, 8, 8)


def test_growth_stops_at_the_work_threshold():
    def run(feeds):
        time.sleep(feeds["x0"].shape[1] * 1e-5)  # 10 us a position: 2 ms at 200

    graph = specs(("batch", "seq"))
    assert timed_sizes.timed_sizes(graph, graph, run)[0].dims == (1, 256)


def test_growth_keeps_the_last_size_the_model_runs_at():
    def run(feeds):
        if feeds["x0"].shape[1] > 64:  # a position table of 64 rows
            raise RuntimeError("indices element out of data bounds")

    graph = specs(("batch", "seq"))
    assert timed_sizes.timed_sizes(graph, graph, run)[0].dims == (1, 64)


def test_growth_stops_before_the_inputs_grow_too_large(monkeypatch):
    monkeypatch.setattr(timed_sizes, "MAX_INPUT_BYTES", 4 * 1000)
    graph = specs(("batch", "seq"))
    assert timed_sizes.timed_sizes(graph, graph, lambda feeds: None)[0].dims == (1, 512)
    graph = specs(("batch", "seq", 4))
    assert timed_sizes.timed_sizes(graph, graph, lambda feeds: None)[0].dims == (1, 128, 4)


def test_optimize_times_a_dynamic_model_at_a_working_size_and_says_so(tmp_path):
    """A MatMul over a dynamic sequence: validated at 1 token, timed where a run takes 2 ms."""
    weight = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Mul", ["h", "two"], ["g"]),
        helper.make_node("Mul", ["g", "three"], ["y"]),
    ]
    model = make_model(
        nodes,
        [tensor("x", ["batch", "seq", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 64])],
        {"w": weight, "two": np.float32(2), "three": np.float32(3)},
    )
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    report = tmp_path / "r.json"
    result = CliRunner().invoke(app, ["optimize", str(path), "-o", str(tmp_path / "o.onnx"), "--report", str(report)])
    assert result.exit_code == 0, result.output
    written = json.loads(report.read_text())
    assert written["validation"]["inputs"] == ["x:batchxseqx64:float32"]  # its dynamic dims made 1
    (timed,) = written["profile"]["inputs"]
    batch, sequence, hidden = map(int, timed.split(":")[1].split("x"))
    assert batch == 1 and hidden == 64 and sequence > 1
    assert f"timed at x:1x{sequence}x64 (made up:" in result.output
