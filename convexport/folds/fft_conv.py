"""A large-kernel Conv as an FFT convolution (see algebra/fft_conv.py), in the form the target
device runs: for CUDA, ONNX Runtime's com.microsoft Rfft and Irfft over the whole batch (its CUDA
provider has cuFFT kernels for them and none for ONNX's DFT, which it leaves to the CPU); for
the CPU, ONNX DFT nodes, one image and one output channel at a time. A model optimized for CUDA
this way runs on ONNX Runtime's CUDA provider only; its CPU check runs the two ops in ONNX's
reference evaluator (validate/float64/fft_ops.py)."""

from __future__ import annotations

import math

import numpy as np

from .. import flops, ir
from ..algebra import Refusal, conv_to_onnx
from ..algebra.fft_conv import plan_fft_conv
from ..ir import constant_value
from .builder import NodeBuilder
from .convnodes import conv_spec, spatial_shape
from .primitives import Rewrite, accepts, builtin, consumes, reach

MICROSOFT = "com.microsoft"
MIN_KERNEL_AREA = 121  # 11x11: below this cuDNN/MLAS direct convs win everywhere
MIN_ADVANTAGE = 2.0  # the FFT estimate must be this many times cheaper


@builtin
@reach(0)
@accepts("min_advantage", "min_kernel_area")
@consumes(root={"Conv"})
def conv_as_fft(match, context) -> Rewrite:
    """Conv(x) -> per image (a Scan): Pad, DFT; per output channel (a Scan inside it): complex
    product with the kernel's spectrum, inverse DFT, Slice.

    Always gated by cost, whatever the strategy: it is exact only to fp32 rounding and pays
    only for large kernels. None (no match) for small kernels.
    """
    conv = match.root
    weight_shape = _known_shape(conv.inputs[1])  # [O, I/g, *k]: the area decides before anything is loaded
    if weight_shape is not None and math.prod(weight_shape[2:]) < int(
        context.params.get("min_kernel_area", MIN_KERNEL_AREA)
    ):
        raise Refusal("the kernel area is below min_kernel_area", reported=False)
    spec = conv_spec(conv)
    x, output = conv.inputs[0], conv.outputs[0]
    if np.dtype(output.dtype or np.float32) != np.float32:
        raise Refusal("FFT convolution is done in float32 models only")
    plan = plan_fft_conv(spec, spatial_shape(x))
    batch = flops.counted(x.shape)[0] if x.shape else 1
    direct = flops.conv([batch, spec.out_channels, *plan.output], conv_to_onnx(spec)[0].shape)
    estimate = flops.fft_convolution(plan.sizes, plan.half, spec.in_channels, spec.out_channels, batch)
    if estimate * float(context.params.get("min_advantage", MIN_ADVANTAGE)) > direct:
        raise Refusal(f"the FFT would cost about {estimate:.3g} FLOPs against {direct:.3g} for the direct conv")
    build = _Graph(context, context.opset)
    kernel, sizes = "x".join(map(str, spec.kernel_shape)), "x".join(map(str, plan.sizes))
    if context.device == "cuda" and min(plan.sizes) >= 2:
        result = build.rfft_conv(x, plan, spec)
        note = (
            f"{kernel} conv as an FFT convolution of size {sizes} (com.microsoft Rfft/Irfft, for ORT's CUDA provider)"
        )
    else:
        result = build.fft_conv(x, plan, spec)
        note = f"{kernel} conv as an FFT convolution of size {sizes}"
    return Rewrite(build.nodes, [(output, result)], note, direct, estimate)


def _known_shape(tensor) -> tuple[int, ...] | None:
    """The tensor's shape as the graph records it, or as its value has it; None if neither."""
    shape = tensor.shape
    if shape is not None and all(isinstance(d, int) for d in shape):
        return tuple(shape)
    value = constant_value(tensor)
    return None if value is None else value.shape


