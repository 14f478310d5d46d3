"""The half stage (--dtype fp16): the validated model in half precision (convexport/half/) and the
report's precision section; a refusal (stages/refusal.py) where no conversion meets the
half-precision bound."""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import onnx

from ..half import HalfTarget, in_half_precision
from ..load.export import ExportResult
from ..load.float32_twin import edges_dropped
from ..report.types import Precision
from ..validate.results import ValidationResult
from .inputs import RunInputs
from .refusal import Refused
from .request import Request
from .rewrite import Rewritten


class Half(NamedTuple):
    model: onnx.ModelProto
    precision: Precision  # the report's section


def in_half(
    exported: ExportResult,
    rewritten: Rewritten,
    inputs: RunInputs,
    validated: ValidationResult | None,
    request: Request,
    cleanup: contextlib.ExitStack,
) -> Half:
    """The model in request.dtype, judged on validation's float64 reference and its runs of the
    original (`validated`; None where it did not run: both are made here). A large model's
    weights are in a folder `cleanup` removes (half/on_disk.py)."""
    request.steps.start(f"converting to {request.dtype}")
    exact = validated.exact if validated is not None else None
    original_runs = validated.reference_runs if validated is not None else None
    dtype, io_dtype = request.dtype, request.io_dtype
    assert dtype is not None and io_dtype is not None, "the load stage reads the model's own types"
    target = HalfTarget(dtype, io_dtype, request.device, rewritten.fused)
    half = in_half_precision(exported.reference, rewritten.outcome.model, inputs.sets, exact, target, original_runs)
    if half.files is not None:
        cleanup.enter_context(half.files)
    if half.passed:  # a float16 model's twin (load/float32_twin.py): its edges in float16 again
        half.nodes_half -= edges_dropped(half.model)
    precision = half.to_report()
    if not half.passed:
        raise Refused(f"{rewritten.source}: {half.failure()}; nothing was written", precision=precision)
    return Half(half.model, precision)
