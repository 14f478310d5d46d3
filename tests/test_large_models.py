"""Large models (issue 34) with small tensors: the paths a model of gigabytes takes, taken here
with the size thresholds lowered, so the suite stays fast. bench/large_models.py measures the
memory and time on real sizes."""

from __future__ import annotations

import hashlib
import os
import stat
import weakref

import numpy as np
import onnx
import onnx.parser
import onnx_graphsurgeon as gs
import pytest
from onnx import helper, numpy_helper

import convexport
from convexport import ir
from convexport.validate import runs as validation_runs
from helpers import make_model, tensor

RNG = np.random.default_rng(34)


def lora_bn_block(width: int = 32, rank: int = 4) -> onnx.ModelProto:
    """x -> MatMul W + b, + (x A) B * s -> BatchNormalization -> Relu: a LoRA/BN MLP block, as
    bench/large_models.py builds it at width 4096."""
    weights = {
        "w": (RNG.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32),
        "b": RNG.standard_normal(width).astype(np.float32),
        "a": RNG.standard_normal((width, rank)).astype(np.float32),
        "u": RNG.standard_normal((rank, width)).astype(np.float32),
        "s": np.array(0.5, np.float32),
        **{k: RNG.uniform(0.5, 2, width).astype(np.float32) for k in ("g", "be", "m", "v")},
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["lin"]),
        helper.make_node("MatMul", ["x", "a"], ["d"]),
        helper.make_node("MatMul", ["d", "u"], ["l"]),
        helper.make_node("Mul", ["l", "s"], ["ls"]),
        helper.make_node("Add", ["lin", "ls"], ["sum"]),
        helper.make_node("BatchNormalization", ["sum", "g", "be", "m", "v"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["y"]),
    ]
    return make_model(nodes, [tensor("x", [4, width])], [tensor("y", [4, width])], weights)


def contents(folder) -> dict[str, tuple[str, int]]:
    """Each file's digest and mode: what the run must leave as it was."""
    return {
        name: (hashlib.sha256((folder / name).read_bytes()).hexdigest(), (folder / name).stat().st_mode)
        for name in sorted(os.listdir(folder))
    }


def test_a_model_with_external_data_in_a_read_only_folder_still_folds(tmp_path, monkeypatch):
    """Weights in an external data file, the folder and its files read-only: the model is read
    where it lies (nothing written beside it, not even a temporary file), folded and
    validated; the output goes where it is asked to."""
    monkeypatch.setattr("convexport.ir.large.EXTERNAL_DATA_THRESHOLD", 1000)
    monkeypatch.setattr("convexport.ir.large.EXTERNAL_TENSOR_MIN_BYTES", 100)
    given, out = tmp_path / "given", tmp_path / "out"
    given.mkdir()
    out.mkdir()
    onnx.save(lora_bn_block(), str(given / "mlp.onnx"), save_as_external_data=True, location="mlp.onnx.data",
              size_threshold=100)
    assert (given / "mlp.onnx.data").stat().st_size > 4000
    for path in given.iterdir():
        path.chmod(0o444)
    given.chmod(0o555)
    before = contents(given)
    try:
        result = convexport.optimize(str(given / "mlp.onnx"), output=out / "mlp.opt.onnx", profile=False)
    finally:
        given.chmod(0o755)
    assert contents(given) == before
    assert result.report["validation"]["passed"]
    assert [node.op_type for node in result.model.graph.node] == ["Gemm", "Relu"]
    assert result.output_weights.parent == out and result.output_weights.exists()
    assert stat.S_IMODE((out / "mlp.opt.onnx").stat().st_mode) & 0o444


def test_the_float64_reference_is_skipped_above_its_size_and_the_report_says_so(monkeypatch):
    monkeypatch.setattr("convexport.validate.exact_check.FLOAT64_WEIGHT_BYTES", 1000)
    report = convexport.optimize(lora_bn_block(), write=False, profile=False).report
    validation = report["validation"]
    assert validation["passed"] and validation["reference"] == "float32"
    assert "skipped" in validation["reference_note"] and "GiB that float64 copies are made of" in validation["reference_note"]


