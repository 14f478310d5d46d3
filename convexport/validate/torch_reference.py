"""A PyTorch source's own float64 run: the exact result of the model the user gave.

The ONNX graph's float64 run is the exact result of what the exporter wrote; torch's, of what
the user wrote. Both agree up to the float32 rounding of the constants the exporter bakes in
(Python scalars, BatchNorm folded into a Conv by the TorchScript exporter): within the
original's own float32 error against either (validate/exact_check.py). Where they do not, the exporter
changed the model, which no check of ONNX graphs alone can see.

The model runs as a float64 copy (`copy.deepcopy(module).double()`: the user's module is not
touched) on validation's input sets, positionally, where the ONNX graph's inputs are exactly the
arguments the exporter called it with, in that order; its outputs flattened as torch's pytree
flattens them, where they are the ONNX graph's outputs in number and shape. Anything else (an
input the exporter dropped or renamed, a dict output in another order, an op without a float64
kernel, a dtype baked into a TorchScript graph) leaves the ONNX graph's float64 run as the
reference, and the report says why. So does a run that would take longer than the reference's
time budget (estimated_flops): torch's float64 convolution has no fast path for a large kernel,
which the ONNX graph's float64 run takes through the FFT.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from .. import flops
from ..errors import first_line
from ..ir.stats import node_flops
from ..util.quiet import quiet_libraries
from .float64 import FFT_TAPS, widen_array

# torch's float64 convolution over a kernel of FFT_TAPS taps or more, against the float64
# reference's rate: a 35x35 kernel over 1 -> 3 channels ran 12x slower (bench/RESULTS.md,
# "Measurements behind the code")
LARGE_KERNEL_SLOWDOWN = 12.0


def estimated_flops(model: onnx.ModelProto) -> float:
    """torch's float64 run of `model` in FLOPs at the float64 reference's rate: each node as
    flops.py counts it, a convolution of a large kernel (FFT_TAPS taps or more) done directly and
    LARGE_KERNEL_SLOWDOWN times slower."""

    def large_kernel(node: onnx.NodeProto, op: str, shapes: dict) -> float | None:
        weight = shapes.get(node.input[1]) if op == "Conv" and len(node.input) > 1 else None
        output = shapes.get(node.output[0])
        if weight is None or output is None or np.prod(weight[2:]) < FFT_TAPS:
            return None
        return LARGE_KERNEL_SLOWDOWN * flops.conv(output, weight)

    return node_flops(model, large_kernel)


class TorchUnavailable(Exception):
    """Why the torch source's own float64 run cannot be the reference (the message)."""


@dataclass
class TorchFloat64:
    """run(feeds): the float64 copy of a torch source on validation's feeds (by ONNX input
    name), its outputs flattened, as float64 arrays where floating."""

    module: Any
    input_names: list[str]

    def run(self, feeds: dict[str, np.ndarray], expected_shapes: list[tuple]) -> list[np.ndarray]:
        import torch
        from torch.utils._pytree import tree_leaves

        args = [torch.from_numpy(np.ascontiguousarray(widen_array(feeds[name]))) for name in self.input_names]
        try:
            with torch.no_grad(), quiet_libraries():
                produced = self.module(*args)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {first_line(exc, 200)}"
            raise TorchUnavailable(f"its float64 copy does not run: {reason}") from None
        tensors = [leaf for leaf in tree_leaves(produced) if isinstance(leaf, torch.Tensor)]
        if len(tensors) != len(expected_shapes):
            raise TorchUnavailable(f"it returns {len(tensors)} tensors where the ONNX graph has {len(expected_shapes)}")
        arrays = [tensor.detach().numpy() for tensor in tensors]
        for array, shape in zip(arrays, expected_shapes):
            if tuple(array.shape) != tuple(shape):
                raise TorchUnavailable(f"its output of shape {tuple(array.shape)} is {tuple(shape)} in the ONNX graph")
            if array.dtype.kind == "f" and array.dtype != np.float64:
                raise TorchUnavailable(f"an output is {array.dtype} in its float64 copy (a dtype fixed in its code)")
        return arrays


def torch_float64(loaded, argument_names: list[str], reference: onnx.ModelProto, max_weight_bytes: int):
    """The float64 copy of `loaded`'s torch model (loading.LoadedModel), or TorchUnavailable
    with the reason; None for a source that is no torch model."""
    if loaded.route.torch_module is None:
        return None
    initializers = {init.name for init in reference.graph.initializer}
    graph_inputs = [value.name for value in reference.graph.input if value.name not in initializers]
    if graph_inputs != list(argument_names):
        return TorchUnavailable(
            f"the ONNX graph's inputs ({', '.join(graph_inputs)}) are not the arguments it was exported with "
            f"({', '.join(argument_names)})"
        )
    module = loaded.route.torch_module(loaded)
    try:
        weights = sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))
        if weights > max_weight_bytes:
            return TorchUnavailable(f"{weights / 2**30:.2f} GiB of weights, over what float64 copies are made of")
        double = copy.deepcopy(module).double()
    except Exception as exc:
        return TorchUnavailable(f"no float64 copy of it: {type(exc).__name__}: {first_line(exc, 200)}")
    return TorchFloat64(double, graph_inputs)
