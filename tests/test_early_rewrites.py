"""drop-identity's first look made on the proto (folds/cleanup.py, primitives.on_proto): the
engine must come out exactly as it does when it makes those rewrites itself."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

from convexport.folds.cleanup import forward_identities_on_proto, forward_input
from convexport.rewrite.engine import rewrite_model
from convexport.rewrite.primitives import builtin_primitives, proto_form_of, reach
from convexport.rewrite.rulefile import parse_rule_file
from graphs import RULES, assert_same_outputs
from helpers import make_model, op_counts, tensor
from test_random_graphs import FUZZ_EXAMPLES, random_graph

RNG = np.random.default_rng(7)
DROP_IDENTITY = RULES[0]


def without_proto_form() -> dict:
    """The built-in primitives, forward_input without its proto form: the engine does it all."""
    return {**builtin_primitives(), "forward_input": reach(0)(lambda match, context: forward_input(match, context))}


def both_ways(model, strategy="exact", limit=None):
    """(outcome with the proto form, outcome without), the input left as it was."""
    before = model.SerializeToString()
    early = rewrite_model(model, RULES, builtin_primitives(), strategy, limit=limit)
    engine = rewrite_model(model, RULES, without_proto_form(), strategy, limit=limit)
    assert model.SerializeToString() == before
    return early, engine


def assert_same_outcome(model, strategy="exact", limit=None):
    early, engine = both_ways(model, strategy, limit)
    assert early.applied == engine.applied
    assert early.skipped == engine.skipped
    assert early.passes == engine.passes
    assert early.model.SerializeToString() == engine.model.SerializeToString()
    return early


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


@pytest.mark.parametrize("strategy", ["exact", "cost"])      # measure: timings differ run to run
@pytest.mark.parametrize("named", [True, False])
@pytest.mark.parametrize("shuffled", [False, True])
def test_bn_parameters_through_identities(strategy, named, shuffled):
    model = conv_bn_through_identities(named, shuffled)
    outcome = assert_same_outcome(model, strategy)
    assert op_counts(outcome.model) == {"Conv": 1, "Relu": 1}
    assert [entry["rule"] for entry in outcome.applied] == ["drop-identity"] * 4 + ["conv-batchnorm"]
    assert_same_outputs(model, outcome.model, [1, 4, 6, 6])


def test_the_proto_form_removes_what_the_engine_would_have_imported():
    early = forward_identities_on_proto(conv_bn_through_identities(named=False), DROP_IDENTITY, None)
    assert [node.op_type for node in early.model.graph.node] == ["Conv", "BatchNormalization", "Relu"]
    assert list(early.model.graph.node[1].input) == ["c", "s", "t", "m", "v"]
    assert [name for name, _ in early.rewrites] == ["Identity_0", "Identity_1", "Identity_2", "Identity_3"]


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
    outcome = assert_same_outcome(model, "cost", limit)
    assert_same_outputs(model, outcome.model, [2, 3, 4, 4])


def test_an_identity_made_by_a_node_ends_the_proto_form():
    early = forward_identities_on_proto(chain_model("Relu"), DROP_IDENTITY, None)
    assert [name for name, _ in early.rewrites] == ["i1", "i2", "i3"]      # not i4, nor i5 after it


def test_an_identity_giving_a_graph_output_ends_it_before_it_starts():
    assert forward_identities_on_proto(chain_model(output_identity=True), DROP_IDENTITY, None) is None


def test_the_proto_form_declines_graphs_with_subgraphs():
    branch = helper.make_graph([helper.make_node("Identity", ["w1"], ["o"])], "branch", [],
                               [helper.make_tensor_value_info("o", onnx.TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Identity", ["w"], ["w1"], name="i1"),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch, else_branch=branch)]
    model = make_model(nodes, [tensor("c", [], onnx.TensorProto.BOOL)], [tensor("y", None)],
                       {"w": np.ones(3, np.float32)})
    assert forward_identities_on_proto(model, DROP_IDENTITY, None) is None
    assert_same_outcome(model)


def test_the_proto_form_declines_other_patterns(tmp_path):
    text = ("rules:\n"
            "  - name: a\n    doc: d\n    match: [y = Identity(x:const)]\n    apply: forward_input\n"
            "  - name: b\n    doc: d\n    match: [y = Identity(x)]\n    where: {static_shape: [x]}\n    apply: forward_input\n"
            "  - name: c\n    doc: d\n    match: [y = Identity(x)]\n    apply: forward_input\n")
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    constant_only, conditioned, plain = parse_rule_file(path, set(builtin_primitives()))
    model = conv_bn_through_identities()
    assert forward_identities_on_proto(model, constant_only, None) is None
    assert forward_identities_on_proto(model, conditioned, None) is None
    assert forward_identities_on_proto(model, plain, None) is not None
    assert proto_form_of(builtin_primitives()["forward_input"]) is forward_identities_on_proto


def test_only_the_first_rule_gets_it():
    """After another rule has looked, the state the proto form starts from is not the model's."""
    model = conv_bn_through_identities()
    later = rewrite_model(model, [*RULES[1:], RULES[0]], builtin_primitives(), "exact")
    engine = rewrite_model(model, [*RULES[1:], RULES[0]], without_proto_form(), "exact")
    assert later.applied == engine.applied and later.model.SerializeToString() == engine.model.SerializeToString()


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
    if rng.random() < 0.3:
        nodes.append(helper.make_node("Identity", [graph.initializer[0].name], ["also_out"], name="out_id"))
        outputs.append(tensor("also_out", None))
    return make_model(nodes, list(graph.input), outputs,
                      {init.name: onnx.numpy_helper.to_array(init) for init in graph.initializer})


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31 - 1), st.sampled_from(["exact", "cost"]))
def test_random_graphs_with_identities_come_out_the_same(seed, strategy):
    builder, y = random_graph(seed)
    model = with_identities(builder.model([y]), np.random.default_rng(seed))
    outcome = assert_same_outcome(model, strategy)
    assert_same_outputs(model, outcome.model, builder.input_shape, seed=seed)


def test_the_random_graphs_exercise_the_proto_form():
    """The generator is not vacuous: in most graphs the proto form removes Identities, in some
    all of them, in others it stops and leaves the rest to the engine."""
    removed, remaining = [], []
    for seed in range(20):
        builder, y = random_graph(seed)
        model = with_identities(builder.model([y]), np.random.default_rng(seed))
        early = forward_identities_on_proto(model, DROP_IDENTITY, None)
        removed.append(0 if early is None else len(early.rewrites))
        remaining.append(sum(node.op_type == "Identity" for node in model.graph.node) - removed[-1])
    assert sum(count > 0 for count in removed) >= 12, removed
    assert any(count > 1 and left == 0 for count, left in zip(removed, remaining)), (removed, remaining)
    assert any(count > 1 and left > 0 for count, left in zip(removed, remaining)), (removed, remaining)
