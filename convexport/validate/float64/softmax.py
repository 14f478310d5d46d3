"""Softmax, LogSoftmax and Hardmax below opset 13, for ONNX's reference evaluator, which
computes them as opset 13 defines them at every opset (onnx 1.23).

Opsets 1-12 coerce x to 2-D, [prod(shape[:axis]), prod(shape[axis:])], normalise each row and
reshape back: over every axis from `axis` on, not that axis alone; `axis` defaults to 1 there
(-1 from 13). On x [3, 4, 5] with axis=1 the two definitions differ by 0.59, and ONNX Runtime
follows each opset's own. From opset 13 the reference kernels are right and run as they are.
"""

from __future__ import annotations

import numpy as np
from onnx.reference.ops.op_hardmax import Hardmax as ReferenceHardmax
from onnx.reference.ops.op_softmax import Softmax as ReferenceSoftmax


class _Opset12Form:
    def _run(self, x, axis=None):  # the evaluator calls a unary op with x alone: the axis is self.axis
        axis = self.axis if axis is None else axis
        opset = int(self.run_params.get("opsets", {}).get("", 13) or 13)
        if opset >= 13:
            return super()._run(x, axis=axis)
        given = any(attribute.name == "axis" for attribute in self.onnx_node.attribute)
        axis = (axis if given else 1) % max(x.ndim, 1)
        rows = x.reshape(int(np.prod(x.shape[:axis])), -1)
        return (super()._run(rows, axis=-1)[0].reshape(x.shape),)


class Softmax(_Opset12Form, ReferenceSoftmax):
    pass


class LogSoftmax(Softmax):
    def _run(self, x, axis=None):
        y = Softmax._run(self, x, axis)[0]
        return (np.log(y, out=y),)


class Hardmax(_Opset12Form, ReferenceHardmax):
    pass
