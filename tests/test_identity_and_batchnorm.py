"""drop-identity and conv-batchnorm on graphs as torch exports them (each BN parameter read
through an Identity, nameless nodes, Identities placed after their readers, Identity chains,
an Identity giving a graph output), and under a rewrite limit: the engine's results must
compute what the model does and leave the input as it was."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

import onnx
from convexport.rewrite.engine import RewriteSettings, rewrite_model
from convexport.folds import builtin_primitives
from graphs import RULES, assert_same_outputs
from helpers import make_model, op_counts, tensor
from test_random_graphs import FUZZ_EXAMPLES, random_graph

RNG = np.random.default_rng(7)


def rewritten(model, strategy="all", limit=None, rules=RULES):
    """The engine's outcome; the input left as it was."""
    before = model.SerializeToString()
    outcome = rewrite_model(model, rules, builtin_primitives(), RewriteSettings(strategy), limit=limit)
    assert model.SerializeToString() == before
    return outcome


def conv_bn_through_identities(named=True, shuffled=False):
    """A torch export that keeps BatchNorm: each BN parameter read through an Identity."""
    weights = {"w": RNG.standard_normal([8, 4, 3, 3]).astype(np.float32),
               **{k: RNG.uniform(0.5, 2, 8).astype(np.float32) for k in ("s", "t", "m", "v")}}
    identities = [helper.make_node("Identity", [k], [k + "_id"], name=f"id_{k}" if named else "") for k in "stmv"]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv" if named else "", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s_id", "t_id", "m_id", "v_id"], ["bn"],
                              name="bn" if named else ""),
             helper.make_node("Relu", ["bn"], ["y"], name="relu" if named else "")]
    nodes = nodes + identities if shuffled else identities + nodes      # readers before the Identities
    return make_model(nodes, [tensor("x", [1, 4, 6, 6])], [tensor("y", None)], weights)


@pytest.mark.parametrize("strategy", ["all", "cost"])      # measure: timings differ run to run
@pytest.mark.parametrize("named", [True, False])
@pytest.mark.parametrize("shuffled", [False, True])
def test_bn_parameters_through_identities(strategy, named, shuffled):
    model = conv_bn_through_identities(named, shuffled)
    outcome = rewritten(model, strategy)
    assert op_counts(outcome.model) == {"Conv": 1, "Relu": 1}
    assert [entry["rule"] for entry in outcome.applied] == ["drop-identity"] * 4 + ["conv-batchnorm"]
    assert_same_outputs(model, outcome.model, [1, 4, 6, 6])


def chain_model(middle_op=None, output_identity=False):
    """w -> Identity -> Identity -> Mul's weight; x -> Identity -> Mul's data; a third Identity of
    `middle_op`'s output (made by a node: the engine's takeover) before another constant one."""
    weights = {"w": RNG.uniform(0.5, 2, [1, 3, 1, 1]).astype(np.float32),
               "k": RNG.uniform(0.5, 2, [1, 3, 1, 1]).astype(np.float32)}
    nodes = [helper.make_node("Identity", ["w"], ["w1"], name="i1"),
             helper.make_node("Identity", ["w1"], ["w2"], name="i2"),
             helper.make_node("Identity", ["x"], ["x1"], name="i3"),
             helper.make_node("Mul", ["x1", "w2"], ["m"], name="mul")]
    last = "m"
    if middle_op:
        nodes += [helper.make_node(middle_op, ["m"], ["r"], name="middle"),
                  helper.make_node("Identity", ["r"], ["r1"], name="i4")]
        last = "r1"
    nodes += [helper.make_node("Identity", ["k"], ["k1"], name="i5"),
              helper.make_node("Add", [last, "k1"], ["y"], name="add")]
    outputs = [tensor("y", None)]
    if output_identity:
        nodes.insert(0, helper.make_node("Identity", ["k"], ["z"], name="i0"))
        outputs.append(tensor("z", None))
    return make_model(nodes, [tensor("x", [2, 3, 4, 4])], outputs, weights)


@pytest.mark.parametrize("middle_op", [None, "Relu"])
@pytest.mark.parametrize("output_identity", [False, True])
@pytest.mark.parametrize("limit", [None, 0, 1, 2, 3, 4, 6])
def test_chains_takeovers_graph_outputs_and_limits(middle_op, output_identity, limit):
    model = chain_model(middle_op, output_identity)
    outcome = rewritten(model, "cost", limit)
    if limit is not None:
        assert len(outcome.applied) <= limit
    assert_same_outputs(model, outcome.model, [2, 3, 4, 4])
    if limit is None:
        assert "Identity" not in op_counts(outcome.model) or output_identity


