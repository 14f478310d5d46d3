"""What validation finds, as result objects: the tolerances asked, each output's error
statistics (OutputError), the reference's runs kept for a later judge (ReferenceRuns) and the
whole comparison (ValidationResult), each with the report entry the schema declares."""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np

from ..errors import ConvexportError
from ..report import types as report_types
from .exact_check import ExactReference

DEFAULT_RTOL = 1e-4


DEFAULT_ATOL = 1e-5


# Default (rtol, atol) by output dtype when none is given: about 100x the unit roundoff for
# the fp32 ones above, and for halves, whose folded weights are rounded to 11 (fp16) or 8
# (bf16) bits, a few units of their roundoff.
DTYPE_DEFAULTS = {
    "float64": (1e-9, 1e-12),
    "float32": (DEFAULT_RTOL, DEFAULT_ATOL),
    "float16": (5e-3, 1e-3),
    "bfloat16": (4e-2, 1e-2),
}


NonfiniteOn = Literal["made-up inputs", "the given inputs", "made-up and given inputs"]


@dataclass(frozen=True)
class Tolerances:
    """Default rtol/atol (None: by the output's dtype, DTYPE_DEFAULTS) and per-output
    overrides (Polygraphy style: `--atol y:1e-4 --atol 1e-5`)."""

    rtol: float | None = None
    atol: float | None = None
    rtol_by_output: tuple[tuple[str, float], ...] = ()
    atol_by_output: tuple[tuple[str, float], ...] = ()

    def for_output(self, name: str, dtype: str = "float32") -> tuple[float, float]:
        rtol, atol = DTYPE_DEFAULTS.get(dtype, DTYPE_DEFAULTS["float32"])
        rtol = dict(self.rtol_by_output).get(name, rtol if self.rtol is None else self.rtol)
        atol = dict(self.atol_by_output).get(name, atol if self.atol is None else self.atol)
        return rtol, atol

    def explicit_for(self, name: str) -> bool:
        """Whether the user bounded this output's error (--rtol/--atol, for all or for it)."""
        named = {output for output, _ in (*self.rtol_by_output, *self.atol_by_output)}
        return self.rtol is not None or self.atol is not None or name in named

    def check_outputs(self, outputs: list[str], model: str) -> None:
        """A ConvexportError for a per-output tolerance naming no output of the model."""
        for option, given in (("--rtol", self.rtol_by_output), ("--atol", self.atol_by_output)):
            unknown = sorted({name for name, _ in given} - set(outputs))
            if unknown:
                raise ConvexportError(
                    f"{option} {', '.join(unknown)}: {model} has no such output (outputs: {', '.join(outputs)})"
                )

    @classmethod
    def parse(cls, rtol: list[str] | float | None, atol: list[str] | float | None) -> Tolerances:
        """From CLI values: each a number (the default) or NAME:number (one output)."""
        rtol_default, rtol_by = _parse_tolerance("--rtol", rtol)
        atol_default, atol_by = _parse_tolerance("--atol", atol)
        return cls(rtol_default, atol_default, rtol_by, atol_by)


def _parse_tolerance(option: str, values) -> tuple[float | None, tuple[tuple[str, float], ...]]:
    default = None
    if values is None:
        return default, ()
    if isinstance(values, (int, float)):
        values = [str(values)]
    by_output = []
    for text in values:
        name, _, number = str(text).rpartition(":")
        try:
            value = float(number)
        except ValueError:
            raise ConvexportError(f"{option} {text!r}: expected a number or NAME:number") from None
        if not 0 <= value < math.inf:
            raise ConvexportError(f"{option} {text!r}: a tolerance is a finite number >= 0")
        if name:
            by_output.append((name, value))
        else:
            default = value
    return default, tuple(by_output)


@dataclass
class OutputError:
    max_abs: float = 0.0
    mean_abs: float = 0.0
    max_rel: float = 0.0
    mean_rel: float = 0.0
    cosine: float = 1.0
    mismatches: int = 0
    elements: int = 0
    rtol: float | None = DEFAULT_RTOL  # None: no fixed tolerance (judged against the exact result)
    atol: float | None = DEFAULT_ATOL
    # against the exact (float64) result, where it was computed (validate/exact_check.py): the
    # original's own float32 error (its noise floor), the optimized graph's, the optimized
    # graph's in float64, and the bound the optimized graph's had to meet
    exact_error_original: float | None = None
    exact_error: float | None = None
    exact_error_float64: float | None = None
    exact_bound: float | None = None
    # the reference's with every value rounded to the candidate's half type, where it counted
    exact_error_rounded: float | None = None
    nonfinite: int = 0  # elements where the original gives NaN or an infinity

    def to_report(self) -> report_types.OutputError:
        """The fields report/types.py's OutputError declares (the one list of what is reported;
        tests/test_report_schema.py checks that this class holds each), exact_error_rounded only
        where it counted (a half-precision candidate)."""
        reported = {
            name: getattr(self, name)
            for name in report_types.OutputError.__annotations__
            if name != "exact_error_rounded" or self.exact_error_rounded is not None
        }
        return cast(report_types.OutputError, reported)

    def merge(self, other: OutputError) -> OutputError:
        """This output's error over one more input set's: field by field, the larger error, the
        mean weighted by elements, the smaller cosine, the counts added, the tolerances kept."""
        elements = self.elements + other.elements

        def mean(a, b):
            return (a * self.elements + b * other.elements) / max(elements, 1)

        def most(a, b):
            return b if a is None else a if b is None else max(a, b)

        def kept(a, b):
            return a

        combined: dict[str, Callable[[Any, Any], Any]] = {
            "mean_abs": mean, "mean_rel": mean, "cosine": min, "rtol": kept, "atol": kept,
            "mismatches": operator.add, "elements": operator.add, "nonfinite": operator.add,
        }  # fmt: skip
        return OutputError(**{
            slot.name: combined.get(slot.name, most)(getattr(self, slot.name), getattr(other, slot.name))
            for slot in dataclasses.fields(self)
        })  # fmt: skip


