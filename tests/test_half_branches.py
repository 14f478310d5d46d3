"""--dtype fp16 on a model that is one If over two branches reading the main graph's weights
(optimum's `decoder_model_merged.onnx`): each branch converted as a model of its own and put
back (half/branches.py), the shared weights rounded once and written once; checked here by
running both branches against the float64 result."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import convexport
from convexport.validate.float64 import Float64Evaluator
from convexport.half.branches import merged_branches
from helpers import make_model, tensor

FLOAT16, FLOAT = TensorProto.FLOAT16, TensorProto.FLOAT
rng = np.random.default_rng(0)
WEIGHTS = {
    "w_in": rng.normal(0, 0.3, (16, 32)).astype(np.float32),
    "w_out": rng.normal(0, 0.2, (32, 16)).astype(np.float32),
    "bias": rng.normal(0, 0.1, 16).astype(np.float32),
}


def merged(before_if: bool = False) -> onnx.ModelProto:
    """If(use_cache) over two small decoders sharing w_in and w_out: the then branch adds the
    past to its input first, the else branch does not and adds a bias at the end. With
    `before_if`, a Relu in the main graph makes what the branches read."""
    source = "x_relu" if before_if else "x"
    then_branch = helper.make_graph(
        [helper.make_node("Add", [source, "past"], ["t0"]), helper.make_node("MatMul", ["t0", "w_in"], ["t1"]),
         helper.make_node("Relu", ["t1"], ["t2"]), helper.make_node("MatMul", ["t2", "w_out"], ["t"])],
        "then", [], [tensor("t", [2, 16])])  # fmt: skip
    else_branch = helper.make_graph(
        [helper.make_node("MatMul", [source, "w_in"], ["e1"]), helper.make_node("Tanh", ["e1"], ["e2"]),
         helper.make_node("MatMul", ["e2", "w_out"], ["e3"]), helper.make_node("Add", ["e3", "bias"], ["e"])],
        "else", [], [tensor("e", [2, 16])])  # fmt: skip
    nodes = [helper.make_node("If", ["use_cache"], ["y"], then_branch=then_branch, else_branch=else_branch)]
    if before_if:
        nodes.insert(0, helper.make_node("Relu", ["x"], ["x_relu"]))
    inputs = [tensor("x", [2, 16]), tensor("past", [2, 16]), tensor("use_cache", [], TensorProto.BOOL)]
    return make_model(nodes, inputs, [tensor("y", [2, 16])], WEIGHTS)


def branch_weights(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for attribute in model.graph.node[-1].attribute for t in attribute.g.initializer]


def test_each_branch_runs_in_float16_and_the_shared_weights_are_written_once(tmp_path):
    path = tmp_path / "merged.onnx"
    original = merged()
    onnx.save(original, path)
    result = convexport.optimize(str(path), output=str(tmp_path / "half.onnx"), profile=False, dtype="fp16")
    half = onnx.load(str(tmp_path / "half.onnx"))
    onnx.checker.check_model(half, full_check=True)
    precision = result.report["precision"]
    assert precision["validation"]["passed"] and precision["nodes_half"] >= 6
    # w_in, which both branches read (the rewrite folds w_out into the else branch's own), is
    # rounded once and written once, in the main graph; no float32 copy is left
    main = [(tuple(t.dims), t.data_type) for t in half.graph.initializer]
    everywhere = main + [(tuple(t.dims), t.data_type) for t in branch_weights(half)]
    assert main.count(((16, 32), FLOAT16)) == 1 and everywhere.count(((16, 32), FLOAT16)) == 1, everywhere
    assert all(kind == FLOAT16 for _, kind in everywhere), everywhere
    assert [v.type.tensor_type.elem_type for v in (*half.graph.input[:2], *half.graph.output)] == [FLOAT] * 3
    # each way of rounding counted once, though both branches read the weights
    assert sum(precision["weights_rounded"].values()) == 3
    evaluator = Float64Evaluator(original)
    session = ort.InferenceSession(half.SerializeToString(), providers=["CPUExecutionProvider"])
    bound = precision["validation"]["outputs"]["y"]["bound"]
    for seed, use_cache in ((10, True), (11, False)):
        inputs = np.random.default_rng(seed)
        feeds = {"x": inputs.standard_normal((2, 16)).astype(np.float32),
                 "past": inputs.standard_normal((2, 16)).astype(np.float32), "use_cache": np.array(use_cache)}  # fmt: skip
        exact = evaluator.run(feeds)[0]
        got = session.run(None, feeds)[0].astype(np.float64)
        float32 = ort.InferenceSession(original.SerializeToString()).run(None, feeds)[0]
        assert 0 < np.abs(got - exact).max() <= 2 * bound, (use_cache, np.abs(got - exact).max(), bound)
        assert np.abs(got - exact).max() > np.abs(float32 - exact).max()  # float16 was computed: worse than float32


def test_an_if_after_other_nodes_stays_float32_whole(tmp_path):
    """Where the branches read what a main-graph node makes, they are no model of their own
    (their input would be that node's exact value), nor where they read a weight the caller may
    override (it would be rounded into the branch): the If stays float32, saying why."""
    model = merged(before_if=True)
    assert merged_branches(model) is None and merged_branches(merged()) is not None
    overridable = merged()  # w_in also a graph input: the caller may feed another
    overridable.graph.input.append(tensor("w_in", [16, 32]))
    assert merged_branches(overridable) is None
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    result = convexport.optimize(str(path), output=str(tmp_path / "h.onnx"), profile=False, dtype="fp16")
    kept = result.report["precision"]["kept_float32"]
    assert ("If", "it holds a subgraph") in [(entry["op"], entry["reason"]) for entry in kept]


def test_a_large_merged_decoders_branches_keep_their_weights_on_disk_and_make_the_same_model(tmp_path, monkeypatch):
    """Every model counted as large (ir.large's SERIALISED_MAX_BYTES at 256 bytes, a tensor of
    16 bytes goes to a file): each branch's attempts keep their weights in folders beside the
    output (half/on_disk.py), the weights the branches rounded go to the main graph (the writer
    and ONNX Runtime find file-backed weights there only), and the model written computes what
    the one made in memory does; once it is written no folder is left."""
    from convexport.ir import large

    in_memory = tmp_path / "in_memory"
    in_memory.mkdir()
    onnx.save(merged(), in_memory / "merged.onnx")
    expected = convexport.optimize(str(in_memory / "merged.onnx"), output=str(in_memory / "half.onnx"), profile=False,
                                   dtype="fp16")  # fmt: skip
    monkeypatch.setattr(large, "SERIALISED_MAX_BYTES", 256)
    monkeypatch.setattr(large, "EXTERNAL_TENSOR_MIN_BYTES", 16)
    onnx.save(merged(), tmp_path / "merged.onnx")
    result = convexport.optimize(str(tmp_path / "merged.onnx"), output=str(tmp_path / "half.onnx"), profile=False,
                                 dtype="fp16")  # fmt: skip
    assert result.report["precision"] == expected.report["precision"]
    assert result.report["precision"]["nodes_half"] >= 6
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        ["in_memory", "merged.onnx", "half.onnx", Path(result.output_weights).name]
    )
    half = onnx.load(str(tmp_path / "half.onnx"), load_external_data=False)
    assert branch_weights(half) == [] or all(t.data_location != TensorProto.EXTERNAL for t in branch_weights(half))
    main = [(tuple(t.dims), t.data_type) for t in half.graph.initializer]
    assert main.count(((16, 32), FLOAT16)) == 1 and ((16, 32), FLOAT) not in main, main
    session = ort.InferenceSession(str(tmp_path / "half.onnx"), providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(str(in_memory / "half.onnx"), providers=["CPUExecutionProvider"])
    for use_cache in (True, False):
        feeds = {"x": rng.standard_normal((2, 16)).astype(np.float32),
                 "past": rng.standard_normal((2, 16)).astype(np.float32), "use_cache": np.array(use_cache)}  # fmt: skip
        np.testing.assert_array_equal(session.run(None, feeds)[0], reference.run(None, feeds)[0])


def test_a_branch_that_misses_its_bound_leaves_no_weights_folder_behind(tmp_path):
    """Where the second branch misses its bound, the model is not converted by branch and every
    folder the branches' attempts kept (the first's, which passed, among them) is removed."""
    from convexport.half.branches import in_half_by_branch
    from convexport.load.inputs import InputSets
    from convexport.half.choose import HalfPrecision
    from convexport.half.outputs import OutputJudgement

    closed = []

    def converted(branch, sets, given):
        files = contextlib.ExitStack()
        files.callback(closed.append, branch.graph.name)
        passed = branch.graph.name.endswith("else_branch")  # the first converted (attributes are sorted)
        judged = OutputJudgement(error=0.1 if passed else 2.0, bound=1.0, beyond=0 if passed else 3, elements=4)
        outputs = {value.name: judged for value in branch.graph.output}
        return HalfPrecision(branch, "float16", "float32", 1, 0, [], outputs, "float64", files=files)

    assert in_half_by_branch(merged(), InputSets([], 0), converted) is None
    assert sorted(closed) == ["test_else_branch", "test_then_branch"], closed


def run_against_float64(original: onnx.ModelProto, half: onnx.ModelProto, bound: float) -> None:
    """Both branches of the half model, fed as its interface says, within twice the report's
    bound of the original's float64 result on fresh inputs (the float16 interface's inputs
    rounded first: that rounding is the caller's)."""
    evaluator = Float64Evaluator(original)
    session = ort.InferenceSession(half.SerializeToString(), providers=["CPUExecutionProvider"])
    kinds = {value.name: value.type for value in session.get_inputs()}
    for seed, use_cache in ((20, True), (21, False)):
        inputs = np.random.default_rng(seed)
        feeds = {"x": inputs.standard_normal((2, 16)).astype(np.float32),
                 "past": inputs.standard_normal((2, 16)).astype(np.float32), "use_cache": np.array(use_cache)}  # fmt: skip
        fed = {k: v.astype(np.float16) if kinds[k] == "tensor(float16)" else v for k, v in feeds.items()}
        exact = evaluator.run({k: v.astype(np.float32) for k, v in fed.items()})[0]
        got = session.run(None, fed)[0].astype(np.float64)
        assert np.abs(got - exact).max() <= 2 * bound, (use_cache, np.abs(got - exact).max(), bound)