class _Graph(NodeBuilder):
    """Builds the FFT convolution's nodes (float32, named `fft...`); `nodes` is where the next
    node goes (the main graph, or the body of a Scan while that is being built)."""

    def __init__(self, context, opset: int):
        super().__init__(context, np.float32, "fft")
        self.opset = opset

    def ints(self, values, base="fft_ints"):
        return self.constant(np.asarray(values, np.int64), base)

    def dft(self, x, axis, inverse=False, onesided=False, length=None):
        """DFT along `axis` (DFT-17 below opset 20, DFT-20 from it)."""
        attrs = {"inverse": int(inverse), "onesided": int(onesided)}
        length_input = self.constant(np.array(length, np.int64), "fft_length") if length else ir.Variable.empty()
        if self.opset >= 20:
            return self.node("DFT", [x, length_input, self.constant(np.array(axis, np.int64), "fft_axis")], attrs)
        inputs = [x, length_input] if length else [x]
        return self.node("DFT", inputs, {**attrs, "axis": axis})

    def pad(self, x, rank, begin: dict, end: dict):
        pads = [begin.get(axis, 0) for axis in range(rank)] + [end.get(axis, 0) for axis in range(rank)]
        return x if not any(pads) else self.node("Pad", [x, self.ints(pads, "fft_pads")])

    def slice(self, x, axis, count, step):
        return self.node(
            "Slice", [x, self.ints([0]), self.ints([(count - 1) * step + 1]), self.ints([axis]), self.ints([step])]
        )

    def fft_conv(self, x, plan, spec):
        """x [B, I, *L] -> y [B, O, *out], one image at a time (a Scan over the batch) and, for
        each image, one output channel at a time (a Scan over the kernel's spectrum). The
        frequency-domain tensors, the largest of the computation, then hold one image and one
        output channel ([1, 1, *N', 2]) instead of all of them ([B, O, *N', 2]); they are freed
        before the next ones are made."""
        kernel = plan.spectrum[..., None]  # [O, I, *N', 1] complex
        k_real = self.constant(kernel.real.astype(np.float32), "fft_kernel_real")
        k_imag = self.constant(kernel.imag.astype(np.float32), "fft_kernel_imag")
        image = ir.Variable(self.context.fresh("fft_image"), np.float32, [spec.in_channels, *spatial_shape(x)])
        body = self._body([image], lambda one: self._one_image(one, k_real, k_imag, kernel.shape[1:], plan, spec))
        result = self.node("Scan", [x], {"body": body, "num_scan_inputs": 1})  # [B, O, *out]
        if spec.has_bias and np.any(spec.bias):
            bias = self.constant(spec.bias.reshape(1, -1, *[1] * spec.nd).astype(np.float32), "fft_bias")
            result = self.node("Add", [result, bias])
        return result

    def rfft_conv(self, x, plan, spec):
        """x [B, I, *L] -> y [B, O, *out] with com.microsoft Rfft/Irfft over the spatial axes:
        X = Rfft(x padded to the plan's sizes) [B, I, *N', 2] (N' the one-sided sizes), then per
        frequency Y[b, o] = sum_i X[b, i] * K[o, i] in complex arithmetic (K the plan's conj
        kernel spectrum; broadcast products over the flattened frequencies F, summed over I: an
        Einsum there ran 15x slower on the CUDA provider, bench/RESULTS.md "Seed 003 three
        ways"), y = Irfft(Y) [B, O, *N] sliced to the outputs with the strides."""
        nd = spec.nd
        half = (*plan.sizes[:-1], plan.half)
        frequencies = int(np.prod(half))
        kernel = plan.spectrum.reshape(spec.out_channels, spec.in_channels, frequencies)
        k_real = self.constant(kernel.real.astype(np.float32), "fft_kernel_real")
        k_imag = self.constant(kernel.imag.astype(np.float32), "fft_kernel_imag")
        end = {
            2 + i: size - length - a
            for i, (size, length, a) in enumerate(zip(plan.sizes, spatial_shape(x), spec.pads_begin))
        }
        padded = self.pad(x, nd + 2, {2 + i: a for i, a in enumerate(spec.pads_begin)}, end)
        ms = {"signal_ndim": nd, "onesided": 1, "normalized": 0}
        spectrum = self.node("Rfft", [padded], ms, domain=MICROSOFT)  # [B, I, *N', 2]
        flat = self.node("Reshape", [spectrum, self.ints([0, 1, spec.in_channels, frequencies, 2])])
        x_real, x_imag = (self.node("Gather", [flat, self.ints(i)], {"axis": -1}) for i in (0, 1))
        summed = self.ints([2])

        def product(a, b):  # [B, 1, I, F] * [O, I, F] -> [B, O, 1, F]: broadcast products summed over I
            times = self.node("Mul", [a, b])
            return times if spec.in_channels == 1 else self.node("ReduceSum", [times, summed], {"keepdims": 1})

        y_real = self.node("Sub", [product(x_real, k_real), product(x_imag, k_imag)])
        y_imag = self.node("Add", [product(x_real, k_imag), product(x_imag, k_real)])
        column = self.ints([0, spec.out_channels, frequencies, 1])  # [B, O, 1, F] as [B, O, F, 1]: the same order
        parts = [self.node("Reshape", [part, column]) for part in (y_real, y_imag)]
        joined = self.node("Concat", parts, {"axis": -1})  # [B, O, F, 2]
        shaped = self.node("Reshape", [joined, self.ints([0, spec.out_channels, *half, 2])])
        signal = self.node("Irfft", [shaped], ms, domain=MICROSOFT)  # [B, O, *N]
        axes = list(range(2, 2 + nd))
        ends = [(count - 1) * step + 1 for count, step in zip(plan.output, plan.strides)]
        result = self.node(
            "Slice", [signal, self.ints([0] * nd), self.ints(ends), self.ints(axes), self.ints(list(plan.strides))]
        )
        if spec.has_bias and np.any(spec.bias):
            bias = self.constant(spec.bias.reshape(1, -1, *[1] * nd).astype(np.float32), "fft_bias")
            result = self.node("Add", [result, bias])
        return result

    def _body(self, inputs, build) -> ir.Graph:
        """A Scan body: the nodes build(*inputs) makes, as a graph of their own."""
        outer, self.nodes = self.nodes, []
        try:
            output = build(*inputs)
        finally:
            made, self.nodes = self.nodes, outer
        return ir.Graph(
            nodes=made, inputs=list(inputs), outputs=[output], name=self.context.fresh("fft_body"), opset=self.opset
        )

    def _one_image(self, image, k_real, k_imag, kernel_shape, plan, spec):
        """image [I, *L] -> its half spectrum X [1, I, *N', 1] (real and imaginary planes), then
        y [O, *out] one output channel at a time."""
        nd, last = spec.nd, 1 + spec.nd  # spatial axes are 2 .. 1+nd of [1, C, *L]
        rank = nd + 2
        begin = {2 + i: a for i, a in enumerate(spec.pads_begin)}
        end = {2 + i: e for i, e in enumerate(spec.pads_end)}
        end[last] = end.get(last, 0) + plan.sizes[-1] - plan.padded[-1]
        batch = self.node("Unsqueeze", [image, self.ints([0])])  # [1, I, *L]
        padded = self.pad(batch, rank, begin if nd == 1 else {last: begin[last]}, end if nd == 1 else {last: end[last]})
        signal = self.node("Unsqueeze", [padded, self.ints([rank])])  # [1, I, *L, 1]
        spectrum = self.dft(signal, last, onesided=True)  # half spectrum on the last axis
        if nd == 2:
            spectrum = self.pad(spectrum, rank + 1, {2: begin[2]}, {2: end[2] + plan.sizes[0] - plan.padded[0]})
            spectrum = self.dft(spectrum, 2)
        real, imaginary = self.node("Split", [spectrum, self.ints([1, 1])], {"axis": -1}, outputs=2)
        k_slices = [
            ir.Variable(self.context.fresh(name), np.float32, list(kernel_shape))
            for name in ("fft_k_real", "fft_k_imag")
        ]
        body = self._body(k_slices, lambda kr, ki: self._one_channel(real, imaginary, kr, ki, plan, spec))
        return self.node("Scan", [k_real, k_imag], {"body": body, "num_scan_inputs": 2})  # [O, *out]

    def _one_channel(self, real, imaginary, k_real, k_imag, plan, spec):
        """K_o [I, *N', 1] (real and imaginary planes of output channel o's kernel spectrum) and
        X (the image's, read from the enclosing body) -> y_o [*out]."""
        nd, last = spec.nd, 1 + spec.nd
        rank = nd + 2
        product = self._times_kernel(real, imaginary, k_real, k_imag, spec.in_channels)  # [1, 1, *N', 2]
        if nd == 2:
            product = self.slice(self.dft(product, 2, inverse=True), 2, plan.output[0], plan.strides[0])
        signal = self.dft(product, last, inverse=True, onesided=True, length=plan.sizes[-1])  # [1, 1, ..., N, 1]
        signal = self.slice(signal, last, plan.output[-1], plan.strides[-1])
        return self.node("Squeeze", [signal, self.ints([0, 1, rank])])  # [*out]

    def _times_kernel(self, real, imaginary, k_real, k_imag, in_channels: int):
        """sum_c X[c] * K[c] in complex arithmetic, K = conj FFT(W_o) (the plan's): real part
        xr*kr - xi*ki, imaginary part xr*ki + xi*kr, on [..., 1] planes; [1, 1, *N', 2]."""

        def times(a, b):
            return self.node("Mul", [a, b])

        out_real = self.node("Sub", [times(real, k_real), times(imaginary, k_imag)])
        out_imag = self.node("Add", [times(real, k_imag), times(imaginary, k_real)])
        if in_channels > 1:
            axes = self.ints([1])
            out_real = self.node("ReduceSum", [out_real, axes], {"keepdims": 1})
            out_imag = self.node("ReduceSum", [out_imag, axes], {"keepdims": 1})
        return self.node("Concat", [out_real, out_imag], {"axis": -1})
