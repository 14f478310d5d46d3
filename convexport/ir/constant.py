"""ir.Constant: onnx-graphsurgeon's Constant, built from any array-like value.

gs.Constant takes only an ndarray; a primitive that computes a weight as a product of 0-d
arrays gets a NumPy scalar (np.float32(2) * np.float32(3) is no array), which gs refuses
deep inside the rewrite. This class makes it an array first. Every gs.Constant (those
import_graph makes included) is an instance of it, so `isinstance(t, ir.Constant)` asks what
it always asked.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs


class _AnyGraphConstant(type):
    def __instancecheck__(cls, instance) -> bool:
        return isinstance(instance, gs.Constant)

    def __subclasscheck__(cls, subclass) -> bool:
        return issubclass(subclass, gs.Constant)


class Constant(gs.Constant, metaclass=_AnyGraphConstant):
    """A constant tensor: `Constant(name, values)` with values an ndarray, a NumPy scalar, a
    Python number or a nested list (as np.asarray reads it)."""

    def __init__(self, name: str, values, *args, **kwargs):
        if not isinstance(values, (np.ndarray, gs.ir.tensor.LazyValues, gs.ir.tensor.SparseValues)):
            values = np.asarray(values)
        super().__init__(name, values, *args, **kwargs)
