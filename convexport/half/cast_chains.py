"""Widening Casts merged through ops that only move values.

`Cast(to=B)` of a tensor of type A, read (through none or more of MOVES_VALUES, each the only
reader of what it reads) by `Cast(to=C)`, is `Cast(to=C)` of the tensor followed by the same
ops, exactly, when A -> B is exact (B holds every value of A: float16 or bfloat16 into float32
or float64, float32 into float64): the B values are the A values, the ops between move them
without arithmetic, and the second Cast rounds the same numbers. C is a float type the ops
between have kernels for (MOVED_IN). Where C is A the pair does nothing and both go.

The conversion makes such chains where a float32 tail reads a half tensor and the model
casts the result on itself: a detector's box distances cast to float32 for the tail, then
reshaped and cast to float64 by the model (one Cast, not two; the file's error unchanged).
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from ..ir import proto_subgraphs, read_as
from ..ir.slots import TYPE_TAGS

WIDENS = {
    (TensorProto.FLOAT16, TensorProto.FLOAT), (TensorProto.FLOAT16, TensorProto.DOUBLE),
    (TensorProto.BFLOAT16, TensorProto.FLOAT), (TensorProto.BFLOAT16, TensorProto.DOUBLE),
    (TensorProto.FLOAT, TensorProto.DOUBLE),
}  # fmt: skip
# the types the ops between may then move: those ONNX Runtime's CPU and CUDA kernels of them all take
MOVED_IN = {TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE}
# ops whose first input is data they only move or repeat, of any type, to their one output
MOVES_VALUES = {
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Expand", "Tile", "Slice",
    "DepthToSpace", "SpaceToDepth", "Gather",
}  # fmt: skip


def merge_widening_casts(graph: onnx.GraphProto, types: dict[str, int]) -> int:
    """Merge the chains of the module doc in `graph`'s main node list, in place; `types` gives
    each tensor's element type by name (updated for the tensors whose type changes). How many
    Casts went."""
    removed = 0
    while (chain := _first_chain(graph, types)) is not None:
        removed += _merged(graph, types, *chain)
    return removed


def _first_chain(graph, types) -> tuple[onnx.NodeProto, list[onnx.NodeProto], onnx.NodeProto] | None:
    """The first (widening Cast, ops between, second Cast) in node order, or None."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in [*node.input, *_read_inside(node)]:
            readers.setdefault(name, []).append(node)
    outputs = {value.name for value in graph.output}
    for node in graph.node:
        if node.op_type != "Cast" or (types.get(node.input[0]), cast_to(node)) not in WIDENS:
            continue
        between: list[onnx.NodeProto] = []
        tensor = node.output[0]
        while tensor not in outputs and len(readers.get(tensor, ())) == 1:
            (reader,) = readers[tensor]
            if reader.op_type == "Cast":
                if cast_to(reader) in MOVED_IN:
                    return node, between, reader
                break
            if reader.op_type not in MOVES_VALUES or reader.domain not in ("", "ai.onnx"):
                break
            if list(reader.input).count(tensor) != 1 or reader.input[0] != tensor or len(reader.output) != 1:
                break
            between.append(reader)
            tensor = reader.output[0]
    return None


def _merged(graph, types, first: onnx.NodeProto, between: list[onnx.NodeProto], second: onnx.NodeProto) -> int:
    """`first` casts to what `second` did and `second` goes, the last op before it writing its
    output; where that makes `first` a Cast to its input's own type, it goes too (unless its
    output is a graph output). The Casts removed."""
    target = cast_to(second)
    assert target is not None, "a Cast names its type"
    last = between[-1] if between else first
    moved = [first.output[0]] + [node.output[0] for node in between[:-1]]
    last.output[0] = second.output[0]
    for name in moved:
        types[name] = target
    _retype_value_info(graph, moved, target)
    drop_value_info(graph, {second.input[0]})
    graph.node.remove(second)
    for attribute in first.attribute:
        if attribute.name == "to":
            attribute.i = target
    _renamed_for(graph, first, target)
    types[first.output[0]] = target
    if types.get(first.input[0]) != target or first.output[0] in {value.name for value in graph.output}:
        return 1
    read_as(graph, first.output[0], first.input[0])
    drop_value_info(graph, {first.output[0]})
    graph.node.remove(first)
    return 2


def _renamed_for(graph, cast: onnx.NodeProto, target: int) -> None:
    """The conversion's Cast (`NAME__as_f32`, convert.py) named for the type it now makes."""
    old = cast.output[0]
    if old != f"{cast.input[0]}__as_f32" or target not in TYPE_TAGS:
        return
    new = f"{cast.input[0]}__as_{TYPE_TAGS[target]}"
    if any(new in node.output for node in graph.node):
        return
    cast.output[0], cast.name = new, f"{new}__cast"
    read_as(graph, old, new)
    for value in graph.value_info:
        if value.name == old:
            value.name = new


def _read_inside(node: onnx.NodeProto) -> set[str]:
    """The names the subgraphs of `node` (If, Loop, Scan) read: a tensor read there has a
    reader beside the chain."""
    names: set[str] = set()
    for subgraph in proto_subgraphs(node):
        for inner in subgraph.node:
            names.update(inner.input)
            names.update(_read_inside(inner))
    return names


def cast_to(cast: onnx.NodeProto) -> int | None:
    """The element type a Cast makes."""
    return next((attribute.i for attribute in cast.attribute if attribute.name == "to"), None)


def _retype_value_info(graph, names: list[str], elem_type: int) -> None:
    wanted = set(names)
    for value in graph.value_info:
        if value.name in wanted:
            value.type.tensor_type.elem_type = elem_type


def drop_value_info(graph: onnx.GraphProto, names: set[str]) -> None:
    """`graph`'s value_info less that of the tensors `names` (which no node makes any more)."""
    kept = [value for value in graph.value_info if value.name not in names]
    if len(kept) != len(graph.value_info):
        del graph.value_info[:]
        graph.value_info.extend(kept)
