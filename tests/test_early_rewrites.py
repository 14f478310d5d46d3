"""drop-identity's first look made on the proto (folds/cleanup.py, rewrite/proto_look.py): the
engine must come out exactly as it does when it makes those rewrites itself."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

from convexport.folds.cleanup import forward_identities_on_proto, forward_input
from convexport.folds.conv_chain import compose_linear
from convexport.rewrite.engine import _leading_looks, rewrite_model
from convexport.rewrite.primitives import builtin_primitives, proto_form_of, reach
from convexport.rewrite.proto_look import ProtoLook
from convexport.rewrite.rulefile import parse_rule_file
from graphs import RULES, assert_same_outputs
from helpers import make_model, op_counts, tensor
from test_random_graphs import FUZZ_EXAMPLES, random_graph

RNG = np.random.default_rng(7)
DROP_IDENTITY = RULES[0]


def without_proto_forms() -> dict:
    """The built-in primitives without their proto forms: the engine does it all."""
    return {**builtin_primitives(), "forward_input": reach(0)(lambda match, context: forward_input(match, context)),
            "compose_linear": reach(0)(lambda match, context: compose_linear(match, context))}


def both_ways(model, strategy="exact", limit=None, rules=RULES):
    """(outcome with the proto forms, outcome without), the input left as it was."""
    before = model.SerializeToString()
    early = rewrite_model(model, rules, builtin_primitives(), strategy, limit=limit)
    engine = rewrite_model(model, rules, without_proto_forms(), strategy, limit=limit)
    assert model.SerializeToString() == before
    return early, engine


def assert_same_outcome(model, strategy="exact", limit=None, rules=RULES):
    early, engine = both_ways(model, strategy, limit, rules)
    assert early.applied == engine.applied
    assert early.skipped == engine.skipped
    assert early.passes == engine.passes
    assert early.model.SerializeToString() == engine.model.SerializeToString()
    return early


def look_at(model, rule=DROP_IDENTITY, form=forward_identities_on_proto, strategy="exact", limit=None):
    """(whether `form` made the whole look, the look) on a fresh ProtoLook of model."""
    look = ProtoLook(model, 18, strategy, "cpu", {}, limit)
    return form(look, rule), look


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
    whole, look = look_at(conv_bn_through_identities(named=False))
    model = look.model()
    assert whole
    assert [node.op_type for node in model.graph.node] == ["Conv", "BatchNormalization", "Relu"]
    assert [node.name for node in model.graph.node] == ["Conv_4", "BatchNormalization_5", "Relu_6"]
    assert list(model.graph.node[1].input) == ["c", "s", "t", "m", "v"]
    assert [names for _, names, _ in look.applied] == [["Identity_0"], ["Identity_1"], ["Identity_2"], ["Identity_3"]]
    assert not {value.name for value in model.graph.value_info} & {"s_id", "t_id", "m_id", "v_id"}


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
    whole, look = look_at(chain_model("Relu"))
    assert not whole
    assert [names for _, names, _ in look.applied] == [["i1"], ["i2"], ["i3"]]     # not i4, nor i5 after it


def test_an_identity_giving_a_graph_output_ends_it_before_it_starts():
    whole, look = look_at(chain_model(output_identity=True))
    assert not whole and not look.applied and look.model() is look.source


def test_the_proto_form_declines_graphs_with_subgraphs():
    branch = helper.make_graph([helper.make_node("Identity", ["w1"], ["o"])], "branch", [],
                               [helper.make_tensor_value_info("o", onnx.TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Identity", ["w"], ["w1"], name="i1"),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch, else_branch=branch)]
    model = make_model(nodes, [tensor("c", [], onnx.TensorProto.BOOL)], [tensor("y", None)],
                       {"w": np.ones(3, np.float32)})
    whole, look = look_at(model)
    assert not whole and not look.applied
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
    assert not look_at(model, constant_only)[0] and not look_at(model, constant_only)[1].applied
    assert not look_at(model, conditioned)[0] and not look_at(model, conditioned)[1].applied
    assert look_at(model, plain)[0]
    assert proto_form_of(builtin_primitives()["forward_input"]) is forward_identities_on_proto


def test_only_leading_rules_get_it():
    """After a rule without a proto form has looked, the state a proto form would start from
    is not the model's: drop-identity last, behind conv-mul (whose Conv and Mul the model has)."""
    model = make_model([helper.make_node("Identity", ["k"], ["k1"], name="i"),
                        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
                        helper.make_node("Mul", ["c", "k1"], ["y"], name="mul")],
                       [tensor("x", [1, 2, 5, 5])], [tensor("y", None)],
                       {"w": RNG.standard_normal([3, 2, 1, 1]).astype(np.float32),
                        "k": RNG.uniform(0.5, 2, [1, 3, 1, 1]).astype(np.float32)})
    conv_mul = next(rule for rule in RULES if rule.name == "conv-mul")
    rules = [conv_mul, DROP_IDENTITY]
    assert not _leading_looks(ProtoLook(model, 18, "exact", "cpu", {}, None), rules, builtin_primitives()).applied
    outcome = assert_same_outcome(model, rules=rules)
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
        removed.append(len(look_at(model)[1].applied))
        remaining.append(sum(node.op_type == "Identity" for node in model.graph.node) - removed[-1])
    assert sum(count > 0 for count in removed) >= 12, removed
    assert any(count > 1 and left == 0 for count, left in zip(removed, remaining)), (removed, remaining)
    assert any(count > 1 and left > 0 for count, left in zip(removed, remaining)), (removed, remaining)