def test_an_identity_in_a_branch_reading_an_outer_weight():
    """An If branch's Identity of a weight from the outer scope: forwarded within its scope."""
    branch = helper.make_graph([helper.make_node("Identity", ["w1"], ["o1"]), helper.make_node("Relu", ["o1"], ["o"])],
                               "branch", [], [helper.make_tensor_value_info("o", onnx.TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Identity", ["w"], ["w1"], name="i1"),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch, else_branch=branch)]
    model = make_model(nodes, [tensor("c", [], onnx.TensorProto.BOOL)], [tensor("y", None)],
                       {"w": np.ones(3, np.float32)})
    outcome = rewritten(model)
    assert op_counts(outcome.model) == {"If": 1}
    onnx.checker.check_model(outcome.model, full_check=True)


def test_a_reader_rewired_to_a_constant_is_looked_at_again():
    """drop-identity after conv-mul: the Mul reads the constant only once the Identity is
    gone, and conv-mul, which looked earlier in the pass, folds it in the next."""
    model = make_model([helper.make_node("Identity", ["k"], ["k1"], name="i"),
                        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
                        helper.make_node("Mul", ["c", "k1"], ["y"], name="mul")],
                       [tensor("x", [1, 2, 5, 5])], [tensor("y", None)],
                       {"w": RNG.standard_normal([3, 2, 1, 1]).astype(np.float32),
                        "k": RNG.uniform(0.5, 2, [1, 3, 1, 1]).astype(np.float32)})
    conv_mul = next(rule for rule in RULES if rule.name == "conv-mul")
    outcome = rewritten(model, rules=[conv_mul, RULES[0]])
    assert [entry["rule"] for entry in outcome.applied] == ["drop-identity", "conv-mul"]


def with_identities(model: onnx.ModelProto, rng) -> onnx.ModelProto:
    """The model with some of its weights and its input read through Identity chains (some
    nodes nameless, some placed after their readers), an Identity of a computed tensor
    somewhere, and sometimes an Identity giving a graph output."""
    graph = model.graph
    nodes = list(graph.node)
    sources = [init.name for init in graph.initializer] + ["x"]
    inserted = []
    for index, node in enumerate(nodes):
        for position, name in enumerate(node.input):
            if name in sources and rng.random() < 0.6:
                for depth in range(int(rng.integers(1, 3))):
                    forwarded = f"{name}_via{index}_{position}_{depth}"
                    inserted.append(helper.make_node("Identity", [name], [forwarded],
                                                     name="" if rng.random() < 0.3 else forwarded + "_node"))
                    name = forwarded
                node.input[position] = name
    if len(nodes) > 1 and rng.random() < 0.5:       # an Identity of a computed tensor: a takeover
        made = nodes[0].output[0]
        nodes.insert(1, helper.make_node("Identity", [made], [made + "_fwd"], name=made + "_fwd_node"))
        for node in nodes[2:]:
            node.input[:] = [made + "_fwd" if name == made else name for name in node.input]
    for node in inserted:
        nodes.insert(int(rng.integers(0, len(nodes) + 1)), node)
    outputs = list(graph.output)
    if graph.initializer and rng.random() < 0.3:   # (a random graph of Relus alone has no weights)
        nodes.append(helper.make_node("Identity", [graph.initializer[0].name], ["also_out"], name="out_id"))
        outputs.append(tensor("also_out", None))
    return make_model(nodes, list(graph.input), outputs,
                      {init.name: onnx.numpy_helper.to_array(init) for init in graph.initializer})


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31 - 1), st.sampled_from(["all", "cost"]))
def test_random_graphs_with_identities_come_out_the_same(seed, strategy):
    builder, y = random_graph(seed)
    model = with_identities(builder.model([y]), np.random.default_rng(seed))
    outcome = rewritten(model, strategy)
    assert_same_outputs(model, outcome.model, builder.input_shape, seed=seed)


def test_the_random_graphs_have_identities_to_forward():
    """The generator is not vacuous: most graphs get Identities, and the engine forwards them."""
    forwarded = []
    for seed in range(20):
        builder, y = random_graph(seed)
        model = with_identities(builder.model([y]), np.random.default_rng(seed))
        outcome = rewritten(model)
        forwarded.append(sum(entry["rule"] == "drop-identity" for entry in outcome.applied))
    assert sum(count > 0 for count in forwarded) >= 12, forwarded
