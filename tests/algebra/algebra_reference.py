"""Reference computations for the algebra tests: ONNX-style convs run in torch float64 and in
ONNX Runtime float32, random conv geometry, and the comparison tolerances."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

from convexport.algebra import ConvSpec, conv_from_onnx, conv_to_onnx

IR_VERSION = 10
OPSET = 18
CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
PAD_MODES = ("zero", "same", "full", "asym")


@dataclass
class OnnxConv:
    """An ONNX Conv: grouped weight [O, I/g, *k], bias [O] or None, attributes."""

    weight: np.ndarray
    bias: np.ndarray | None
    attrs: dict = field(default_factory=dict)

    @property
    def nd(self) -> int:
        return self.weight.ndim - 2

    def spec(self, spatial) -> ConvSpec:
        spec = conv_from_onnx(self.weight, self.bias, self.attrs, spatial)
        assert isinstance(spec, ConvSpec), spec
        return spec


def same_pads(mode: str, kernel: int, stride: int, dilation: int, length: int) -> tuple[int, int]:
    """ONNX auto_pad SAME_* pads, written out independently of the library."""
    out = -(-length // stride)
    total = max(0, (out - 1) * stride + dilation * (kernel - 1) + 1 - length)
    return (total // 2, total - total // 2) if mode == "SAME_UPPER" else (total - total // 2, total // 2)


def explicit_pads(conv: OnnxConv, spatial) -> tuple[list[int], list[int]]:
    nd, attrs = conv.nd, conv.attrs
    mode = attrs.get("auto_pad", "NOTSET")
    if mode == "VALID":
        return [0] * nd, [0] * nd
    if mode.startswith("SAME"):
        pairs = [same_pads(mode, k, s, d, length) for k, s, d, length in
                 zip(conv.weight.shape[2:], attrs.get("strides", [1] * nd), attrs.get("dilations", [1] * nd), spatial)]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    pads = attrs.get("pads", [0] * 2 * nd)
    return list(pads[:nd]), list(pads[nd:])


def torch_conv(x: torch.Tensor, conv: OnnxConv) -> torch.Tensor:
    """The ONNX Conv in torch float64 (explicit zero pads, then an unpadded conv)."""
    nd = conv.nd
    begin, end = explicit_pads(conv, x.shape[2:])
    padding = [p for axis in reversed(range(nd)) for p in (begin[axis], end[axis])]
    bias = None if conv.bias is None else torch.tensor(conv.bias, dtype=torch.float64)
    return CONV[nd](F.pad(x, padding), torch.tensor(conv.weight, dtype=torch.float64), bias,
                    stride=conv.attrs.get("strides", [1] * nd), dilation=conv.attrs.get("dilations", [1] * nd),
                    groups=conv.attrs.get("group", 1))


def emitted(spec: ConvSpec) -> OnnxConv:
    """The ONNX Conv convexport emits for `spec`."""
    weight, bias, attrs = conv_to_onnx(spec)
    return OnnxConv(weight, bias, attrs)


def run_spec(x: torch.Tensor, spec: ConvSpec, border: np.ndarray | None = None) -> torch.Tensor:
    """spec(x) (+ border) as the emitted ONNX Conv, in torch float64."""
    y = torch_conv(x, emitted(spec))
    return y if border is None else y + torch.tensor(border[None])


def assert_exact(actual: torch.Tensor, expected: torch.Tensor):
    """Equal up to float64 rounding: rtol 1e-9, atol 1e-9 of the largest magnitude."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    scale = float(expected.abs().max()) if expected.numel() else 1.0
    np.testing.assert_allclose(actual.numpy(), expected.numpy(), rtol=1e-9, atol=1e-9 * max(scale, 1.0))


