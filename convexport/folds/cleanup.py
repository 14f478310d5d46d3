"""Primitives that remove nodes computing nothing at inference."""

from __future__ import annotations

import onnx

from ..graph import node_names, proto_subgraphs
from ..rewrite.primitives import EarlyRewrites, Rewrite, on_proto, reach


def forwarding_note(op: str) -> str:
    return f"{op} forwards its input unchanged"


def forward_identities_on_proto(model: onnx.ModelProto, rule, limit: int | None) -> EarlyRewrites | None:
    """forward_input's first look at the main graph for the rule `y = Identity(x)`, made on the
    proto (primitives.on_proto). A torch export that keeps BatchNorm unfolded reads every BN
    parameter through an Identity: on the bench's synthetic graph 2,078 of its 4,678 nodes,
    which as gs objects, matches and rewires took a fifth of optimize's time.

    In graph order, each Identity whose input (after the Identities before it) is an
    initializer or a graph input, and whose output is no graph output, goes, and its output's
    readers read its input: what the engine does with forward_input's rewrite when the
    replacement has no producer to take the output over. The first Identity that is not such
    ends this, so the engine's own look carries on from where it would have been: one whose
    input a node makes is taken over by that node, which names a placeholder from the
    engine's name generator, and one whose output is a graph output is refused there.
    Nameless nodes are named first as import_graph names them. Declines (None) for any other
    pattern, a rule with conditions, a graph with subgraphs (they read outer tensors by
    name), and a graph where it finds nothing to do."""
    if not _is_plain_identity_rule(rule) or limit == 0:
        return None
    graph = model.graph
    ops = [node.op_type for node in graph.node]
    if "Identity" not in ops or any(proto_subgraphs(node) for node in graph.node):
        return None
    sources = {init.name for init in graph.initializer} | {value.name for value in graph.input}
    outputs = {value.name for value in graph.output}
    forwarded: dict[str, str] = {}          # an Identity's output -> the source its readers read now
    removed: list[int] = []
    for index, op in enumerate(ops):
        if op != "Identity":
            continue
        node = graph.node[index]
        if node.domain not in ("", "ai.onnx") or len(node.input) != 1 or len(node.output) != 1:
            break
        source = forwarded.get(node.input[0], node.input[0])
        if not source or source not in sources or node.output[0] in outputs:
            break
        forwarded[node.output[0]] = source
        removed.append(index)
        if len(removed) == limit:
            break
    if not removed:
        return None
    given = [node.name for node in graph.node]
    names = given if all(given) else node_names(list(zip(ops, given)))
    note = forwarding_note("Identity")
    return EarlyRewrites(_without(model, names, given, removed, forwarded),
                         [(names[index], note) for index in removed])


def _without(model: onnx.ModelProto, names: list[str], given: list[str], removed: list[int],
             forwarded: dict[str, str]) -> onnx.ModelProto:
    """A copy of model with its nodes named `names` (where their `given` names are empty), the
    `removed` nodes gone, their outputs' readers reading the sources in `forwarded`, and those
    outputs' value_info dropped."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    nodes = copy.graph.node
    for index in [index for index, name in enumerate(given) if not name]:
        nodes[index].name = names[index]
    gone = set(removed)
    for index, node in enumerate(nodes):
        if index in gone:
            continue
        inputs = node.input
        for position, name_read in enumerate(inputs):
            if name_read in forwarded:
                inputs[position] = forwarded[name_read]
    for index in reversed(removed):
        del nodes[index]
    value_info = copy.graph.value_info
    for index in reversed([i for i, value in enumerate(value_info) if value.name in forwarded]):
        del value_info[index]
    return copy


def _is_plain_identity_rule(rule) -> bool:
    """The rule is `y = Identity(x)` and nothing more: no attributes, no conditions, plain names."""
    if len(rule.pattern) != 1 or rule.where or rule.require:
        return False
    line = rule.pattern[0]
    plain = [ref for ref in (*line.outputs, *line.inputs)
             if not (ref.per_element or ref.optional or ref.variadic or ref.constant or ref.wildcard)]
    return line.op_type == "Identity" and not line.attributes and len(line.outputs) == len(line.inputs) == 1 \
        and len(plain) == 2


@reach(0)
@on_proto(forward_identities_on_proto)
def forward_input(match, context) -> Rewrite:
    """The root's output is its first input (Identity, Dropout in inference)."""
    root = match.root
    return Rewrite(nodes=[], replace=[(root.outputs[0], root.inputs[0])], note=forwarding_note(root.op))
