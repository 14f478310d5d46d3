"""A per-channel affine map after a channel Concat, folded into the Convs that make its parts.

    y = s * Concat(p_1, ..., p_n) + h  (s, h [C], C = sum of the parts' channels C_i)
      = Concat(s_1 * p_1 + h_1, ..., s_n * p_n + h_n)     s_i, h_i: the parts' slices of s, h

and each s_i * Conv_i(x_i) + h_i is Conv_i with its weight rows scaled and its bias shifted
(scale_shift_onnx_weight), whatever the inputs x_i are. A part whose slice is the identity
(s_i = 1, h_i = 0) stays as it is.
"""

from __future__ import annotations

import numpy as np

from .. import ir
from ..algebra import Refusal, scale_shift_onnx_weight
from .builder import NodeBuilder, output_dtype
from .convnodes import conv_attributes, conv_weights
from .linear_nodes import channel_affine
from .primitives import AFFINE, Rewrite, builtin, consumes, reach


@builtin
@reach(1)
@consumes("c", "parts", c={"Concat"}, parts={"Conv"}, root=AFFINE)
def affine_into_concat_parts(match, context) -> Rewrite:
    """y = affine(Concat[axis=1](*parts)) -> Concat(Conv_i'(x_i)): every part that the map
    changes must come from a Conv with constant weights that only this Concat reads (else the
    map would stay, as one node per part)."""
    concat, root = match.nodes["c"], match.root
    affine = channel_affine(root, context.opset)
    if affine is None:
        raise Refusal(f"{root.name}: {root.op} is no per-channel map", reported=False)
    scale, shift = affine
    graph_outputs = {id(t) for t in context.graph.outputs}
    build = NodeBuilder(context, output_dtype(root))
    parts, start = [], 0
    for index, part in enumerate(concat.inputs):
        channels = part.shape[1] if part.shape is not None and len(part.shape) >= 3 else None
        if not isinstance(channels, int):
            raise Refusal(f"{concat.name}: the channel count of part {index} ({part.name}) is unknown")
        slice_scale, slice_shift = scale[start : start + channels], shift[start : start + channels]
        start += channels
        if np.all(slice_scale == 1.0) and not np.any(slice_shift):
            parts.append(part)
            continue
        parts.append(_scaled_part(part, index, slice_scale, slice_shift, concat, graph_outputs, build))
    if start != scale.shape[0]:
        raise Refusal(f"{concat.name}: its parts have {start} channels, the map {scale.shape[0]}")
    output = root.outputs[0]
    convs = len(build.nodes)
    joined = build.node("Concat", parts, {"axis": 1}, base=output.name, shape=output.shape)
    note = f"{root.op} after a Concat folded into the {convs} Conv(s) of its parts"
    return Rewrite(build.nodes, [(output, joined)], note)


def _scaled_part(part, index: int, scale, shift, concat: ir.Node, graph_outputs: set[int], build: NodeBuilder):
    """The output of a new Conv making `part` with the map's slice folded in (the Conv's
    own dtype); or why it cannot be."""
    producer = part.inputs[0] if len(part.inputs) == 1 else None
    if producer is None or producer.op != "Conv":
        raise Refusal(f"{concat.name}: part {index} ({part.name}) is not made by a Conv")
    readers = {id(node) for node in part.outputs}
    if readers != {id(concat)} or id(part) in graph_outputs or sum(t is part for t in concat.inputs) > 1:
        raise Refusal(f"{concat.name}: part {index} ({part.name}) is also read elsewhere")
    weights = conv_weights(producer)
    weight, bias = scale_shift_onnx_weight(*weights, scale, shift)
    weight, bias = (None if a is None else a.astype(output_dtype(producer)) for a in (weight, bias))
    return build.conv(producer.inputs[0], weight, bias, conv_attributes(producer), base=part.name, shape=part.shape)