def differs(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether a naive fold is numerically wrong (different shape, or off beyond 1e-6)."""
    if actual.shape != expected.shape:
        return True
    return not np.allclose(actual.numpy(), expected.numpy(), rtol=1e-6, atol=1e-6)


# -- random geometry ------------------------------------------------------------------------

def axis_pads(mode: str, kernel: int, dilation: int, rng: random.Random) -> tuple[int, int]:
    span = dilation * (kernel - 1)
    if mode == "zero":
        return 0, 0
    if mode == "same":
        return span // 2, span - span // 2
    if mode == "full":
        return span, span
    return rng.randint(0, span + 1), rng.randint(0, 2)


def random_conv(rng: random.Random, nd: int, in_channels: int, out_channels: int, group: int, pad_mode: str,
                bias: bool, kernels=(1, 2, 3, 5), strides=(1, 2, 3), dilations=(1, 2)) -> OnnxConv:
    """Per-axis random kernel/stride/dilation, pads of `pad_mode`, weights ~ 1/sqrt(fan-in)."""
    kernel = [rng.choice(kernels) for _ in range(nd)]
    stride = [rng.choice(strides) for _ in range(nd)]
    dilation = [rng.choice(dilations) for _ in range(nd)]
    pads = [axis_pads(pad_mode, k, d, rng) for k, d in zip(kernel, dilation)]
    seed = np.random.default_rng(rng.getrandbits(32))
    fan_in = in_channels // group * int(np.prod(kernel))
    weight = seed.standard_normal((out_channels, in_channels // group, *kernel)) / np.sqrt(fan_in)
    attrs = {"group": group, "kernel_shape": kernel, "strides": stride, "dilations": dilation,
             "pads": [p[0] for p in pads] + [p[1] for p in pads]}
    return OnnxConv(weight, seed.standard_normal(out_channels) if bias else None, attrs)


def random_input(rng: random.Random, channels: int, spatial) -> torch.Tensor:
    seed = np.random.default_rng(rng.getrandbits(32))
    return torch.tensor(seed.standard_normal((1, channels, *spatial)))


# -- ONNX Runtime ---------------------------------------------------------------------------

class GraphBuilder:
    """A float32 ONNX graph from x through Conv / Add nodes, run in ONNX Runtime CPU."""

    def __init__(self, x_shape):
        self.x_shape = list(x_shape)
        self.nodes, self.initializers = [], []

    def _constant(self, value: np.ndarray) -> str:
        name = f"c{len(self.initializers)}"
        self.initializers.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def conv(self, source: str, conv: OnnxConv) -> str:
        inputs = [source, self._constant(conv.weight)] + ([] if conv.bias is None else [self._constant(conv.bias)])
        output = f"t{len(self.nodes)}"
        self.nodes.append(helper.make_node("Conv", inputs, [output], **conv.attrs))
        return output

    def add(self, left: str, value: np.ndarray) -> str:
        output = f"t{len(self.nodes)}"
        self.nodes.append(helper.make_node("Add", [left, self._constant(value)], [output]))
        return output

    def run(self, output: str, x: np.ndarray) -> np.ndarray:
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, self.x_shape)]
        outputs = [helper.make_tensor_value_info(output, TensorProto.FLOAT, [f"d{i}" for i in range(len(self.x_shape))])]
        graph = helper.make_graph(self.nodes, "g", inputs, outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
        onnx.checker.check_model(model)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return session.run(None, {"x": np.asarray(x, np.float32)})[0]


def ort_chain(x: np.ndarray, convs) -> np.ndarray:
    """x through the ONNX Convs in order, in ONNX Runtime float32."""
    graph, tensor = GraphBuilder(x.shape), "x"
    for conv in convs:
        tensor = graph.conv(tensor, conv)
    return graph.run(tensor, x)


def ort_folded(x: np.ndarray, spec: ConvSpec, border: np.ndarray | None = None) -> np.ndarray:
    """The emitted Conv (+ border map Add) in ONNX Runtime float32."""
    graph = GraphBuilder(x.shape)
    tensor = graph.conv("x", emitted(spec))
    if border is not None:
        tensor = graph.add(tensor, border[None])
    return graph.run(tensor, x)


def assert_close_float32(actual: np.ndarray, expected: np.ndarray):
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def verdict(function, *args, **kwargs):
    """What an algebra function gives: its result, or the Refusal it raises."""
    from convexport.algebra import Refusal

    try:
        return function(*args, **kwargs)
    except Refusal as refusal:
        return refusal
