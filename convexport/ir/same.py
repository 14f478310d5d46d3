"""Whether two models compute alike node for node: the same inputs, outputs, operators with the
same attributes reading the same values, in the same order, whatever the tensors are named.
A model the rewrite left as it was (constant folding renamed a value, say) needs no timing."""

from __future__ import annotations

import hashlib

import onnx

from .large import kept_from_serialisation


def same_computation(one: onnx.ModelProto, other: onnx.ModelProto) -> bool:
    """True where `other` is `one` with its tensors renamed; False where that cannot be told
    cheaply (a model whose weights stay in their files) or they differ."""
    if one is other:
        return True
    if kept_from_serialisation(one) or kept_from_serialisation(other):
        return False
    return _canonical(one) == _canonical(other)


def _canonical(model: onnx.ModelProto) -> tuple:
    """The model's computation with each tensor named by what it is: a graph input by its place,
    an initializer by its type, shape and bytes, a node's output by the node's place and slot."""
    graph = model.graph
    names: dict[str, str] = {"": ""}
    for index, value in enumerate(graph.input):
        names[value.name] = f"input{index}:{value.type.SerializeToString().hex()}"
    for tensor in graph.initializer:
        digest = hashlib.sha1(tensor.raw_data or tensor.SerializeToString()).hexdigest()
        names.setdefault(tensor.name, f"init:{tensor.data_type}:{list(tensor.dims)}:{digest}")
    nodes = []
    for index, node in enumerate(graph.node):
        inputs = tuple(names.get(name, f"unknown:{name}") for name in node.input)
        for slot, name in enumerate(node.output):
            names[name] = f"node{index}:{slot}"
        attributes = tuple(sorted((a.name, _attribute_bytes(a)) for a in node.attribute))
        nodes.append((node.domain, node.op_type, inputs, len(node.output), attributes))
    outputs = tuple((names.get(value.name, value.name), value.type.SerializeToString()) for value in graph.output)
    opsets = tuple(sorted((o.domain, o.version) for o in model.opset_import))
    return opsets, tuple(nodes), outputs


def _attribute_bytes(attribute: onnx.AttributeProto) -> bytes:
    copy = onnx.AttributeProto()
    copy.CopyFrom(attribute)
    copy.ClearField("doc_string")
    return copy.SerializeToString()
