"""Operators of ONNX Runtime's com.microsoft domain that convexport writes, for ONNX's
reference evaluator: where ONNX Runtime's CPU provider has no kernel for them (Rfft and Irfft
run on the CUDA provider only), the CPU check of a graph holding them runs there.

Rfft(x, signal_ndim=n, onesided=1, normalized=0) is the real FFT over x's last n axes, one-sided
on the last, its (real, imaginary) parts on a new last axis: [..., N_1, ..., N_n] ->
[..., N_1, ..., N_n/2 + 1, 2], unnormalised (as numpy.fft.rfftn). Irfft is its inverse,
[..., N_1, ..., N_n/2 + 1, 2] -> [..., N_1, ..., N_n] (N_n even), scaled by 1/prod(N) (as
numpy.fft.irfftn); normalized=1 scales both by 1/sqrt(prod(N)) instead. ONNX Runtime's CUDA
kernels agree with these to fp32 rounding (bench/RESULTS.md: sample_models/seed003_large_kernel.py
three ways).
"""

from __future__ import annotations

import math

import numpy as np
from onnx.reference.op_run import OpRun


class Rfft(OpRun):
    op_domain = "com.microsoft"

    def _run(self, x, normalized=0, onesided=1, signal_ndim=1):
        if not onesided:
            raise NotImplementedError("Rfft with onesided=0")
        axes = tuple(range(-signal_ndim, 0))
        spectrum = np.fft.rfftn(x.astype(np.float64), axes=axes)
        if normalized:
            spectrum /= math.sqrt(math.prod(x.shape[-signal_ndim:]))
        return (np.stack([spectrum.real, spectrum.imag], axis=-1).astype(x.dtype),)


class Irfft(OpRun):
    op_domain = "com.microsoft"

    def _run(self, x, normalized=0, onesided=1, signal_ndim=1):
        if not onesided:
            raise NotImplementedError("Irfft with onesided=0")
        spectrum = x[..., 0].astype(np.float64) + 1j * x[..., 1].astype(np.float64)
        sizes = (*spectrum.shape[-signal_ndim:-1], 2 * (spectrum.shape[-1] - 1))
        signal = np.fft.irfftn(spectrum, s=sizes, axes=tuple(range(-signal_ndim, 0)))
        if normalized:
            signal *= math.sqrt(math.prod(sizes))
        return (signal.astype(x.dtype),)


REFERENCE_OPS = [Rfft, Irfft]
