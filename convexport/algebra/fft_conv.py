"""A convolution with a large kernel computed through the FFT.

An ONNX Conv is a correlation: y[o, j] = sum_{c, t} W[o, c, t] x_pad[c, s*j + d*t]. With the
input zero-padded to N >= its padded length along every spatial axis, correlation equals the
circular correlation for every output that does not wrap (j*s + d*(k-1) < L_pad), so

    Y[o] = IFFT( sum_c FFT(x_pad[c]) * conj(FFT(W_d[o, c])) ),   y = Y[o, ::s][:out]

where W_d is the (dilated) kernel placed at the origin of an N-sized grid. The kernel spectrum
is computed once here, in float64, as the half spectrum of a real FFT along the last axis
([O, I, N_1, ..., N_n/2 + 1], complex); sizes are powers of two, where ONNX Runtime's DFT is a
fast radix-2 FFT (other sizes take several times longer there). Exact to fp32 rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .spec import ConvSpec, Refusal, known


@dataclass(frozen=True)
class FftPlan:
    sizes: tuple[int, ...]  # FFT size per spatial axis (powers of two)
    padded: tuple[int, ...]  # the input's length per axis after the conv's pads
    spectrum: np.ndarray  # conj FFT of the kernel: [O, I, N_1, ..., N_n//2 + 1] complex128
    output: tuple[int, ...]  # the conv's output spatial shape
    strides: tuple[int, ...]

    @property
    def half(self) -> int:
        return self.sizes[-1] // 2 + 1


def next_power_of_two(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def plan_fft_conv(spec: ConvSpec, input_spatial: Sequence[int | None]) -> FftPlan:
    """The FFT plan of a conv on an input of static spatial shape."""
    static = known(input_spatial) if input_spatial is not None else None
    if static is None:
        raise Refusal("an FFT convolution needs a static spatial shape")
    if spec.nd not in (1, 2):
        raise Refusal(f"FFT convolution is implemented for 1-D and 2-D convs, not {spec.nd}-D")
    padded = tuple(n + a + e for n, a, e in zip(static, spec.pads_begin, spec.pads_end))
    sizes = tuple(next_power_of_two(n) for n in padded)
    dilated = np.zeros((spec.out_channels, spec.in_channels, *sizes))
    taps = tuple(slice(0, d * (k - 1) + 1, d) for k, d in zip(spec.kernel_shape, spec.dilations))
    dilated[(slice(None), slice(None), *taps)] = spec.weight
    spectrum = np.conj(np.fft.rfftn(dilated, axes=tuple(range(2, 2 + spec.nd))))
    return FftPlan(sizes, padded, spectrum, spec.output_shape(static), spec.strides)