def test_validation_holds_one_session_at_a_time(monkeypatch):
    """The original's outputs are computed and its session released before the optimized
    graph's session opens (a session holds a copy of the model's weights)."""
    alive, made, most = [], [0], [0]
    evaluator = validation_runs._evaluator

    def counted(*args, **kwargs):
        session = evaluator(*args, **kwargs)
        made[0] += 1
        alive[:] = [ref for ref in alive if ref() is not None] + [weakref.ref(session)]
        most[0] = max(most[0], len(alive))
        return session

    monkeypatch.setattr(validation_runs, "_evaluator", counted)
    report = convexport.optimize(lora_bn_block(), write=False, profile=False).report
    assert report["validation"]["passed"] and made[0] == 2 and most[0] == 1


def test_the_rewrite_frees_the_weights_it_replaced(monkeypatch):
    """The weights a fold read and replaced are garbage in cycles (gs tensors and their reader
    lists): collected as they pile up and when the rewrite ends, not held through validation."""
    monkeypatch.setattr("convexport.rewrite.engine.COLLECT_AFTER_ELEMENTS", 1)
    monkeypatch.setattr("convexport.ir.heap.LARGE_BYTES", 1000)
    loaded = []
    load = gs.ir.tensor.LazyValues.load

    def recorded(self):  # an imported weight read for the first time
        value = load(self)
        if value.size >= 32 * 32:
            loaded.append(weakref.ref(value))
        return value

    monkeypatch.setattr(gs.ir.tensor.LazyValues, "load", recorded)
    result = convexport.optimize(lora_bn_block(), write=False, profile=False, validate=False)
    assert [node.op_type for node in result.model.graph.node] == ["Gemm", "Relu"]
    assert loaded and all(ref() is None for ref in loaded)


def test_a_large_new_weight_is_exported_once_and_the_graph_reads_it_from_there(monkeypatch):
    """export_graph writes a large array straight into the model's initializer (one copy, not
    gs's proto and the model's copy of it), with its dims, and frees the array: the graph's
    constant reads the exported initializer from then on."""
    monkeypatch.setattr("convexport.ir.convert.HELD_BACK_BYTES", 64)
    model = lora_bn_block()
    graph = ir.import_graph(model)
    weight = graph.tensors()["w"]
    new = RNG.standard_normal((32, 32)).astype(np.float32)
    weight.values = new
    exported = ir.export_graph(graph, model)
    initializer = next(init for init in exported.graph.initializer if init.name == "w")
    assert list(initializer.dims) == [32, 32] and np.array_equal(numpy_helper.to_array(initializer), new)
    kept = weakref.ref(new)
    expected, new = new.copy(), None
    assert kept() is None, "the exported array is still held"
    assert isinstance(weight, gs.Constant) and np.array_equal(weight.values, expected)
    untouched = next(init for init in exported.graph.initializer if init.name == "b")
    assert untouched == next(init for init in model.graph.initializer if init.name == "b")


@pytest.mark.parametrize("data_type, dims, expected", [
    (onnx.TensorProto.FLOAT, [64, 64], 64 * 64 * 4),
    (onnx.TensorProto.FLOAT16, [3, 5], 30),
    (onnx.TensorProto.INT4, [7], 4),
])
def test_weight_bytes_are_counted_without_reading_the_data(data_type, dims, expected):
    size = int(np.prod(dims))
    raw = bytes((size + 1) // 2) if data_type == onnx.TensorProto.INT4 else bytes(
        size * helper.tensor_dtype_to_np_dtype(data_type).itemsize)
    weight = helper.make_tensor("w", data_type, dims, raw, raw=True)
    model = helper.make_model(helper.make_graph([], "g", [], [], [weight]))
    assert ir.large.weight_bytes(model) == expected == len(raw)


def test_the_model_read_is_never_changed_by_the_export_that_shares_its_protos():
    """import_graph reads the model's protos without a copy: exporting must not write into them
    (gs sets an unread constant's name on its proto: a Constant node's unnamed value tensor
    came back with `name: ""` set, and a renamed weight with its new name)."""
    model = onnx.parser.parse_model("""
        <ir_version: 10, opset_import: ["" : 18]>
        g (float[2] x) => (float[2] y) {
            k = Constant <value = float[2] {1.5, -2.0}> ()
            h = Mul (x, k)
            y = Mul (h, w)
        }
    """)
    model.graph.initializer.append(numpy_helper.from_array(np.ones(2, np.float32), "w"))
    before = model.SerializeToString()
    graph = ir.import_graph(model)
    graph.tensors()["w"].name = "w_renamed"
    ir.export_graph(graph, model)
    assert model.SerializeToString() == before
