"""The exact result of a model: the model evaluated in float64.

`as_float64(model)` (widen.py) is the same graph computing in double; the weights are the
model's own values, widened exactly, so the float64 run is the model's intended function to
about 1e-16, the yardstick both the original's and the optimized graph's float32 runs are
measured with (validate/exact_check.py).

It runs in ONNX's reference evaluator, with the kernels that are wrong there, not float64
throughout, or too slow replaced by this package's own (KERNELS; each module says why) and the
com.microsoft FFT ops convexport writes (fft_ops.py). tests/test_float64_kernels.py checks every
op the float64 path runs against ONNX Runtime's float32 kernels and torch's float64 ones, opset
by opset; node_check.py checks the reference of each model validated against ONNX Runtime node
by node. What the evaluator cannot run makes the float64 reference unavailable
(Float64Unavailable, with the reason), and validation says so.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager

import numpy as np
import onnx

from ...errors import first_line
from .batch_norm import BatchNormalization
from .conv import FFT_TAPS, WINDOW_ELEMENTS, Conv, ConvTranspose, conv_work
from .elementwise import Erf, Sigmoid
from .fft_ops import REFERENCE_OPS as FFT_OPS
from .pooling import AveragePool, MaxPool
from .resize import Resize
from .softmax import Hardmax, LogSoftmax, Softmax
from .widen import DOUBLE, FLOAT_TYPES, as_float64

KERNELS = [
    Conv, ConvTranspose, BatchNormalization, MaxPool, AveragePool, Resize, Softmax, LogSoftmax, Hardmax, Erf, Sigmoid,
    *FFT_OPS,
]  # fmt: skip

__all__ = [
    "DOUBLE", "FFT_TAPS", "FLOAT_TYPES", "KERNELS", "WINDOW_ELEMENTS", "Float64Evaluator", "Float64OutOfTime",
    "Float64Unavailable",
    "as_float64", "conv_work",
]  # fmt: skip


class Float64Unavailable(Exception):
    """The model cannot be evaluated in float64 here (the reason in the message)."""


class Float64Evaluator:
    """The float64 graph of a model in ONNX's reference evaluator: run(feeds) takes the
    model's own feeds (floats widened here) and gives its outputs in float64."""

    def __init__(self, model: onnx.ModelProto, kernels: list | None = None):
        from onnx.reference import ReferenceEvaluator

        try:
            self.evaluator = ReferenceEvaluator(as_float64(model), new_ops=KERNELS if kernels is None else kernels)
        except Exception as exc:  # an op the evaluator lacks, a type it refuses
            raise Float64Unavailable(_reason(exc)) from None

    def run(self, feeds: dict[str, np.ndarray], intermediate: bool = False, deadline: float | None = None):
        """The outputs in order; with `intermediate`, every value the graph computes by name.
        `deadline` (time.perf_counter()'s): the run stops at the first node that would start
        after it, with Float64OutOfTime."""
        wide = {name: widen_array(value) for name, value in feeds.items()}
        try:
            with np.errstate(all="ignore"), _torch_on_one_thread(), _until(self.evaluator, deadline):
                if intermediate:
                    return self.evaluator.run(None, wide, intermediate=True)
                return [np.asarray(value) for value in self.evaluator.run(None, wide)]
        except Float64OutOfTime:
            raise
        except Exception as exc:
            raise Float64Unavailable(_reason(exc)) from None


class Float64OutOfTime(Float64Unavailable):
    """A float64 run stopped at its deadline."""


@contextmanager
def _until(evaluator, deadline: float | None):
    """Each of the evaluator's nodes checks the clock before it runs (ONNX's evaluator calls
    each node's run() in turn: a run of 100,000 small nodes took a minute past any budget)."""
    if deadline is None:
        yield
        return
    nodes = evaluator.rt_nodes_

    def timed(run):
        def checked(*args, **kwargs):
            if time.perf_counter() > deadline:
                raise Float64OutOfTime("the float64 run did not finish within its time budget")
            return run(*args, **kwargs)

        return checked

    for node in nodes:
        node.run = timed(node.run)
    try:
        yield
    finally:
        for node in nodes:
            del node.run  # the class's own again


@contextmanager
def _torch_on_one_thread():
    """torch's kernels (Erf, where torch is loaded) on one thread while numpy's BLAS has its
    own: two pools of spinning threads on the same cores made a float64 run several times
    slower (bench/RESULTS.md, "Measurements behind the code"). The caller's setting is
    restored after; torch is not imported for it."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def widen_array(value: np.ndarray) -> np.ndarray:
    """A float array (float16, bfloat16, float32) as float64; any other as it is."""
    is_float = value.dtype.kind == "f" or value.dtype.name == "bfloat16"
    return value.astype(np.float64) if is_float else value


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {first_line(exc, 200)}"
