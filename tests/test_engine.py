"""The engine on hand-built graphs: BN folding, Identity/Dropout removal, refusals, outputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from convexport.rewrite.engine import RewriteSettings, rewrite_model
from convexport.folds import builtin_primitives
from convexport.rewrite.rulefile import builtin_rule_files, load_rules
from helpers import make_model, op_counts, run, tensor

RNG = np.random.default_rng(0)
RULES = load_rules(builtin_rule_files(), set(builtin_primitives()))


def rewrite(model, strategy="all"):
    return rewrite_model(model, RULES, builtin_primitives(), RewriteSettings(strategy))


def conv_bn_model(nd=2, group=1, bias=True, eps=1e-3, extra_consumer=False, bn_output_is_graph_output=True):
    channels_in, channels_out = 4, 8
    spatial = [7, 6, 5][:nd]
    weights = {
        "w": RNG.standard_normal([channels_out, channels_in // group] + [3] * nd).astype(np.float32),
        "s": RNG.uniform(0.5, 2, channels_out).astype(np.float32),
        "t": RNG.standard_normal(channels_out).astype(np.float32),
        "m": RNG.standard_normal(channels_out).astype(np.float32),
        "v": RNG.uniform(0.5, 2, channels_out).astype(np.float32),
    }
    conv_inputs = ["x", "w"]
    if bias:
        weights["b"] = RNG.standard_normal(channels_out).astype(np.float32)
        conv_inputs.append("b")
    nodes = [
        helper.make_node("Conv", conv_inputs, ["c"], name="conv", pads=[1] * (2 * nd), group=group),
        helper.make_node("BatchNormalization", ["c", "s", "t", "m", "v"], ["y"], name="bn", epsilon=eps),
    ]
    outputs = [tensor("y", None)]
    if extra_consumer:
        nodes.append(helper.make_node("Relu", ["c"], ["r"], name="relu"))
        outputs.append(tensor("r", None))
    return make_model(nodes, [tensor("x", [2, channels_in] + spatial)], outputs, weights)


def feeds_for(model):
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": RNG.standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_batchnorm_folds_exactly(nd, group, bias):
    model = conv_bn_model(nd, group, bias)
    outcome = rewrite(model)
    assert op_counts(outcome.model) == {"Conv": 1}
    assert [entry["rule"] for entry in outcome.applied] == ["conv-batchnorm"]
    assert outcome.applied[0]["nodes"] == ["conv", "bn"]
    feeds = feeds_for(model)
    np.testing.assert_allclose(run(outcome.model, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)
    assert outcome.model.graph.output[0].name == "y"


def test_conv_batchnorm_refused_when_conv_output_is_shared():
    model = conv_bn_model(extra_consumer=True)
    outcome = rewrite(model)
    assert op_counts(outcome.model)["BatchNormalization"] == 1
    (skip,) = outcome.skipped
    assert skip["rule"] == "conv-batchnorm" and "also read by 1 other node" in skip["reason"]


def test_batchnorm_with_run_time_statistics_is_left_alone():
    model = conv_bn_model()
    scale = next(init for init in model.graph.initializer if init.name == "s")
    model.graph.initializer.remove(scale)
    model.graph.input.append(tensor("s", [8]))
    outcome = rewrite(model)
    assert op_counts(outcome.model)["BatchNormalization"] == 1


def test_conv_with_run_time_weight_is_reported():
    model = conv_bn_model()
    weight = next(init for init in model.graph.initializer if init.name == "w")
    model.graph.initializer.remove(weight)
    model.graph.input.append(tensor("w", list(weight.dims)))
    outcome = rewrite(model)
    assert op_counts(outcome.model)["BatchNormalization"] == 1
    assert "w (w) is computed at run time" in outcome.skipped[0]["reason"]


def test_identity_and_dropout_removed_and_output_name_kept():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Identity", ["a"], ["b"], name="identity"),
        helper.make_node("Dropout", ["b"], ["y"], name="dropout"),
    ]
    model = make_model(nodes, [tensor("x", [2, 3])], [tensor("y", [2, 3])])
    outcome = rewrite(model)
    assert op_counts(outcome.model) == {"Relu": 1}
    assert outcome.model.graph.output[0].name == "y"
    feeds = {"x": RNG.standard_normal([2, 3]).astype(np.float32)}
    np.testing.assert_array_equal(run(outcome.model, feeds)[0], np.maximum(feeds["x"], 0))


def test_identity_from_input_to_output_is_kept():
    model = make_model([helper.make_node("Identity", ["x"], ["y"], name="identity")],
                       [tensor("x", [2])], [tensor("y", [2])])
    outcome = rewrite(model)
    assert op_counts(outcome.model) == {"Identity": 1}
    assert "graph output" in outcome.skipped[0]["reason"]


def test_dropout_with_used_mask_is_kept():
    nodes = [helper.make_node("Dropout", ["x"], ["y", "mask"], name="dropout")]
    model = make_model(nodes, [tensor("x", [2])], [tensor("y", [2]), tensor("mask", [2], 9)])
    assert op_counts(rewrite(model).model) == {"Dropout": 1}


def test_training_mode_dropout_is_kept():
    nodes = [helper.make_node("Dropout", ["x", "r", "t"], ["y"], name="dropout")]
    model = make_model(nodes, [tensor("x", [2])], [tensor("y", [2])],
                       {"r": np.array(0.5, np.float32), "t": np.array(True)})
    assert op_counts(rewrite(model).model) == {"Dropout": 1}


@pytest.mark.parametrize("first, second", [((), ()), ((), (4,)), ((1, 3, 1, 1), (1,))])
def test_two_constant_adds_become_one(first, second):
    """add-add-constants; scalar + scalar once crashed (a numpy scalar is not an array)."""
    nodes = [helper.make_node("Add", ["x", "m1"], ["h"]), helper.make_node("Add", ["h", "m2"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    values = {"m1": np.full(first, 0.5, np.float32), "m2": np.arange(np.prod(second, dtype=int), dtype=np.float32).reshape(second)}
    model = make_model(nodes, [tensor("x", [2, 3, 4, 4])], [tensor("y", [2, 3, 4, 4])], values)
    outcome = rewrite(model)
    assert op_counts(outcome.model) == {"Add": 1, "Relu": 1}
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)}
    np.testing.assert_allclose(run(outcome.model, feeds)[0], run(model, feeds)[0], rtol=1e-6, atol=1e-6)


def test_new_tensors_get_shapes_between_passes_from_their_nodes_alone():
    import onnx_graphsurgeon as gs

    from convexport.rewrite.local_shapes import infer_new_shapes

    x = gs.Variable("x", np.float32, [2, 3, 8, 8])
    weight = gs.Constant("w", RNG.standard_normal([5, 3, 3, 3]).astype(np.float32))
    conv_out, relu_out = gs.Variable("c", np.float32), gs.Variable("r", np.float32)
    nodes = [gs.Node("Conv", "conv", {"pads": [1, 1, 1, 1]}, [x, weight], [conv_out]),
             gs.Node("Relu", "relu", {}, [conv_out], [relu_out])]
    assert {t.name for t in infer_new_shapes(nodes, 18)} == {"c", "r"}
    assert relu_out.shape == [2, 5, 8, 8]
    custom_out = gs.Variable("m", np.float32)
    custom = gs.Node("Mystery", "mystery", {}, [x], [custom_out], domain="example.custom")
    assert infer_new_shapes([custom], 18) == [] and custom_out.shape is None   # left to the final inference


def test_garbage_collector_is_paused_during_the_rewrite_and_restored_after(monkeypatch):
    import gc

    from convexport.rewrite import engine

    seen = []
    original = engine.ir.import_graph
    monkeypatch.setattr(engine.ir, "import_graph", lambda model: seen.append(gc.isenabled()) or original(model))
    try:
        assert gc.isenabled()
        rewrite(conv_bn_model())
        assert seen == [False] and gc.isenabled()
        gc.disable()                       # a caller that runs with the collector off keeps it off
        rewrite(conv_bn_model())
        assert not gc.isenabled()
        gc.enable()
        with pytest.raises(AttributeError):     # restored after an error too
            rewrite_model(None, RULES, builtin_primitives())
        assert gc.isenabled()
    finally:
        gc.enable()


def test_a_refusal_in_a_graph_left_unchanged_is_reported_under_the_names_given_to_its_nodes():
    """An unchanged graph is returned as it came (nodes without names included); its refusals
    are all still there, and the report names the nodes as import_graph named them."""
    model = conv_bn_model(extra_consumer=True)
    for node in model.graph.node:
        node.name = ""
    outcome = rewrite(model)
    assert outcome.model is model
    (skip,) = outcome.skipped
    assert skip["rule"] == "conv-batchnorm" and skip["nodes"] == ["Conv_0", "BatchNormalization_1"]


def test_a_node_dead_in_the_original_goes_with_the_first_change_and_a_live_graph_is_left_as_is():
    from convexport.ir import cleaned_up, import_graph

    model = conv_bn_model()
    model.graph.node.append(helper.make_node("Relu", ["x"], ["unread"], name="dead"))
    outcome = rewrite(model)
    assert op_counts(outcome.model) == {"Conv": 1}
    graph = import_graph(conv_bn_model())
    assert cleaned_up(graph) is graph and len(graph.nodes) == 2


def test_a_reader_is_found_by_identity_wherever_it_sits():
    """_position never uses gs's deep Node.__eq__ (equal-looking readers are different nodes)."""
    import onnx_graphsurgeon as gs

    from convexport.rewrite.engine import _position

    readers = [gs.Node("Relu", "same") for _ in range(5)]
    for index, node in enumerate(readers):
        assert _position(readers, node) == index


