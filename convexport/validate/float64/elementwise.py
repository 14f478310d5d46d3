"""Elementwise ops whose ONNX reference kernels are slow or not float64 throughout: Erf (onnx
1.23's is math.erf through np.vectorize with a float32 output type, so every Gelu of the
"float64" graph was rounded to float32; here erf.py's table-driven series in float64, or
torch's float64 erf where torch is loaded already) and Sigmoid (its reference evaluates two
exponentials and a where; here one, in place: bench/RESULTS.md, "Measurements behind the code")."""

from __future__ import annotations

import sys

import numpy as np
from onnx.reference.op_run import OpRun

from .erf import erf


class Erf(OpRun):
    op_domain = ""

    def _run(self, x):
        torch = sys.modules.get("torch")  # not imported for this alone: its import outweighs the op
        if torch is None or x.dtype != np.float64:
            return (erf(np.asarray(x, dtype=np.float64)).astype(x.dtype, copy=False),)
        with torch.no_grad():
            return (torch.special.erf(torch.from_numpy(np.ascontiguousarray(x))).numpy(),)


class Sigmoid(OpRun):
    """1 / (1 + e^-x), in place: accurate relative to the result for every x (for x << 0 the
    exponential dominates and the quotient is e^x to 2 ulps; e^-x overflows only below -709,
    where the result underflows to 0 anyway). Three times faster than the reference's two
    exponentials; 0.5 + 0.5 tanh(x / 2), faster still, rounds sigmoid(-40) to 0, which a Log
    after it would make -inf."""

    op_domain = ""

    def _run(self, x):
        y = np.negative(x)
        with np.errstate(over="ignore"):
            np.exp(y, out=y)
        y += 1.0
        np.reciprocal(y, out=y)
        return (y.astype(x.dtype, copy=False),)