@dataclass(frozen=True)
class ReferenceRuns:
    """The reference model's outputs (by position, as `names`) on each input set, on `device`."""

    names: list[str]
    feeds: list[dict]
    outputs: list[list[np.ndarray]]
    device: str


@dataclass
class ValidationResult:
    passed: bool
    runs: int
    tolerances: Tolerances
    outputs: dict[str, OutputError] = field(default_factory=dict)
    problem: str | None = None  # a structural mismatch (missing output, shape) if any
    inputs: list[str] = field(default_factory=list)
    reference: Literal["float64", "float32"] = (
        "float32"  # what the outputs were judged against: float64 (the exact result) or float32
    )
    reference_note: str | None = None  # input sets without a float64 reference, and why
    nonfinite_on: NonfiniteOn | None = None  # the input sets where the reference gives NaN or infinity, in words
    exact: ExactReference | None = field(default=None, repr=False)  # for another check on the same input sets
    precision: str | None = None  # the candidate's compute type where coarser than its outputs' (float16)
    # the first input set and the candidate's outputs on it, for a second look at the candidate
    # that needs no session of it again (TF32's effect on the device)
    sample: tuple[dict, list[np.ndarray]] | None = field(default=None, repr=False)
    # the reference's outputs on every input set, for a later judge of the same inputs (--dtype
    # fp16's) that need not run the reference again
    reference_runs: ReferenceRuns | None = field(default=None, repr=False)

    def to_report(self) -> report_types.Comparison:
        report: report_types.Comparison = {
            "passed": self.passed,
            "runs": self.runs,  # rtol/atol null: by each output's dtype, or none where judged against float64
            "rtol": self.tolerances.rtol,
            "atol": self.tolerances.atol,
            "reference": self.reference,
            "inputs": self.inputs,
            "outputs": {name: error.to_report() for name, error in self.outputs.items()},
        }
        if self.reference_note:
            report["reference_note"] = self.reference_note
        if self.exact is not None and self.exact.available(0):
            report["reference_check"] = self.exact.check_report()
            report["reference_source"] = self.exact.source  # whose float64 run: the ONNX graph's or torch's
        if self.exact is not None and self.exact.export_check is not None:
            report["export_check"] = self._named(self.exact.export_check)
        if self.problem:
            report["problem"] = self.problem
        if self.nonfinite_on:
            report["nonfinite_on"] = self.nonfinite_on
        if self.precision:
            report["precision"] = self.precision  # judged at its roundoff
        return report

    def _named(self, export_check: dict) -> report_types.ExportCheck:
        """The export check with its output named rather than numbered."""
        named = dict(export_check)
        if "output" in named:
            names, index = list(self.outputs), named["output"]
            named["output"] = names[index] if index < len(names) else index
        return cast(report_types.ExportCheck, named)  # exact_check.py's export check has its fields

    def summary(self) -> str:
        if self.problem:
            return self.problem
        failing = [item for item in self.outputs.items() if item[1].mismatches]
        worst = max(failing or self.outputs.items(), key=lambda item: item[1].max_rel, default=None)
        if worst is None:
            return "no outputs compared"
        name, error = worst
        against = f"max abs error {error.max_abs:.3g}, max rel error {error.max_rel:.3g}, cosine {error.cosine:.9f}"
        if error.exact_error is not None:
            beside = "" if error.exact_error_float64 is None else f" (in float64 {error.exact_error_float64:.3g})"
            return (
                f"output {name!r}: error against the float64 result {error.exact_error:.3g}{beside} where the "
                f"original's own is {error.exact_error_original:.3g} (bound {error.exact_bound:.3g}), "
                f"{error.mismatches} of {error.elements} elements beyond; against the original: {against}"
            )
        outside = f"{error.mismatches} of {error.elements} elements outside rtol={error.rtol:g} atol={error.atol:g}"
        return f"output {name!r}: {against}, {outside}"
