"""Sibling Convs of one geometry and different widths reading one tensor -> one Conv and a Split.

    y_i = Conv(x, W_i [O_i, I, *k], b_i)  for i = 1..n, same kernel size, strides, pads, dilations
    ->  z = Conv(x, W = [W_1; ...; W_n] [sum O_i, I, *k], b = [b_1; ...; b_n]);  y_i = Split(z)[i]

Each output channel of a Conv is its own weight row's sum over the same input windows, so the
stacked Conv computes every y_i exactly; x is read once and the Convs become one larger GEMM,
at the price of a Split that copies the outputs. Whether that pays is the cost model's call.
(Branches of equal width are parallel-conv-branches' case: it batches what follows them too.)
"""

from __future__ import annotations

import numpy as np

from .. import ir
from ..algebra import Refusal
from ..algebra.batching import stack_conv_heads
from ..ir import constant_value, is_absent
from .branch_groups import largest_compatible
from .builder import NodeBuilder, output_dtype
from .convnodes import conv_attributes, node_flops
from .primitives import Rewrite, builtin, consumes


@builtin
@consumes("heads", "x", heads={"Conv"})
def merge_sibling_convs(match, context) -> Rewrite:
    """heads[] = Conv(x, w[], b[]?) -> one Conv of the largest set of ungrouped heads sharing
    attributes and kernel size, then a Split into the heads' outputs. Heads whose outputs meet
    in one node (an Add or Concat of branches) are left to the rules that fold those."""
    x = match.values["x"]
    candidates = [h for h in match.nodes["heads"] if int(h.attrs.get("group", 1)) == 1 and _alone(h, match)]
    heads = largest_compatible(candidates, _geometry)
    if len(heads) < 2:
        raise Refusal("fewer than two ungrouped sibling Convs of one geometry", reported=False)
    shapes = [h.outputs[0].shape for h in heads]
    if any(s is None or len(s) < 3 or not isinstance(s[1], int) for s in shapes):
        raise Refusal(f"{x.name}: the channel counts of its sibling Convs' outputs are unknown")
    weights = [constant_value(h.inputs[1]) for h in heads]
    biases = [None if len(h.inputs) < 3 or is_absent(h.inputs[2]) else constant_value(h.inputs[2]) for h in heads]
    weight, bias = stack_conv_heads(weights, biases)
    dtype = output_dtype(heads[0])
    base = x.name + "_siblings"
    stacked_shape = [*shapes[0][:1], int(weight.shape[0]), *shapes[0][2:]]
    build = NodeBuilder(context, dtype)
    stacked = build.conv(x, weight, bias, conv_attributes(heads[0]), base=base, shape=stacked_shape)
    sizes = build.constant(np.array([s[1] for s in shapes], np.int64), base + "_sizes")
    parts = build.node("Split", [stacked, sizes], {"axis": 1}, base=base, outputs=[h.outputs[0] for h in heads])
    conv = build.nodes[0]
    before = [node_flops(h) for h in heads]
    return Rewrite(
        build.nodes,
        [(h.outputs[0], part) for h, part in zip(heads, parts)],
        f"{len(heads)} sibling Convs ({'/'.join(str(s[1]) for s in shapes)} wide) as one Conv and a Split",
        None if None in before else sum(before),
        node_flops(conv, stacked_shape),
    )


def _geometry(conv: ir.Node):
    """What sibling Convs must share to be one: every attribute and the kernel's spatial size."""
    return sorted((k, str(v)) for k, v in conv_attributes(conv).items()), constant_value(conv.inputs[1]).shape[2:]


def _alone(head: ir.Node, match) -> bool:
    """No reader of the head's output also reads another head's."""
    others = {id(h.outputs[0]) for h in match.nodes["heads"] if h is not head}
    return not any(id(t) in others for reader in head.outputs[0].outputs for t in reader.inputs)
