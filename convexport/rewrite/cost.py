"""The cost model behind `--strategy cost`: whether a candidate rewrite should run faster on
the target device, estimated from the nodes it removes and the nodes it adds.

    time(nodes) = FLOPs / device.flops_per_s + bytes moved / device.bytes_per_s
                  + len(nodes) * device.seconds_per_node

FLOPs are the primitive's own count where it gives one (an FFT's transform and product
counts), else each node's (flops.py: the one count, of whole tensors, the batch included, as
the bytes are). Bytes moved are every input and output a node touches (weights included),
each tensor once (twice where one node reads it twice). An
activation that ONNX Runtime fuses into the Conv before it (FUSED_ACTIVATIONS) costs nothing;
an op that only moves data (COPY_OPS) moves it at the device's copy rate where it has one. A new
tensor whose shape is not known yet is taken as large as the old tensor it replaces, or as
its node's largest input. Ops that the device runs elsewhere (DFT has no CUDA kernel in ONNX
Runtime: it runs on the CPU) cost the CPU's time plus a round trip over PCIe, and so does a
node whose subgraph holds one. The rates are round figures for what ONNX Runtime reaches, not
peaks; a rewrite is applied when its estimate is no larger than the original's.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

from .. import flops, ir
from ..ir import node_subgraphs, numpy_dtype


@dataclass(frozen=True)
class Device:
    name: str
    flops_per_s: float
    bytes_per_s: float
    seconds_per_node: float
    host_ops: frozenset = frozenset()  # ops this device leaves to the CPU
    host_link_bytes_per_s: float = 0.0
    copy_bytes_per_s: float | None = None  # ops that only move data (COPY_OPS), where faster
    large_kernel_flops_per_s: float | None = None  # a Conv of LARGE_KERNEL_AREA taps or more, where slower


# CPU: fitted to ONNX Runtime 1.31 on 2 cores (AVX2) timing a depthwise 3x3 + pointwise 1x1 pair
# against the dense 3x3 it folds to, and nested Concats against one (--strategy measure's
# numbers; bench/RESULTS.md, "Measurements behind the code").
CPU = Device("cpu", flops_per_s=80e9, bytes_per_s=4e9, seconds_per_node=5e-6, copy_bytes_per_s=20e9)
# CUDA: fitted to ONNX Runtime 1.31's CUDA provider (TF32 on, ORT's default) by
# `bench/device_constants.py fit bench/data/h200-points.json` (63 graphs, median error x1.42;
# bench/RESULTS.md, "Device constants"). Convs of LARGE_KERNEL_AREA taps or more at the rate of
# a 16-channel kernel sweep (11x11 to 63x63). Copy ops' bytes fit nearly free beside their
# nodes' own time.
CUDA = Device(
    "cuda",
    flops_per_s=3.7e14,
    bytes_per_s=1.7e12,
    seconds_per_node=1.5e-6,
    host_ops=frozenset({"DFT"}),
    host_link_bytes_per_s=20e9,
    copy_bytes_per_s=5.0e13,
    large_kernel_flops_per_s=2.35e13,
)
DEVICES = {"cpu": CPU, "cuda": CUDA}


class Estimate(NamedTuple):
    seconds: float
    flops: float
    bytes: float
    nodes: int


class NodeWork(NamedTuple):
    """What one node does, as the model counts it."""

    flops: float
    bytes: float  # the tensors it is the first of the nodes to touch
    on_host: bool  # the device leaves it to the CPU
    copy: bool  # an op that only moves data (COPY_OPS)
    large_kernel: float = 0.0  # a Conv of LARGE_KERNEL_AREA taps or more: its share of the large-kernel rate


# A Conv kernel of this many taps or more (11x11): cuDNN has no fast algorithm for it, and with
# fewer than FULL_CHANNELS output channels per group it runs slower in proportion (bench/RESULTS.md,
# "Device constants": a 16-channel kernel sweep and sample_models/seed003_large_kernel.py's 1 -> 3
# channels).
LARGE_KERNEL_AREA = 121
FULL_CHANNELS = 16


def estimate(
    nodes: list[ir.Node], device: Device, flops: float | None = None, replaced: dict[int, ir.Tensor] | None = None
) -> Estimate:
    """The time of `nodes` on `device` (see the module doc). `flops`, the primitive's count,
    is shared out over the nodes in proportion to their own counts. `replaced` maps the id of
    a new tensor to the old tensor it stands for, whose shape it has."""
    work = node_work(nodes, device, replaced or {})
    counted = sum([w.flops for w in work])
    factor = flops / counted if flops is not None and counted > 0 else 1.0
    seconds = flops / device.flops_per_s if flops is not None and counted == 0 else 0.0
    for node_flops, node_bytes, on_host, copy, large_kernel in work:
        if on_host:
            seconds += _seconds(CPU, node_flops * factor, node_bytes, copy)
            seconds += 2 * node_bytes / device.host_link_bytes_per_s
        else:
            seconds += _seconds(device, node_flops * factor, node_bytes, copy, large_kernel)
    return Estimate(seconds, counted if flops is None else flops, sum([w.bytes for w in work]), len(work))


def node_work(nodes: list[ir.Node], device: Device, replaced: dict[int, ir.Tensor]) -> list[NodeWork]:
    """What each node that runs does (an activation fused into its Conv does not run): its
    FLOPs, the bytes of the tensors it is the first of `nodes` to touch, whether the device
    leaves it to the CPU, whether it only moves data."""
    seen: set[int] = set()
    work = []
    for node in nodes:
        fresh = [t for t in (*node.inputs, *node.outputs) if id(t) not in seen]
        seen.update(map(id, fresh))
        if fused_into_conv(node):
            continue
        work.append(
            NodeWork(
                _node_flops(node, replaced),
                sum([_bytes(t, node, replaced) for t in fresh]),
                bool(device.host_ops) and _runs_on_host(node, device),
                node.op in COPY_OPS,
                _large_kernel(node),
            )
        )
    return work


def terms(nodes: list[ir.Node], device: Device) -> dict[str, float]:
    """The sums the model's time is made of, for fitting a device's constants
    (bench/device_constants.py): FLOPs, bytes moved by compute ops and by copy ops, nodes run,
    and the nodes the device leaves to the CPU."""
    work = node_work(nodes, device, {})
    on_device = [w for w in work if not w.on_host]
    return {
        "flops": sum([w.flops for w in on_device if not w.large_kernel]),
        "large_kernel_flops": sum([w.flops / w.large_kernel for w in on_device if w.large_kernel]),
        "bytes": sum([w.bytes for w in on_device if not w.copy]),
        "copy_bytes": sum([w.bytes for w in on_device if w.copy]),
        "nodes": len(on_device),
        "host_nodes": len(work) - len(on_device),
    }


# Activations ONNX Runtime fuses into the Conv before them (its ConvActivationFusion, on the
# CPU and CUDA providers): computed as the Conv writes its output, they cost no pass of their own.
FUSED_ACTIVATIONS = frozenset({"Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid"})


def fused_into_conv(node: ir.Node) -> bool:
    """An activation that is the only reader of a Conv's output: no node of its own at run time."""
    if node.op not in FUSED_ACTIVATIONS or not node.inputs:
        return False
    source = node.inputs[0]
    return (
        isinstance(source, ir.Variable)
        and len(source.inputs) == 1
        and source.inputs[0].op == "Conv"
        and len(source.outputs) == 1
    )


