"""BatchNormalization in float64, every opset, for ONNX's reference evaluator.

Inference (the form every exported model has):

    y = scale * (x - mean) / sqrt(var + epsilon) + bias

x [N, C, *D]; scale, bias, mean, var [C] (or [C, *D] where opset 7's spatial=0 gives one value
per activation). Which form a node is follows ONNX Runtime: opset 14 on, the training_mode
attribute; opsets 7 to 13, training when the node asks for more outputs than y; opset 6, its
is_test attribute. ONNX's reference evaluator (onnx 1.23) gets this wrong below opset 14: its
opset 9-13 kernel tests `momentum is None`, but momentum has a default of 0.9 there, so every
node was normalised with the batch's own statistics (0.128 off the formula on one node), and an
opset-13 Conv + BatchNormalization model's float64 "reference" was 2.46 away from the truth.

Training form: the batch's mean and (population) variance over every axis but 1 instead of
`mean` and `var`, and the running statistics blended by momentum (ONNX's reference code).
"""

from __future__ import annotations

import numpy as np
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_batch_normalization import _batchnorm_training_mode


class BatchNormalization(OpRun):
    op_domain = ""

    def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None, training_mode=None, is_test=None,
             **_unused):  # fmt: skip
        epsilon = 1e-5 if epsilon is None else epsilon
        if not self._training(training_mode, is_test):
            shape = (1, -1, *[1] * (x.ndim - 2)) if scale.ndim == 1 else (1, *scale.shape)
            y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + epsilon) * scale.reshape(shape)
            return ((y + bias.reshape(shape)).astype(x.dtype),)
        momentum = 0.9 if momentum is None else momentum
        y, saved_mean, saved_var, running_mean, running_var = _batchnorm_training_mode(
            x, scale, bias, mean, var, momentum, epsilon
        )
        # opset 14 on: y, running mean and var; below: those, then the batch's mean and var
        outputs = (y, running_mean, running_var, saved_mean, saved_var)
        return outputs[: len(self.onnx_node.output)]

    def _opset(self) -> int:
        return int(self.run_params.get("opsets", {}).get("", 0) or 0)

    def _training(self, training_mode, is_test) -> bool:
        opset = self._opset()
        if opset >= 14:
            return bool(training_mode)
        if opset >= 7:
            return len([name for name in self.onnx_node.output if name]) > 1
        return not is_test
