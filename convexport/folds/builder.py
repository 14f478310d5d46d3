"""NodeBuilder: the one way a fold builds the nodes of its rewrite.

Each new node and tensor gets a fresh name from a base the fold gives (the name of what it
replaces: `conv3_weight`, `add_7_matmul`), so that a rewritten graph still reads like the
exported one; the node is named `<base>_<op>`, its output `<base>`. The nodes collect in
order in `nodes`, which the fold hands to its Rewrite. What the new nodes come from (their
PyTorch modules, the exporter's metadata) the engine records from the nodes they replace
(ir.Provenance.derive), so a fold does not copy it.
"""

from __future__ import annotations

import numpy as np

from .. import ir


def output_dtype(node: ir.Node) -> np.dtype:
    """The element type of a node's first output: the dtype a fold replacing it builds in."""
    return ir.tensor_dtype(node.outputs[0])


class NodeBuilder:
    """New nodes for one rewrite, in the order they are made; `dtype` is the default of their
    outputs and constants (the model's float type, usually)."""

    def __init__(self, context, dtype=None, base: str = "node"):
        self.context, self.dtype, self.base = context, dtype, base
        self.nodes: list[ir.Node] = []

    def node(self, op: str, inputs, attrs=None, *, base=None, shape=None, dtype=None, outputs=1, domain=None):
        """A node of `op` reading `inputs` (named from `base`, the builder's where not given);
        its output of `shape` and `dtype`, or a list: `outputs` of them where that is a count
        above 1, one like each where it is a list of tensors (a Split's parts)."""
        base = base or self.base
        if isinstance(outputs, int):
            shape = None if shape is None else list(shape)
            made = [ir.Variable(self.context.fresh(base), dtype or self.dtype, shape) for _ in range(outputs)]
        else:
            made = [ir.Variable(self.context.fresh(t.name), t.dtype or self.dtype, t.shape) for t in outputs]
        node = ir.Node(op, self.context.fresh(f"{base}_{op.lower()}"), dict(attrs or {}), list(inputs), made)
        if domain:
            node.domain = domain
        self.nodes.append(node)
        return made[0] if outputs == 1 else made

    def constant(self, value, base=None, dtype=None) -> ir.Constant:
        """An initializer named fresh from `base` (`<builder base>_const` where not given): of
        `dtype` where given; else a float value takes the builder's dtype (a weight folded in
        float64, cast back to the model's) and any other keeps its own (shapes, indices)."""
        value = np.asarray(value)
        if dtype is None and self.dtype is not None and value.dtype.kind == "f":
            dtype = self.dtype
        name = self.context.fresh(base or f"{self.base}_const")
        return ir.Constant(name, value if dtype is None else value.astype(dtype, copy=False))

    def conv(self, x, weight: np.ndarray, bias: np.ndarray | None, attrs: dict, *, base: str, shape=None, op="Conv"):
        """A Conv (or ConvTranspose) of x with this ONNX weight, bias (or None) and attributes,
        its weights cast to the builder's dtype; its output."""
        inputs = [x, self.constant(weight, base + "_weight")]
        if bias is not None:
            inputs.append(self.constant(bias, base + "_bias"))
        return self.node(op, inputs, attrs, base=base, shape=shape)
