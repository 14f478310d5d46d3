"""Where half/convert.py puts Casts: a Cast the model wrote from float32 into float32 is read
past where its input is in the type wanted, a small constant read in both types is copied
into half rather than cast, and a Cast reads its input in whatever type it is made."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from convexport.half.convert import PrecisionPlan, with_precision
from convexport.half.rounding import WeightRounding
from convexport.ir.slots import data_slots, element_types
from helpers import make_model, run, tensor

FLOAT, FLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16


def conversion(model, half_nodes: set[str]):
    """`model` with the nodes named in `half_nodes` in float16, the rest float32 (convert.Converted)."""
    types = element_types(model)
    plan = PrecisionPlan(FLOAT16, FLOAT)
    for index, node in enumerate(model.graph.node):
        if node.name in half_nodes:
            plan.nodes[index] = data_slots(node, 18, types, FLOAT16)
    return with_precision(model, plan, types, WeightRounding(model.graph, FLOAT16))


def converted(model, half_nodes: set[str]):
    return conversion(model, half_nodes).model


def upcast_norm():
    """Llama's norm as exported in float32: `x.to(float32)` a no-op Cast, read by the norm's
    statistics (float32 here) and by the residual Add (float16)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="made_in_half"),
        helper.make_node("Cast", ["h"], ["up"], to=FLOAT, name="upcast"),
        helper.make_node("Mul", ["up", "up"], ["square"], name="statistics"),
        helper.make_node("Add", ["h", "up"], ["y"], name="residual"),
    ]
    return make_model(nodes, [tensor("x", [2, 4])], [tensor("square", [2, 4]), tensor("y", [2, 4])])


def test_a_no_op_cast_into_float32_is_read_past_by_a_reader_in_half():
    half = converted(upcast_norm(), {"made_in_half", "residual"})
    by_name = {node.name: node for node in half.graph.node}
    assert by_name["residual"].input[1] == "h"  # not a Cast of the Cast back into half
    assert by_name["upcast"].input[0] == "h"  # the model's own Cast is the Cast into float32
    casts = [node for node in half.graph.node if node.op_type == "Cast"]
    assert len(casts) == 3  # the model's, the interface's input into half and y back
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    h = np.maximum(x, 0).astype(np.float16).astype(np.float32)
    square, y = run(half, {"x": x})
    assert np.array_equal(square, h * h) and np.array_equal(y, (h + h).astype(np.float16).astype(np.float32))


def test_a_float32_reader_of_what_the_model_casts_into_float32_reads_the_models_cast():
    """The residual Add in float32 too (islands.py's residual stream): it reads the model's own
    Cast of h into float32, not a second Cast of h."""
    half = converted(upcast_norm(), {"made_in_half"})
    by_name = {node.name: node for node in half.graph.node}
    assert list(by_name["residual"].input) == ["up", "up"]
    assert [node.name for node in half.graph.node if "h" in node.input] == ["upcast"]
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    h = np.maximum(x, 0).astype(np.float16).astype(np.float32)
    assert np.array_equal(run(half, {"x": x})[1], h + h)


def test_the_models_cast_read_so_is_read_under_its_inner_name_where_it_is_an_output():
    """With a half interface the Cast's output, a graph output, is cast back into half under
    its own name at the end: the residual reads the float32 tensor the Cast now writes."""
    model = upcast_norm()
    model.graph.output.append(tensor("up", [2, 4]))
    types = element_types(model)
    plan = PrecisionPlan(FLOAT16, FLOAT16, {0: data_slots(model.graph.node[0], 18, types, FLOAT16)})
    half = with_precision(model, plan, types, WeightRounding(model.graph, FLOAT16)).model
    by_name = {node.name: node for node in half.graph.node}
    assert list(by_name["residual"].input) == [by_name["upcast"].output[0]] * 2 != ["up", "up"]
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float16)
    h = np.maximum(x, 0).astype(np.float32)
    square, y, up = run(half, {"x": x})
    assert np.array_equal(y, (h + h).astype(np.float16)) and np.array_equal(up, h.astype(np.float16))


def test_a_no_op_cast_that_nothing_reads_any_more_goes():
    """In half on both sides, the model's no-op Cast is read past by all its readers and dropped."""
    done = conversion(upcast_norm(), {"made_in_half", "upcast", "statistics", "residual"})
    half = done.model
    assert "upcast" not in {node.name for node in half.graph.node}
    assert done.half_nodes == 3  # (the report counts the nodes it writes)
    assert {node.name: list(node.input) for node in half.graph.node}["statistics"] == ["h", "h"]
    assert not any(value.name == "up" for value in half.graph.value_info)


def test_a_small_constant_read_in_both_types_is_copied_into_half_not_cast():
    """A Gelu's `1 +` sharing its 1 with float32 arithmetic elsewhere: a Cast of the constant
    would stand inside the pattern ONNX Runtime fuses."""
    nodes = [
        helper.make_node("Tanh", ["x"], ["t"], name="tanh"),
        helper.make_node("Add", ["t", "one"], ["a"], name="one_plus"),
        helper.make_node("Add", ["x", "one"], ["b"], name="float32_elsewhere"),
    ]
    model = make_model(nodes, [tensor("x", [3])], [tensor("a", [3]), tensor("b", [3])], {"one": np.float32(1.0)})
    half = converted(model, {"tanh", "one_plus"})
    by_name = {node.name: node for node in half.graph.node}
    copy = by_name["one_plus"].input[1]
    stored = {init.name: init for init in half.graph.initializer}
    assert stored[copy].data_type == FLOAT16 and stored["one"].data_type == FLOAT
    assert not any(node.op_type == "Cast" and node.input[0] == "one" for node in half.graph.node)