def test_a_dead_node_is_disconnected_from_what_it_read_and_other_readers_stay_in_order():
    import onnx_graphsurgeon as gs

    from convexport.rewrite.engine import _disconnect_inputs

    a, b = gs.Variable("a"), gs.Variable("b")
    before = gs.Node("Relu", "before", inputs=[a])
    dead = gs.Node("Sum", "dead", inputs=[a, b, a])
    after = gs.Node("Relu", "after", inputs=[a])
    _disconnect_inputs(dead)
    assert list(dead.inputs) == []
    assert [n.name for n in a.outputs] == ["before", "after"] and list(b.outputs) == []
    assert before.inputs[0] is a and after.inputs[0] is a


def test_is_constant_agrees_with_constant_value_without_loading_it():
    """An initializer, a Constant node's output, a run-time tensor, a Constant node without
    `value` (value_float): is_constant says what constant_value finds, and leaves a lazily
    imported initializer unloaded."""
    from onnx_graphsurgeon.ir.tensor import LazyValues

    from convexport.ir import constant_value, import_graph, is_constant
    nodes = [helper.make_node("Constant", [], ["k"], value=helper.make_tensor("kv", 1, [2], [1.0, 2.0])),
             helper.make_node("Constant", [], ["f"], value_float=3.0),
             helper.make_node("Add", ["x", "w"], ["a"]), helper.make_node("Mul", ["a", "k"], ["m"]),
             helper.make_node("Mul", ["m", "f"], ["y"])]
    graph = import_graph(make_model(nodes, [tensor("x", [2])], [tensor("y", [2])], {"w": np.ones(2, np.float32)}))
    tensors = graph.tensors()
    said = {name: is_constant(tensors[name]) for name in ("x", "w", "k", "f", "a")}
    assert isinstance(tensors["w"]._values, LazyValues)
    assert said == {name: constant_value(tensors[name]) is not None for name in said}
    assert [name for name, constant in said.items() if constant] == ["w", "k"]


