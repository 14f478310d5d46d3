"""conv-batchnorm's first look made on the proto (folds/batchnorm_on_proto.py): the engine must
come out exactly as it does when it makes those folds itself (the same report, decisions,
names and bytes), and the form must stop wherever it cannot be sure of that."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

from convexport.folds.batchnorm_on_proto import fold_batchnorms_on_proto
from convexport.rewrite.engine import _leading_looks
from convexport.rewrite.primitives import builtin_primitives
from convexport.rewrite.proto_look import ProtoLook
from graphs import RULES, GraphBuilder, assert_same_outputs
from helpers import op_counts
from test_early_rewrites import assert_same_outcome
from test_random_graphs import FUZZ_EXAMPLES

CONV_BATCHNORM = next(rule for rule in RULES if rule.name == "conv-batchnorm")


def folded_on_proto(model, strategy="exact", limit=None) -> tuple[bool, list[list[str]]]:
    """(whether the leading looks reached past conv-batchnorm's whole look, the nodes of each
    conv-batchnorm fold the form made)."""
    look = _leading_looks(ProtoLook(model, 18, strategy, "cpu", {}, limit), RULES, builtin_primitives())
    folds = [names for rule, names, _ in look.applied if rule.name == "conv-batchnorm"]
    whole = fold_batchnorms_on_proto(ProtoLook(model, 18, strategy, "cpu", {}, limit), CONV_BATCHNORM)
    return whole, folds


def conv_bn(builder, x, out_channels=6, **conv):
    return builder.batchnorm(builder.conv(x, out_channels, conv.pop("kernel", 3), **conv))


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("group,stride,dilation,pads", [(1, 1, 1, 1), (2, 2, 1, 0), (1, 1, 2, 2), (2, 1, 1, [0, 1] * 3)])
@pytest.mark.parametrize("strategy", ["exact", "cost"])
def test_every_plain_fold_is_made_on_the_proto_as_the_engine_makes_it(nd, bias, group, stride, dilation, pads,
                                                                      strategy):
    builder = GraphBuilder([1, 4, *[9] * nd], seed=nd)
    pads = pads[:2 * nd] if isinstance(pads, list) else pads
    y = conv_bn(builder, "x", bias=bias, group=group, stride=stride, dilation=dilation, pads=pads)
    y = builder.node("Relu", [y])
    y = conv_bn(builder, y, 4, kernel=1)          # its output a graph output: taken over all the same
    model = builder.model([y])
    outcome = assert_same_outcome(model, strategy)
    whole, folds = folded_on_proto(model, strategy)
    assert whole and len(folds) == 2
    assert op_counts(outcome.model) == {"Conv": 2, "Relu": 1}
    assert_same_outputs(model, outcome.model, builder.input_shape)


@pytest.mark.parametrize("strategy", ["exact", "cost"])
def test_dynamic_batch_nameless_nodes_and_default_epsilon(strategy):
    builder = GraphBuilder([2, 3, 8, 8], seed=1)
    y = conv_bn(builder, "x")
    y = conv_bn(builder, y, 5)
    model = builder.model([y], dynamic_batch=True)
    for node in model.graph.node:
        node.name = ""
        if node.op_type == "BatchNormalization":
            del node.attribute[:]            # epsilon from the schema
    outcome = assert_same_outcome(model, strategy)
    assert folded_on_proto(model, strategy) == (True, [["Conv_0", "BatchNormalization_1"],
                                                      ["Conv_2", "BatchNormalization_3"]])
    assert_same_outputs(model, outcome.model, builder.input_shape)


def test_a_float16_model():
    builder = GraphBuilder([1, 3, 6, 6], seed=2)
    y = conv_bn(builder, "x")
    model = builder.model([y])
    for init in model.graph.initializer:
        init.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(init).astype(np.float16), init.name))
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    assert_same_outcome(model, "cost")
    assert folded_on_proto(model) == (True, [["Conv_node4", "BatchNormalization_node10"]])


def two_folds_around(builder, middle) -> onnx.ModelProto:
    """conv-bn, then `middle(builder, y)` (which returns its output), then conv-bn; the BNs that
    `middle` marks (builder.training) in training mode."""
    builder.training = []
    y = conv_bn(builder, "x")
    y = middle(builder, y)
    model = builder.model([conv_bn(builder, y, 3)])
    for node in model.graph.node:
        if node.output[0] in builder.training:
            node.attribute.append(helper.make_attribute("training_mode", 1))
    return model


def shared_conv_output(builder, y):
    """A Conv whose output a BN and a Relu both read: not private."""
    h = builder.conv(y, 6, 3, pads=1)
    return builder.node("Add", [builder.batchnorm(h), builder.node("Relu", [h])])


def bn_after_relu(builder, y):
    return builder.batchnorm(builder.node("Relu", [y]))


def bn_after_bn(builder, y):
    return builder.batchnorm(y)


def bn_in_training_mode(builder, y):
    out = builder.batchnorm(builder.conv(y, 6, 1))
    builder.training.append(out)
    return builder.node("Relu", [out])


# (graph, what the form does at the middle BN: "passes" it and folds the last one, or "stops")
MIDDLES = [(shared_conv_output, "stops"), (bn_after_relu, "passes"), (bn_after_bn, "stops"),
           (bn_in_training_mode, "stops")]


@pytest.mark.parametrize("middle,verdict", MIDDLES, ids=[m.__name__ for m, _ in MIDDLES])
@pytest.mark.parametrize("strategy", ["exact", "cost"])
def test_the_form_passes_what_never_matches_and_stops_at_what_it_cannot_see_through(middle, verdict, strategy):
    model = two_folds_around(GraphBuilder([1, 3, 7, 7], seed=3), middle)
    assert_same_outcome(model, strategy)
    whole, folds = folded_on_proto(model, strategy)
    assert (whole, len(folds)) == ((True, 2) if verdict == "passes" else (False, 1))


def test_a_bn_listed_before_the_bn_that_makes_its_input_stops_the_form():
    """The first BN in the list reads the second's output: once the second is folded its
    input is a Conv's, so it is not passed as a mismatch."""
    builder = GraphBuilder([1, 3, 7, 7], seed=4)
    y = builder.batchnorm(conv_bn(builder, "x"))
    model = builder.model([y])
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend([nodes[2], nodes[0], nodes[1]])
    outcome = assert_same_outcome(model)
    assert folded_on_proto(model) == (False, [])
    assert op_counts(outcome.model) == {"Conv": 1}