def _runs_on_host(node: ir.Node, device: Device) -> bool:
    """The node is, or holds in a subgraph (a Scan body), an op the device leaves to the CPU."""
    if node.op in device.host_ops:
        return True
    return any(_runs_on_host(inner, device) for sub in node_subgraphs(node) for inner in sub.nodes)


def _large_kernel(node: ir.Node) -> float:
    """For a Conv of LARGE_KERNEL_AREA taps or more, the share of the large-kernel FLOP rate
    its output channels per group reach (1 from FULL_CHANNELS on); 0 for any other node."""
    weight = node.inputs[1].shape if node.op == "Conv" and len(node.inputs) > 1 else None
    if weight is None or math.prod(flops.counted(weight)[2:]) < LARGE_KERNEL_AREA:
        return 0.0
    per_group = flops.counted(weight)[0] / max(int(node.attrs.get("group", 1)), 1)
    return min(1.0, per_group / FULL_CHANNELS)


def _seconds(device: Device, flops: float, moved: float, copy: bool = False, large_kernel: float = 0.0) -> float:
    rate = device.copy_bytes_per_s if copy and device.copy_bytes_per_s else device.bytes_per_s
    flop_rate = device.flops_per_s
    if large_kernel and device.large_kernel_flops_per_s:
        flop_rate = device.large_kernel_flops_per_s * large_kernel
    return flops / flop_rate + moved / rate + device.seconds_per_node