def test_a_float16_interface_converts_each_branch_and_retypes_the_ifs_inputs_and_outputs(tmp_path):
    """--io-dtype fp16 on a merged decoder: each branch converted with a float16 interface, and
    the model's float inputs and outputs float16 as the branches read and make them (the If
    kept float32 with float16 inputs was a model ONNX Runtime would not load)."""
    onnx.save(merged(), tmp_path / "merged.onnx")
    result = convexport.optimize(str(tmp_path / "merged.onnx"), output=str(tmp_path / "half.onnx"), profile=False,
                                 dtype="fp16", io_dtype="fp16")  # fmt: skip
    half = onnx.load(str(tmp_path / "half.onnx"))
    onnx.checker.check_model(half, full_check=True)
    precision = result.report["precision"]
    assert precision["validation"]["passed"] and precision["nodes_half"] >= 6 and precision["kept_float32"] == []
    kinds = [v.type.tensor_type.elem_type for v in (*half.graph.input, *half.graph.output)]
    assert kinds == [FLOAT16, FLOAT16, TensorProto.BOOL, FLOAT16], kinds
    run_against_float64(merged(), half, precision["validation"]["outputs"]["y"]["bound"])


@pytest.mark.parametrize("io_dtype", ["fp32", "fp16"])
def test_an_if_kept_float32_reads_what_it_reads_of_the_main_graph_in_float32(tmp_path, io_dtype):
    """An If beside a MatMul in half whose weight one branch reads too: the If stays float32
    whole, and what its branches read of the main graph (the weight, a float16 interface's
    inputs) they read in float32, Casts made before the If; the weight stays one float32 tensor
    (the MatMul reads a Cast of it). Before, a weight the main graph read in half was rounded
    and the branch read it so, and a float16 interface's inputs went in as they were: models
    ONNX Runtime would not load."""
    weight = rng.normal(0, 0.3, (16, 16)).astype(np.float32)
    then_branch = helper.make_graph([helper.make_node("MatMul", ["past", "w"], ["t"])], "then", [],
                                    [tensor("t", [2, 16])])  # fmt: skip
    else_branch = helper.make_graph([helper.make_node("Tanh", ["past"], ["e"])], "else", [], [tensor("e", [2, 16])])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("If", ["use_cache"], ["b"], then_branch=then_branch, else_branch=else_branch),
             helper.make_node("Add", ["h", "b"], ["y"])]  # fmt: skip
    inputs = [tensor("x", [2, 16]), tensor("past", [2, 16]), tensor("use_cache", [], TensorProto.BOOL)]
    model = make_model(nodes, inputs, [tensor("y", [2, 16])], {"w": weight})
    assert merged_branches(model) is None
    onnx.save(model, tmp_path / "m.onnx")
    result = convexport.optimize(str(tmp_path / "m.onnx"), output=str(tmp_path / "h.onnx"), profile=False,
                                 dtype="fp16", io_dtype=io_dtype)  # fmt: skip
    half = onnx.load(str(tmp_path / "h.onnx"))
    onnx.checker.check_model(half, full_check=True)
    precision = result.report["precision"]
    assert [entry["op"] for entry in precision["kept_float32"]] == ["If"] and precision["nodes_half"] >= 2
    assert [(t.name, t.data_type) for t in half.graph.initializer] == [("w", FLOAT)]
    if_node = next(node for node in half.graph.node if node.op_type == "If")
    branch_reads = {name for attribute in if_node.attribute for node in attribute.g.node for name in node.input}
    cast_of = {node.input[0]: node.output[0] for node in half.graph.node if node.op_type == "Cast"}
    assert branch_reads == ({"past__as_f32", "w"} if io_dtype == "fp16" else {"past", "w"}), branch_reads
    run_against_float64(model, half, precision["validation"]["outputs"]["y"]["bound"])
    assert "w" in cast_of  # the MatMul in float16 reads the float32 weight through a Cast
