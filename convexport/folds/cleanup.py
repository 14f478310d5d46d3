"""Primitives that remove nodes computing nothing at inference."""

from __future__ import annotations

from ..rewrite.decisions import by_estimate
from ..rewrite.primitives import Rewrite, on_proto, reach


def forwarding_note(op: str) -> str:
    return f"{op} forwards its input unchanged"


def forward_identities_on_proto(look, rule) -> bool:
    """forward_input's first look at the main graph for the rule `y = Identity(x)`, made on the
    proto (rewrite/proto_look.py). A torch export that keeps BatchNorm unfolded reads every BN
    parameter through an Identity: on the bench's synthetic graph 2,078 of its 4,678 nodes,
    which as gs objects, matches and rewires took a fifth of optimize's time.

    In graph order, each Identity whose input (after the Identities before it) is an
    initializer or a graph input, and whose output is no graph output, goes, and its output's
    readers read its input: what the engine does with forward_input's rewrite when the
    replacement has no producer to take the output over. The first Identity that is not such
    ends this (False: the look is not whole), so the engine's own look carries on from where
    it would have been: one whose input a node makes is taken over by that node, which names a
    placeholder from the engine's name generator, and one whose output is a graph output is
    refused there. False at once for any other pattern, a rule with conditions, and a graph
    with subgraphs (they read outer tensors by name)."""
    if not _is_plain_identity_rule(rule) or look.has_subgraphs():
        return False
    graph = look.source.graph
    sources = {init.name for init in graph.initializer} | {value.name for value in graph.input}
    outputs = {value.name for value in graph.output}
    note, names = forwarding_note("Identity"), look.names()
    for index, op in enumerate(look.ops):
        if op != "Identity" or index in look.removed:
            continue
        node = look.nodes[index]
        if not look.has_room() or node.domain not in ("", "ai.onnx") or len(node.input) != 1 or len(node.output) != 1:
            return False
        source = look.forwarded.get(node.input[0], node.input[0])
        if not source or source not in sources or node.output[0] in outputs:
            return False
        rewrite = Rewrite([], [], note)
        if not look.judged(rule, [names[index]], rewrite, lambda: by_estimate(rewrite, look.opset, look.device, set())):
            return False
        look.forward(index, node.output[0], source)
        look.record(rule, [names[index]], rewrite)
    return True


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