def test_the_final_shape_inference_runs_only_where_a_tensor_lacks_a_known_shape(monkeypatch):
    """A rewritten graph whose every tensor the engine knows the shape of is exported as is: the
    same model inference would give. A dynamic batch leaves sizes unknown: inference runs."""
    import convexport.rewrite.engine as engine

    inferred = []
    real = engine.ir.infer_shapes
    monkeypatch.setattr(engine.ir, "infer_shapes", lambda model, source: inferred.append(source) or real(model, source))
    static = rewrite(conv_bn_model())
    assert inferred == [] and op_counts(static.model) == {"Conv": 1}
    assert real(static.model, "again").SerializeToString() == static.model.SerializeToString()
    dynamic = conv_bn_model()
    dynamic.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    del dynamic.graph.value_info[:]
    dynamic.graph.output[0].type.tensor_type.ClearField("shape")
    rewrite(onnx.shape_inference.infer_shapes(dynamic))
    assert inferred == ["model"]


def test_a_rule_whose_pattern_names_an_op_the_scope_lacks_is_not_tried(monkeypatch):
    import convexport.rewrite.engine as engine

    tried = []
    real = engine.PatternMatcher
    monkeypatch.setattr(engine, "PatternMatcher", lambda rule, *args: tried.append(rule.name) or real(rule, *args))
    rewrite(conv_bn_model(extra_consumer=True))     # (a shared Conv output: the BN is the engine's, not the proto form's)
    assert "conv-batchnorm" in tried
    assert not {"gathered-linear-branches", "pad-conv", "add-linear-branches", "conv-mul"} & set(tried)


@pytest.mark.parametrize("seed", range(0, 40, 3))
def test_skipping_rules_by_op_changes_no_outcome(seed, monkeypatch):
    """The same rewrites and the same model as when every rule is tried everywhere."""
    from convexport.rewrite.rulefile import Rule
    from test_random_graphs import random_graph

    builder, y = random_graph(seed)
    model = builder.model([y])
    skipping = rewrite(model)
    monkeypatch.setattr(Rule, "may_match", lambda rule, ops: True)
    trying_all = rewrite(model)
    assert skipping.applied == trying_all.applied and skipping.skipped == trying_all.skipped
    assert skipping.model.SerializeToString() == trying_all.model.SerializeToString()