# Ops that only move data: their traffic runs at memcpy speed, not at the rate the compute
# ops' traffic is fitted at.
COPY_OPS = frozenset({"Concat", "Split", "Slice", "Transpose", "Tile", "Expand", "Gather", "Pad"})


# Ops whose output has as many elements as their first input: where shape inference could not
# give one dim of the output (Flatten of [N, 64, 256] is [N*64, 256], unknown), it is the dim
# that keeps the count, not the 1 flops.counted takes for an unknown dim (which counted the
# BatchNormalization after such a Flatten 64 times too cheap).
SAME_ELEMENTS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "BatchNormalization", "Identity"})


def _shape(tensor, node: ir.Node, replaced: dict[int, ir.Tensor], depth: int = 0) -> tuple[int, ...] | None:
    stand_in = replaced.get(id(tensor), tensor)
    shape = stand_in.shape
    if shape is None and any(tensor is out for out in node.outputs):
        inputs = [_shape(t, node, {}) for t in node.inputs if not isinstance(t, ir.Constant)]
        inputs = [s for s in inputs if s is not None]
        return max(inputs, key=lambda s: int(math.prod(s)), default=None)
    if shape is None:
        return None
    unknown = [axis for axis, dim in enumerate(shape) if type(dim) is not int]
    producer = stand_in.inputs[0] if len(unknown) == 1 and stand_in.inputs and depth < 16 else None
    if producer is not None and producer.op in SAME_ELEMENTS and producer.inputs:
        source = _shape(producer.inputs[0], producer, {}, depth + 1)
        known = math.prod(dim for dim in shape if type(dim) is int)
        if source is not None and known > 0 and math.prod(source) % known == 0:
            return tuple(math.prod(source) // known if type(dim) is not int else dim for dim in shape)
    return flops.counted(shape)


def tensor_bytes(shape, dtype) -> float:
    """The bytes of a tensor of `shape` (dims counted as flops.counted counts them) and a gs dtype."""
    return flops.elements(shape) * _itemsize(dtype)


def _bytes(tensor, node: ir.Node, replaced) -> float:
    if isinstance(tensor, ir.Constant):  # from its shape: reading .values would load the weight
        return float(math.prod(tensor.shape)) * _itemsize(tensor.dtype)
    if not tensor.name:
        return 0.0
    shape = _shape(tensor, node, replaced)
    return 0.0 if shape is None else tensor_bytes(shape, tensor.dtype)


@functools.cache
def _itemsize(dtype) -> int:
    """The item size of a gs dtype (a NumPy type, an ONNX type number or None)."""
    return numpy_dtype(dtype).itemsize


def _node_flops(node: ir.Node, replaced) -> float:
    """flops.node_flops with the node's shapes as the model counts them (a new tensor's from
    the tensor it replaces)."""
    out = _shape(node.outputs[0], node, replaced) if node.outputs else None
    inputs = [
        None if t.shape is None and not isinstance(t, ir.Constant) else _shape(t, node, replaced) for t in node.inputs
    ]
    return flops.node_flops(node.op, out, inputs, node.attrs.get)