def with_edit(edit) -> onnx.ModelProto:
    builder = GraphBuilder([1, 3, 7, 7], seed=5)
    model = builder.model([conv_bn(builder, builder.node("Relu", [conv_bn(builder, "x")]))])
    edit(model)
    return model


def parameter_from_a_constant_node(model):
    bn = next(node for node in model.graph.node if node.op_type == "BatchNormalization")
    init = next(init for init in model.graph.initializer if init.name == bn.input[1])
    model.graph.node.insert(0, helper.make_node("Constant", [], [init.name], name="k", value=init))
    model.graph.initializer.remove(init)


def weight_as_a_graph_input(model):
    conv = next(node for node in model.graph.node if node.op_type == "Conv")
    init = next(init for init in model.graph.initializer if init.name == conv.input[1])
    model.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))


def unshaped_conv_output(model):
    conv = next(node for node in model.graph.node if node.op_type == "Conv")
    kept = [value for value in model.graph.value_info if value.name != conv.output[0]]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)


def parameter_of_another_length(model):
    bn = next(node for node in model.graph.node if node.op_type == "BatchNormalization")
    init = next(init for init in model.graph.initializer if init.name == bn.input[3])
    init.CopyFrom(onnx.numpy_helper.from_array(np.zeros(1, np.float32), init.name))


EDITS = [parameter_from_a_constant_node, weight_as_a_graph_input, unshaped_conv_output, parameter_of_another_length]


@pytest.mark.parametrize("edit", EDITS, ids=[edit.__name__ for edit in EDITS])
@pytest.mark.parametrize("strategy", ["exact", "cost"])
def test_the_first_fold_it_cannot_check_ends_the_form(edit, strategy):
    model = with_edit(edit)
    assert_same_outcome(model, strategy)
    assert folded_on_proto(model, strategy) == (False, [])


