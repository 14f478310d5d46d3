"""Primitives that remove nodes computing nothing at inference."""

from __future__ import annotations

import numpy as np

from ..algebra import Refusal
from ..ir import constant_value, is_absent
from .primitives import AFFINE, Rewrite, builtin, consumes, reach


@builtin
@reach(0)
@consumes(every_line=True)
def forward_input(match, context) -> Rewrite:
    """The root's output is its first input (Identity, Dropout in inference). Only the root
    goes: lines before it are context (an Identity after a ConvTranspose), kept as they are."""
    return forwarded(match.root, match.root.inputs[0], f"{match.root.op} forwards its input unchanged")


def forwarded(root, tensor, note: str) -> Rewrite:
    """No node: the root's output is `tensor`, one of its inputs."""
    return Rewrite(nodes=[], replace=[(root.outputs[0], tensor)], note=note)


@builtin
@reach(0)
@consumes(root={"Slice"})
def drop_whole_slice(match, context) -> Rewrite:
    """A Slice that keeps every element of its input (starts 0, ends at or past the end, steps
    1, on every axis it names; the TorchScript exporter writes `t[:, :c]` on a tensor of c
    channels so) forwards its input."""
    root = match.root
    shape = root.inputs[0].shape
    starts, ends, axes, steps = slice_parameters(root)
    if shape is None or starts is None or ends is None:
        raise Refusal("its input's shape or its bounds are unknown", reported=False)
    axes = range(len(starts)) if axes is None else [int(a) % len(shape) for a in np.asarray(axes).reshape(-1)]
    steps = np.ones(len(starts), np.int64) if steps is None else np.asarray(steps).reshape(-1)
    for axis, start, end, step in zip(axes, np.asarray(starts).reshape(-1), np.asarray(ends).reshape(-1), steps):
        size = shape[axis]
        if not isinstance(size, int) or step != 1 or start not in (0, -size if size else 0) or end < size:
            raise Refusal("it keeps part of its input", reported=False)
    return forwarded(root, root.inputs[0], "Slice keeps its whole input")


def slice_parameters(node) -> list:
    """A Slice's starts, ends, axes and steps as constants, each None where it is absent or
    computed at run time."""
    return [None if len(node.inputs) <= i or is_absent(node.inputs[i]) else constant_value(node.inputs[i])
            for i in range(1, 5)]  # fmt: skip


# The constant that leaves x as it is, per op, and whether x must be the first input.
_NEUTRAL = {"Add": (0.0, False), "Sub": (0.0, True), "Mul": (1.0, False), "Div": (1.0, True)}


@builtin
@reach(0)
@consumes("x", root=AFFINE)
def drop_neutral_constant(match, context) -> Rewrite:
    """x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1 forward x, where the constant changes neither
    the output's shape nor its type (exporters write a sum of branches as 0 + b1 + ... and
    leave the 0 there). Every value stays the same number; only a -0.0 in x, which x + 0 turns
    into +0.0, keeps its sign (a later division by that zero is all that could tell)."""
    root = match.root
    data = match.values["x"]
    neutral = _NEUTRAL.get(root.op)
    constant = next((constant_value(t) for t in root.inputs if t is not data), None)
    if neutral is None or constant is None or (neutral[1] and root.inputs[0] is not data):
        raise Refusal(f"{root.op} is no elementwise op with x first where it must be", reported=False)
    same_shape = data.shape is not None and list(data.shape) == list(root.outputs[0].shape or [])
    if not same_shape or np.ndim(constant) > len(data.shape) or np.any(np.asarray(constant) != neutral[0]):
        raise Refusal("the constant changes the values or the shape", reported=False)
    if data.dtype is None or data.dtype != root.outputs[0].dtype:
        raise Refusal("the output's type is not the input's", reported=False)
    return forwarded(root, data, f"{root.op} by {neutral[0]:g} forwards its input")


@builtin
@reach(0)
@consumes(root={"Pad"})
def drop_empty_pad(match, context) -> Rewrite:
    """A Pad of zero on every side, in any mode, forwards its input (exporters leave one where
    a padding size came out 0)."""
    root = match.root
    pads = constant_value(root.inputs[1])
    if pads is None or np.any(np.asarray(pads) != 0):
        raise Refusal("it pads or crops", reported=False)
    return forwarded(root, root.inputs[0], "Pad of zero forwards its input")
