"""Primitives that remove nodes computing nothing at inference."""

from __future__ import annotations

from ..rewrite.primitives import Rewrite, reach


@reach(0)
def forward_input(match, context) -> Rewrite:
    """The root's output is its first input (Identity, Dropout in inference)."""
    root = match.root
    return Rewrite(
        nodes=[], replace=[(root.outputs[0], root.inputs[0])], note=f"{root.op} forwards its input unchanged"
    )