@pytest.mark.parametrize("limit", [0, 1, 2, 3, 4])
def test_limits(limit):
    builder = GraphBuilder([1, 3, 7, 7], seed=6)
    y = "x"
    for _ in range(3):
        y = builder.node("Relu", [conv_bn(builder, y)])
    model = builder.model([y])
    assert_same_outcome(model, "cost", limit)
    assert len(folded_on_proto(model, "cost", limit)[1]) == min(limit, 3)


def test_measure_is_left_to_the_engine():
    builder = GraphBuilder([1, 3, 7, 7], seed=7)
    model = builder.model([conv_bn(builder, "x")])
    assert folded_on_proto(model, "measure") == (False, [])


def test_the_folded_weights_and_the_report_are_the_engines():
    """The decision's numbers are there under cost (and replayed from `decided`)."""
    builder = GraphBuilder([1, 3, 7, 7], seed=8)
    model = builder.model([conv_bn(builder, "x")])
    outcome = assert_same_outcome(model, "cost")
    entry = outcome.applied[0]
    assert entry["rule"] == "conv-batchnorm" and entry["decision"]["method"] == "estimate"
    assert entry["decision"]["nodes_before"] == 2 and entry["decision"]["nodes_after"] == 1
    assert entry["flops_after"] < entry["flops_before"]


def test_a_parameter_read_twice_is_counted_as_the_engine_counts_it():
    """torch exports one initializer for a BN's equal running mean and bias (its shift and mean):
    the estimate counts a tensor a node reads twice twice, a tensor an earlier node read once."""
    builder = GraphBuilder([1, 3, 7, 7], seed=9)
    model = builder.model([conv_bn(builder, "x")])
    bn = next(node for node in model.graph.node if node.op_type == "BatchNormalization")
    bn.input[3] = bn.input[2]
    conv = next(node for node in model.graph.node if node.op_type == "Conv")
    conv.input[2] = bn.input[1]         # the Conv's bias is the BN's scale
    outcome = assert_same_outcome(model, "cost")
    assert folded_on_proto(model, "cost")[1] == [[conv.name, bn.name]]
    assert_same_outputs(model, outcome.model, builder.input_shape)


def random_chain(seed: int) -> onnx.ModelProto:
    """Conv-BN pairs and BNs elsewhere, some outputs shared, nodes sometimes shuffled."""
    rng = np.random.default_rng(seed)
    nd = int(rng.integers(1, 4))
    builder = GraphBuilder([1, 3, *[int(rng.integers(5, 9)) for _ in range(nd)]], seed=seed)
    y, kept = "x", []
    for _ in range(int(rng.integers(2, 6))):
        choice = rng.random()
        if choice < 0.55:
            y = conv_bn(builder, y, int(rng.integers(2, 6)), kernel=int(rng.integers(1, 4)), pads=1,
                        bias=bool(rng.random() < 0.5))
        elif choice < 0.7:
            y = builder.batchnorm(y)
        elif choice < 0.85:
            y = builder.node("Relu", [y])
        else:
            h = builder.conv(y, int(rng.integers(2, 6)), 1)
            kept.append(builder.node("Relu", [h]))
            y = builder.batchnorm(h)
    model = builder.model([y, *kept])
    if rng.random() < 0.3:
        nodes = list(model.graph.node)
        rng.shuffle(nodes)
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return model


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31 - 1), st.sampled_from(["exact", "cost"]))
def test_random_chains_come_out_the_same(seed, strategy):
    assert_same_outcome(random_chain(seed), strategy)


def test_the_random_chains_exercise_the_form():
    """Not vacuous: the form folds in most chains, makes its whole look in some, stops in others."""
    results = [folded_on_proto(random_chain(seed)) for seed in range(30)]
    assert sum(bool(folds) for _, folds in results) >= 15
    assert any(whole and folds for whole, folds in results) and any(not whole for whole, _ in results)
