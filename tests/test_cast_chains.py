"""Widening Casts merged through ops that only move values (convexport/half/cast_chains.py):
the merged graph computes bit for bit what the chain did, and a chain whose first Cast rounds,
or whose values something else reads or changes, is left alone."""

from __future__ import annotations

import copy

import numpy as np
import onnx
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from convexport.half.cast_chains import merge_widening_casts
from helpers import make_model, op_counts, run, tensor

FLOAT16, FLOAT, DOUBLE = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE
NUMPY = {FLOAT16: np.float16, FLOAT: np.float32, DOUBLE: np.float64}
WIDER = {(FLOAT16, FLOAT), (FLOAT16, DOUBLE), (FLOAT, DOUBLE)}
# each op on a [2, 3, 4] tensor, keeping its 24 values: (its extra inputs as constants, attributes)
MOVES = {
    "Reshape": ([np.array([6, 4], np.int64)], {}),
    "Transpose": ([], {"perm": [2, 0, 1]}),
    "Unsqueeze": ([np.array([0], np.int64)], {}),
    "Flatten": ([], {"axis": 1}),
    "Identity": ([], {}),
    "Slice": ([np.array([-1], np.int64), np.array([-(2**62)], np.int64), np.array([2], np.int64),
               np.array([-1], np.int64)], {}),  # fmt: skip
    "Gather": ([np.array([2, 0, 1], np.int64)], {"axis": 1}),
}


def chain(a: int, b: int, c: int, ops: list[str], extra_reader: bool = False) -> onnx.ModelProto:
    """x (type a) -> Cast(b) -> ops (each on a [2, 3, 4] view: a Reshape back before it) -> Cast(c) -> y."""
    nodes = [helper.make_node("Cast", ["x"], ["t0"], to=b)]
    weights, current = {}, "t0"
    for index, op in enumerate(ops):
        if index:  # back to [2, 3, 4]
            weights[f"s{index}"] = np.array([2, 3, 4], np.int64)
            nodes.append(helper.make_node("Reshape", [current, f"s{index}"], [f"r{index}"]))
            current = f"r{index}"
        extra, attributes = MOVES[op]
        names = [f"c{index}_{k}" for k in range(len(extra))]
        weights.update(zip(names, extra))
        nodes.append(helper.make_node(op, [current, *names], [f"m{index}"], **attributes))
        current = f"m{index}"
    nodes.append(helper.make_node("Cast", [current], ["y"], to=c))
    outputs = [tensor("y", None, c)]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["t0"], ["z"]))
        outputs.append(tensor("z", None, b))
    return make_model(nodes, [tensor("x", [2, 3, 4], a)], outputs, weights)


def merged(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    result = copy.deepcopy(model)
    types = {value.name: value.type.tensor_type.elem_type for value in
             (*result.graph.input, *result.graph.value_info, *result.graph.output)}  # fmt: skip
    removed = merge_widening_casts(result.graph, types)
    onnx.checker.check_model(result, full_check=True)
    return result, removed


def feeds(elem_type: int, seed: int = 0) -> dict:
    values = np.random.default_rng(seed).standard_normal((2, 3, 4)) * 1e3
    return {"x": values.astype(NUMPY[elem_type])}


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from([FLOAT16, FLOAT, DOUBLE]), st.sampled_from([FLOAT16, FLOAT, DOUBLE]),
    st.sampled_from([FLOAT16, FLOAT, DOUBLE]), st.lists(st.sampled_from(sorted(MOVES)), max_size=3),
)  # fmt: skip
def test_a_chain_merges_exactly_when_its_first_cast_widens(a, b, c, ops):
    original = chain(a, b, c, ops)
    result, removed = merged(original)
    casts_before = op_counts(original)["Cast"]
    # a round trip goes whole, but for a Cast to its own type writing the output's name
    expected = 0 if (a, b) not in WIDER else 2 if c == a and ops else 1
    assert removed == expected and op_counts(result).get("Cast", 0) == casts_before - expected
    (want,), (got,) = run(original, feeds(a)), run(result, feeds(a))
    assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)


def test_a_float32_tail_cast_on_to_float64_is_one_cast():
    """The detector's case: float16 -> Cast(float32) -> Reshape -> Cast(float64)."""
    result, removed = merged(chain(FLOAT16, FLOAT, DOUBLE, ["Reshape"]))
    casts = [node for node in result.graph.node if node.op_type == "Cast"]
    assert removed == 1 and len(casts) == 1 and casts[0].attribute[0].i == DOUBLE
    assert [node.op_type for node in result.graph.node] == ["Cast", "Reshape"]
    assert result.graph.node[-1].output[0] == "y"  # the output keeps its name


def test_a_cast_read_beside_the_chain_is_left_alone():
    original = chain(FLOAT16, FLOAT, DOUBLE, ["Transpose"], extra_reader=True)
    assert merged(original)[1] == 0


def test_an_op_that_computes_breaks_the_chain():
    nodes = [
        helper.make_node("Cast", ["x"], ["t"], to=FLOAT),
        helper.make_node("Relu", ["t"], ["r"]),
        helper.make_node("Cast", ["r"], ["y"], to=DOUBLE),
    ]
    model = make_model(nodes, [tensor("x", [4], FLOAT16)], [tensor("y", [4], DOUBLE)])
    assert merged(model)[1] == 0


def test_a_value_a_graph_output_or_a_subgraph_reads_is_left_alone():
    """Retyping a graph output would change the interface; a value an If branch reads from
    outside has a reader the node list does not show."""
    as_output = make_model(
        [helper.make_node("Cast", ["x"], ["t"], to=FLOAT), helper.make_node("Cast", ["t"], ["y"], to=DOUBLE)],
        [tensor("x", [4], FLOAT16)], [tensor("t", [4], FLOAT), tensor("y", [4], DOUBLE)],
    )  # fmt: skip
    assert merged(as_output)[1] == 0
    branch = helper.make_graph([helper.make_node("Neg", ["t"], ["n"])], "b", [], [tensor("n", [4], FLOAT)])
    nodes = [
        helper.make_node("Cast", ["x"], ["t"], to=FLOAT),
        helper.make_node("Cast", ["t"], ["y"], to=DOUBLE),
        helper.make_node("If", ["flag"], ["z"], then_branch=branch, else_branch=branch),
    ]
    inputs = [tensor("x", [4], FLOAT16), tensor("flag", [], TensorProto.BOOL)]
    model = make_model(nodes, inputs, [tensor("y", [4], DOUBLE), tensor("z", [4], FLOAT)])
    assert merged(model)[1] == 0


def test_the_conversions_cast_is_named_for_the_type_it_makes():
    nodes = [
        helper.make_node("Cast", ["h"], ["h__as_f32"], to=FLOAT),
        helper.make_node("Reshape", ["h__as_f32", "shape"], ["r"]),
        helper.make_node("Cast", ["r"], ["y"], to=DOUBLE),
    ]
    weights = {"shape": np.array([4], np.int64)}
    model = make_model(nodes, [tensor("h", [2, 2], FLOAT16)], [tensor("y", [4], DOUBLE)], weights)
    result, removed = merged(model)
    assert removed == 1 and result.graph.node[0].output[0] == "h__as_f64" == result.graph.node[1].input[0]


def test_a_second_cast_to_a_type_the_ops_may_lack_kernels_for_is_left_alone():
    """Cast on to int64 or bool: the ops between would move those (DepthToSpace has no bool kernel)."""
    for to in (TensorProto.INT64, TensorProto.BOOL):
        model = chain(FLOAT16, FLOAT, to, ["Transpose"])
        assert merged(model)[1] == 0
