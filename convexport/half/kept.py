"""A node with float data that stays float32 in a half-precision model, and why: what the
report's `precision.kept_float32` lists."""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from ..report import types as report_types


@dataclass
class KeptFloat32:
    """A node with float data that stays float32, and why (its measured error where it has one)."""

    node: str
    op: str
    reason: str
    error: float | None = None
    bound: float | None = None

    @classmethod
    def of(cls, node: onnx.NodeProto, reason: str, error: float | None = None, bound: float | None = None):
        """The entry of `node`, named by its name or, where it has none, its first output."""
        return cls(node.name or node.output[0], node.op_type, reason, error, bound)

    def to_report(self) -> report_types.KeptFloat32:
        return {"node": self.node, "op": self.op, "reason": self.reason, "error": self.error, "bound": self.bound}
