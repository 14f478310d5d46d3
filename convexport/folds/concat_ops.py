"""Concat bookkeeping: nested Concats flattened, a tensor concatenated with itself as a Tile."""

from __future__ import annotations

import numpy as np

from ..algebra import Refusal
from .builder import NodeBuilder, output_dtype
from .primitives import Rewrite, builtin, consumes, reach


@builtin
@reach(1)
@consumes(root={"Concat"})
def flatten_concats(match, context) -> Rewrite:
    """Concat(a, Concat(b, c), d) on one axis -> Concat(a, b, c, d) when the inner one has no
    other reader."""
    root = match.root
    outputs = {id(t) for t in context.graph.outputs}
    rank = len(root.outputs[0].shape) if root.outputs[0].shape else None
    axis = root.attrs["axis"]

    def inner(tensor):
        producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
        if producer is None or producer.op != "Concat" or len(tensor.outputs) != 1 or id(tensor) in outputs:
            return None
        same_axis = producer.attrs["axis"] == axis or (rank and producer.attrs["axis"] % rank == axis % rank)
        return producer if same_axis else None

    flat, merged = [], 0
    for tensor in root.inputs:
        producer = inner(tensor)
        if producer is None:
            flat.append(tensor)
        else:
            flat.extend(producer.inputs)
            merged += 1
    if not merged:
        raise Refusal("no input is a Concat on the same axis read only here", reported=False)
    output = root.outputs[0]
    build = NodeBuilder(context, output_dtype(root), output.name + "_flat")
    result = build.node("Concat", flat, {"axis": axis}, shape=output.shape)
    return Rewrite(build.nodes, [(output, result)], f"{merged} nested Concat(s) flattened")


@builtin
@reach(0)
@consumes("parts", root={"Concat"})
def repeat_as_tile(match, context) -> Rewrite:
    """Concat(x, x, ..., x) (n times along axis a) -> Tile(x, repeats = n at a, 1 elsewhere)."""
    root, parts = match.root, match.values["parts"]
    shape = parts[0].shape
    if shape is None:
        raise Refusal("the repeated tensor's shape is unknown", reported=False)
    rank = len(shape)
    axis = root.attrs["axis"] % rank
    output = root.outputs[0]
    build = NodeBuilder(context, output_dtype(root), output.name + "_tiled")
    repeats = build.constant(np.array([len(parts) if i == axis else 1 for i in range(rank)], np.int64), "repeats")
    result = build.node("Tile", [parts[0], repeats], shape=output.shape)
    return Rewrite(build.nodes, [(output, result)], f"a tensor concatenated with itself {len(parts)} times as a Tile")
