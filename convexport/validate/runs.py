"""The runs validation judges: the reference's outputs on every input set (one session at a
time), the candidate's, the reference summed in another order or rounded to half, and TF32's
effect on CUDA. Nothing here judges; judges.py does."""

from __future__ import annotations

import numpy as np
import onnx

from ..errors import ConvexportError
from ..ir.slots import HALF_TYPES, element_types
from ..load.inputs import InputSets, dynamic_dims_note
from ..runtime import MissingKernel, RunFailure, checked_run, create_session
from .float64 import Float64Evaluator, Float64Unavailable
from .rounded_run import lost_outputs, rounded_runs


class NoMadeUpInputs(RunFailure):
    """The reference model does not run on the random inputs convexport makes (the values of
    an int input are a shape, say), or convexport makes none of an input's type: only the
    caller's own arrays (--inputs) can check it."""


def reference_runs(reference: onnx.ModelProto, sets: InputSets, label: str, device: str):
    """The reference's output names, the input sets' arrays (the made-up ones, then the given)
    and its outputs on each; its session is gone when this returns."""
    session = _evaluator(reference, label, device)
    names = [out.name for out in session.get_outputs()]
    try:
        made_up = sets.made_up_feeds()
    except ConvexportError as exc:  # an input of a type convexport makes no data for
        raise NoMadeUpInputs(str(exc)) from None
    hint = dynamic_dims_note(sets.specs, f"take the sizes 1 to {sets.made_up}")
    all_feeds = made_up + list(sets.given)
    outputs = []
    for index, feeds in enumerate(all_feeds):
        is_made_up = index < sets.made_up  # the rest are the caller's own arrays: no dims to fix
        try:
            outputs.append(
                checked_run(lambda feeds=feeds: session.run(names, feeds), feeds, label, hint if is_made_up else "")
            )
        except RunFailure as exc:
            if is_made_up:
                raise NoMadeUpInputs(str(exc)) from exc
            raise
    return names, all_feeds, outputs


def candidate_runs(candidate, names, all_feeds, label, device) -> tuple[list, str | None]:
    """The candidate's outputs on each input set, or why it fails where the reference runs (a
    missing output, a failed run: the candidate is wrong); its session is gone when this returns."""
    session = _evaluator(candidate, label, device)
    missing = [name for name in names if name not in {o.name for o in session.get_outputs()}]
    if missing:
        return [], f"candidate lacks output(s) {', '.join(missing)}"
    all_feeds = [in_declared_types(candidate, feeds) for feeds in all_feeds]
    try:
        return [checked_run(lambda feeds=feeds: session.run(names, feeds), feeds, label) for feeds in all_feeds], None
    except RunFailure as exc:
        return [], str(exc)


def in_declared_types(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """float32 input arrays as float16 where the model declares that input float16 (a model
    written with --io-dtype fp16 is fed the same input sets as its float32 original)."""
    half = {value.name for value in model.graph.input if value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16}
    return {k: v.astype(np.float16) if k in half and v.dtype == np.float32 else v for k, v in feeds.items()}


class _ReferenceSession:
    """onnx.reference.ReferenceEvaluator behind ONNX Runtime's session interface: slow, but it
    runs what a provider lacks kernels for (bfloat16 Gemm, MatMul, Add on the CPU provider; the
    com.microsoft FFT ops the CUDA provider has and the CPU one lacks: validate/float64/fft_ops.py)."""

    def __init__(self, model: onnx.ModelProto):
        from onnx.reference import ReferenceEvaluator

        from .float64.fft_ops import REFERENCE_OPS

        self._evaluator = ReferenceEvaluator(model, new_ops=REFERENCE_OPS)
        self._outputs = list(model.graph.output)

    def get_outputs(self):
        return self._outputs

    def run(self, names, feeds):
        return self._evaluator.run(names, feeds)


def _evaluator(model: onnx.ModelProto, what: str, device: str = "cpu"):
    try:
        return create_session(model, device, optimize=False, what=what, tf32=False, search=False, prepack=False)
    except MissingKernel:
        return _ReferenceSession(model)


def reordered_reference(reference, names, feeds, sets: list[int], device) -> dict[int, list]:
    """The reference's outputs on the input sets `sets` from a session that sums in another
    order (ONNX Runtime's graph optimisations and packed weights on, as a deployment runs it),
    by set: its distance from the checking session's run is the reference's float32 noise on
    that set (NoiseFloor)."""
    try:
        session = create_session(reference, device, what="the model as given", tf32=False, search=False)
        return {index: checked_run(lambda i=index: session.run(names, feeds[i]), feeds[index], "the model as given")
                for index in sets}  # fmt: skip
    except ConvexportError:  # a kernel its optimisations need and lack: the noise floor as measured
        return {}


def rounded_reference(reference, names, feeds, expected, exact, precision) -> list[dict[str, np.ndarray]]:
    """Per input set, the reference's outputs with every value rounded to `precision`
    (validate/rounded_run.py), for the outputs that run keeps on every set (rounded_run.lost_outputs:
    against the exact result where there is one, else the reference's run); empty where no
    precision is given, or the CPU provider has no kernel to run it (a bfloat16 model: the
    bound counts the original's own error alone)."""
    if precision is None:
        return [{} for _ in feeds]

    try:
        runs = rounded_runs(reference, element_types(reference), HALF_TYPES[precision], feeds)
    except MissingKernel:
        return [{} for _ in feeds]
    wanted = [
        dict(zip(names, exact.outputs[index] if exact and exact.available(index) else outputs))
        for index, outputs in enumerate(expected)
    ]
    kept = set(names) - lost_outputs(runs, wanted, names)
    return [{name: run[name] for name in kept} for run in runs]


def float64_or_none(model: onnx.ModelProto) -> Float64Evaluator | None:
    try:
        return Float64Evaluator(model)
    except Float64Unavailable:
        return None
