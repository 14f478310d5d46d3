"""Does the candidate graph compute what the reference computes? ONNX Runtime decides.

Both models run on the CPU provider with graph optimisations off (so ORT's own fusions cannot
hide or cause a difference) on seeded random inputs (dynamic dims take the sizes 1, 2, 3, ...
in successive runs) and on any input sets given.

The check is per element and scale-aware:

    |cand - ref| <= atol + rtol * max(|ref|, rms(ref))

where rms(ref) is the root mean square of that output in that run. A folded graph changes the
order of fp32 sums, whose error is proportional to the size of the terms, i.e. to the output's
scale, not to each element's own value: an element that is near zero only by cancellation
gets the tolerance of its neighbours. With the defaults (rtol 1e-4, atol 1e-5) fp32
reassociation noise (~1e-6 of the scale) passes and a 1% change of one weight tensor of a
ResNet-sized model fails (tests/test_validation.py shows both). NaN must meet NaN and an
infinity the same infinity, else the element fails.

Per output: max and mean absolute error, max and mean relative error (|cand - ref| /
max(|ref|, rms(ref))), cosine similarity (the lowest over the runs), failing elements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast

import numpy as np
import onnx

from ..errors import ConvexportError
from ..ir import heap
from ..ir.same import same_computation
from ..ir.slots import HALF_TYPES, element_types
from ..ir.stats import graph_stats
from ..load.float32_twin import weights_half_type
from ..load.input_data import load_npz
from ..load.input_domains import sized_by_running
from ..load.inputs import InputSpec, dynamic_dims_note, random_inputs, with_overrides
from ..report import types as report_types
from ..runtime import MissingKernel, RunFailure, checked_run, create_session
from .exact_check import ExactReference, exact_reference, judge, noise_floor_bound
from .float64 import Float64Evaluator, Float64Unavailable
from .float64.precision import dtype_name, rms
from .rounded_run import largest_apart, lost_outputs, rounded_runs

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5
DEFAULT_RUNS = 3
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


class NoMadeUpInputs(RunFailure):
    """The reference model does not run on the random inputs convexport makes (the values of
    an int input are a shape, say), or convexport makes none of an input's type: only the
    caller's own arrays (--inputs) can check it."""


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
        """Its fields, exact_error_rounded only where it counted (a half-precision candidate)."""
        fields = {
            name: value for name, value in vars(self).items() if name != "exact_error_rounded" or value is not None
        }
        return cast(report_types.OutputError, fields)  # the report's OutputError declares these fields

    def merge(self, other: OutputError) -> OutputError:
        elements = self.elements + other.elements

        def mean(a, b):
            return (a * self.elements + b * other.elements) / max(elements, 1)

        def most(a, b):
            return b if a is None else a if b is None else max(a, b)

        return OutputError(
            max(self.max_abs, other.max_abs),
            mean(self.mean_abs, other.mean_abs),
            max(self.max_rel, other.max_rel),
            mean(self.mean_rel, other.mean_rel),
            min(self.cosine, other.cosine),
            self.mismatches + other.mismatches,
            elements,
            self.rtol,
            self.atol,
            most(self.exact_error_original, other.exact_error_original),
            most(self.exact_error, other.exact_error),
            most(self.exact_error_float64, other.exact_error_float64),
            most(self.exact_bound, other.exact_bound),
            most(self.exact_error_rounded, other.exact_error_rounded),
            self.nonfinite + other.nonfinite,
        )


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


def compare_models(
    reference: onnx.ModelProto,
    candidate: onnx.ModelProto,
    inputs: list[InputSpec],
    runs: int = DEFAULT_RUNS,
    tolerances: Tolerances = Tolerances(),
    seed: int = 0,
    extra_feeds: Sequence[dict] = (),
    labels: tuple[str, str] = ("the reference model", "the candidate"),
    device: str = "cpu",
    exact: ExactReference | bool | None = True,
    exact_budget_s: float | None = None,
    torch_source=None,
    precision: str | None = None,
) -> ValidationResult:
    """Run both models on `runs` seeded input sets (and `extra_feeds`), compare every output:
    against the reference's float64 result where it has one (validate/exact_check.py; `exact`: True to
    compute it here, within `exact_budget_s` seconds; an ExactReference computed before on the
    same input sets; False for none),
    else with the tolerances; explicit tolerances (--rtol/--atol) bound the candidate against
    the reference's own run besides. `torch_source` (torch_reference.torch_float64's) makes a
    torch model's own float64 run the exact result where it agrees with the ONNX graph's. The
    reference failing to run is a RunFailure (the inputs
    do not suit the model); the candidate failing where the reference runs fails the
    validation. `labels` name the two models in those messages. On CUDA both run with TF32 off
    (tf32_effect reads TF32's own effect). `precision` names the type the candidate computes in
    where it is coarser than its outputs' (float16 inside a float32 interface): its roundoff
    sets the bound (a float16 interface is fed its inputs in float16), and the reference run
    with every value rounded to it (validate/rounded_run.py) counts as its own error as well, for
    each output that run keeps."""
    tolerances.check_outputs([out.name for out in reference.graph.output], labels[0])
    result = ValidationResult(True, runs + len(extra_feeds), tolerances, inputs=[str(spec) for spec in inputs])
    # One session at a time: the reference's outputs on every input set are computed and its
    # session released before the candidate's opens (a session holds the model's weights: two
    # at once doubled validation's peak memory on large models).
    names, all_feeds, expected_runs = reference_runs(reference, inputs, runs, seed, extra_feeds, labels[0], device)
    result.reference_runs = ReferenceRuns(names, all_feeds, expected_runs, device)
    result.nonfinite_on = _nonfinite_on(expected_runs, runs)
    heap.release_after(reference)  # its session, before the float64 evaluator's or the candidate's
    if exact is True:
        exact = exact_reference(
            reference, all_feeds, graph_stats(candidate)["flops"], exact_budget_s, torch_source, expected_runs
        )
    exact = exact if isinstance(exact, ExactReference) else None  # None: no float64 reference
    if exact is not None:
        result.reference = "float64" if exact.available(0) else "float32"
        result.reference_note, result.exact = _reference_note(exact), exact
    # a reference that disagrees with ONNX Runtime node by node is suspect: the float32 check too
    strict = exact is not None and exact.suspect is not None
    unchanged = same_computation(reference, candidate)
    if unchanged:  # the reference's graph node for node: ONNX Runtime computes it alike
        actual_runs, problem = expected_runs, None
    else:
        actual_runs, problem = _candidate_runs(candidate, names, all_feeds, labels[1], device)
    if problem is not None:
        result.passed, result.problem = False, problem
        return result
    result.sample = (all_feeds[0], actual_runs[0]) if all_feeds else None
    rounded = _rounded_reference(reference, names, all_feeds, expected_runs, exact, precision)
    floor = _NoiseFloor.measured(reference, names, all_feeds, expected_runs, exact, device) if not strict else None
    candidate64 = _float64_or_none(candidate) if exact is not None and exact.candidate_too and not unchanged else None
    for index, (feeds, expected, actual) in enumerate(zip(all_feeds, expected_runs, actual_runs)):
        float64_run = candidate64.run(feeds) if candidate64 is not None and exact and exact.available(index) else None
        if unchanged and exact is not None and exact.available(index) and exact.source == "onnx":
            float64_run = exact.outputs[index]  # the reference's own float64 run
        for position, (name, ref, cand) in enumerate(zip(names, expected, actual)):
            ours = rounded[index].get(name)
            if ref.shape != cand.shape:
                result.passed = False
                result.problem = f"output {name!r}: shape {cand.shape} instead of {ref.shape}"
                return result
            if exact is not None and exact.available(index):
                exact_values = dict(zip(names, exact.outputs[index] or []))[name]
                candidate_float64 = float64_run[position] if float64_run is not None else None
                error = compare_exactly(
                    ref, cand, exact_values, candidate_float64, tolerances, name, strict, precision, ours
                )
            elif floor is not None and name in result.outputs:
                own = floor.on_set(index, position, name, ref, result.outputs[name], ours)
                error = compare_by_noise_floor(ref, cand, own, tolerances, name, precision)
            else:
                error = compare_arrays(ref, cand, *tolerances.for_output(name, precision or dtype_name(ref)))
            result.outputs[name] = result.outputs[name].merge(error) if name in result.outputs else error
    if candidate64 is not None:
        del candidate64
        heap.release_after(candidate)
    result.passed = all(error.mismatches == 0 for error in result.outputs.values())
    return result


def _nonfinite_on(expected_runs: list[list[np.ndarray]], made_up: int) -> NonfiniteOn | None:
    """Which input sets (the first `made_up` made up, the rest the caller's) the reference gives
    NaN or infinity on, in words; None where it gives none."""
    sets = {
        "made-up" if index < made_up else "given"
        for index, outputs in enumerate(expected_runs)
        if any(output.dtype.kind in "fc" and not np.isfinite(output).all() for output in outputs)
    }
    if not sets:
        return None
    if sets == {"made-up"}:
        return "made-up inputs"
    return "the given inputs" if sets == {"given"} else "made-up and given inputs"


def reference_runs(reference, inputs, runs, seed, extra_feeds, label, device):
    """The reference's output names, the input sets (`runs` made up, then `extra_feeds`) and
    its outputs on each; its session is gone when this returns."""
    session = _evaluator(reference, label, device)
    names = [out.name for out in session.get_outputs()]
    # run r gives dynamic dims the size r + 1, so a graph that only works at one size fails
    try:
        made_up = [random_inputs(inputs, seed + run, dynamic_size=run + 1) for run in range(runs)]
    except ConvexportError as exc:  # an input of a type convexport makes no data for
        raise NoMadeUpInputs(str(exc)) from None
    hint = dynamic_dims_note(inputs, f"take the sizes 1 to {runs}")
    all_feeds = made_up + list(extra_feeds)
    outputs = []
    for index, feeds in enumerate(all_feeds):
        is_made_up = index < runs  # the rest are the caller's own arrays: no dims to fix
        try:
            outputs.append(
                checked_run(lambda feeds=feeds: session.run(names, feeds), feeds, label, hint if is_made_up else "")
            )
        except RunFailure as exc:
            if is_made_up:
                raise NoMadeUpInputs(str(exc)) from exc
            raise
    return names, all_feeds, outputs


def _candidate_runs(candidate, names, all_feeds, label, device) -> tuple[list, str | None]:
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


def tf32_effect(
    model: onnx.ModelProto, sample: tuple[dict, list[np.ndarray]], session=None
) -> dict[str, OutputError] | None:
    """Per output, how far `model` as deployed on CUDA (ORT's default options: TF32 on, so that
    convolutions and matrix products round their inputs to 10-bit mantissas, and its graph
    optimizations) lands from its `sample` outputs with TF32 off (compare_models' on the same
    device), on the sample's inputs. `session` is such a session of `model` already made (the
    profile's), else one is made: each CUDA session's first run builds a cuDNN plan per
    convolution (seconds on a real model: bench/RESULTS.md). None where ORT's CUDA provider has
    no kernel for the graph."""
    feeds, off = sample
    what = "the optimized graph with TF32 on"
    if session is None:
        try:
            session = create_session(model, "cuda", what=what)
        except MissingKernel:
            return None
    names = [output.name for output in session.get_outputs()]
    on = checked_run(lambda: session.run(names, feeds), feeds, what)
    return {name: compare_arrays(without, with_tf32, 0.0, 0.0) for name, without, with_tf32 in zip(names, off, on)}


def _evaluator(model: onnx.ModelProto, what: str, device: str = "cpu"):
    try:
        return create_session(model, device, optimize=False, what=what, tf32=False, search=False, prepack=False)
    except MissingKernel:
        return _ReferenceSession(model)


def compare_arrays(ref: np.ndarray, cand: np.ndarray, rtol: float, atol: float) -> OutputError:
    """Error statistics of one output (see the module doc for the check); an output that is
    not numbers (strings) must be equal element for element."""
    if ref.size == 0:
        return OutputError(rtol=rtol, atol=atol)
    if ref.dtype.kind in "USO":
        unequal = int(np.count_nonzero(ref != cand))
        return OutputError(
            cosine=1.0 if not unequal else 0.0, mismatches=unequal, elements=int(ref.size), rtol=rtol, atol=atol
        )
    ref64, cand64 = ref.astype(np.float64), cand.astype(np.float64)
    finite = np.isfinite(ref64) & np.isfinite(cand64)
    same_special = (np.isnan(ref64) & np.isnan(cand64)) | (np.isinf(ref64) & (ref64 == cand64))
    diff = np.abs(np.subtract(ref64, cand64, where=finite, out=np.zeros_like(ref64)))
    scale = float(np.sqrt(np.mean(np.square(ref64[finite])))) if finite.any() else 0.0
    reference = np.maximum(np.abs(np.where(finite, ref64, 0.0)), scale)
    close = finite & (diff <= atol + rtol * reference)
    # against a reference of zero (all of it zero: no scale either) a relative error has no
    # meaning: infinite where the candidate differs, 0 where it does not
    rel = np.divide(diff, reference, out=np.where(diff > 0, np.inf, 0.0), where=reference > 0)
    cosine = _cosine(ref64[finite], cand64[finite])
    return OutputError(
        max_abs=float(diff.max()),
        mean_abs=float(diff[finite].mean()) if finite.any() else 0.0,
        max_rel=float(rel.max()),
        mean_rel=float(rel[finite].mean()) if finite.any() else 0.0,
        cosine=cosine,
        mismatches=int(np.count_nonzero(~(close | same_special))),
        elements=int(ref.size),
        rtol=rtol,
        atol=atol,
        nonfinite=int(np.count_nonzero(~np.isfinite(ref64))),
    )


def compare_exactly(
    ref: np.ndarray,
    cand: np.ndarray,
    exact: np.ndarray,
    cand64: np.ndarray | None,
    tolerances: Tolerances,
    name: str,
    strict: bool = False,
    precision: str | None = None,
    rounded: np.ndarray | None = None,
) -> OutputError:
    """One output judged against the exact result (exact_check.judge) at the roundoff of
    `precision` (default: the output's type), counting `rounded`'s error (the reference with
    every value rounded to `precision`) as its own where given; the statistics of the candidate
    against the reference's own run as compare_arrays gives them; explicit tolerances, where
    given (or the dtype's, when `strict`: the reference is suspect), as a bound on that
    difference besides."""
    dtype = precision or dtype_name(ref)
    if ref.dtype.kind in "USO" or ref.size == 0:  # strings: equal or not; nothing to compare
        return compare_arrays(ref, cand, *tolerances.for_output(name, dtype))
    explicit = tolerances.explicit_for(name) or strict
    rtol, atol = tolerances.for_output(name, dtype) if explicit else (None, None)
    error = compare_arrays(ref, cand, rtol or 0.0, atol or 0.0)
    verdict = judge(ref, cand, exact, cand64, dtype, rounded)
    error.rtol, error.atol = rtol, atol
    error.exact_error_rounded = verdict.error_rounded
    error.mismatches = verdict.beyond + (error.mismatches if explicit else 0)
    error.exact_error_original, error.exact_error = verdict.error_original, verdict.error
    error.exact_error_float64, error.exact_bound = verdict.error_float64, verdict.bound
    return error


@dataclass
class _NoiseFloor:
    """The reference's own float32 error on an input set without a float64 result, the sets
    after those its float64 reference fitted the time budget on. A model that amplifies
    rounding has its own error vary tenfold from one input set to the next (LeViT-128S with
    random weights: 2e-6, 8e-6, 6e-5 on three sets), and the error measured on the float64 sets
    alone refused a correct rewrite where the reference fitted on fewer sets
    (bench/RESULTS.md). On such a set it is the largest of: the measured error, grown as this
    set's output is larger than the measured sets'; the reference's distance from its own run
    summed in another order (`reordered`); and, for a half-precision candidate, the distance of
    the reference rounded to half from it."""

    scales: dict[str, float]  # each float output's largest rms over the sets with a float64 result
    reordered: dict[int, list[np.ndarray]]  # by set: the reference's outputs in another summation order

    @classmethod
    def measured(cls, reference, names, feeds, expected_runs, exact, device) -> _NoiseFloor | None:
        """None where every set has a float64 result, or none has (nothing measured to go by)."""
        sets = [i for i in range(len(feeds)) if exact and exact.available(0) and not exact.available(i)]
        if not sets:
            return None
        scales: dict[str, float] = {}
        for index, outputs in enumerate(expected_runs):
            if exact.available(index):
                for name, values in zip(names, outputs):
                    if values.dtype.kind == "f" and values.size:
                        scales[name] = max(scales.get(name, 0.0), _rms(values))
        return cls(scales, _reordered_reference(reference, names, feeds, sets, device))

    def on_set(self, index: int, position: int, name: str, ref: np.ndarray, measured: OutputError, rounded) -> float:
        """The reference's own error on set `index` for output `name` (at `position`; its run
        there `ref`; `measured`, its judgement on the float64 sets; `rounded`, the reference's
        run rounded to half on this set, or None)."""

        own = measured.exact_error_original or 0.0
        if self.scales.get(name):
            own *= max(1.0, _rms(ref) / self.scales[name])
        if index in self.reordered:
            own = max(own, largest_apart(self.reordered[index][position], ref))
        if rounded is not None:
            own = max(own, largest_apart(rounded, ref), measured.exact_error_rounded or 0.0)
        return own


def _rms(values: np.ndarray) -> float:
    values = values.astype(np.float64)
    return rms(values[np.isfinite(values)])


def _reordered_reference(reference, names, feeds, sets: list[int], device) -> dict[int, list]:
    """The reference's outputs on the input sets `sets` from a session that sums in another
    order (ONNX Runtime's graph optimisations and packed weights on, as a deployment runs it),
    by set: its distance from the checking session's run is the reference's float32 noise on
    that set (_NoiseFloor)."""
    try:
        session = create_session(reference, device, what="the model as given", tf32=False, search=False)
        return {index: checked_run(lambda i=index: session.run(names, feeds[i]), feeds[index], "the model as given")
                for index in sets}  # fmt: skip
    except ConvexportError:  # a kernel its optimisations need and lack: the noise floor as measured
        return {}


def _rounded_reference(reference, names, feeds, expected, exact, precision) -> list[dict[str, np.ndarray]]:
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


def compare_by_noise_floor(
    ref: np.ndarray, cand: np.ndarray, own: float | None, tolerances: Tolerances, name: str, precision=None
) -> OutputError:
    """One output on an input set without a float64 reference, judged by the noise floor
    measured on the sets with one (exact_check.noise_floor_bound; `own`, the original's largest
    own error there) at the roundoff of `precision` (default: the output's type); explicit
    tolerances, where given, as a bound besides."""
    dtype = precision or dtype_name(ref)
    if own is None or ref.dtype.kind in "USO" or ref.size == 0:
        return compare_arrays(ref, cand, *tolerances.for_output(name, dtype))
    bound = noise_floor_bound(ref, own, dtype)
    error = compare_arrays(ref, cand, 0.0, bound)  # |cand - orig| <= bound, element by element
    error.rtol = error.atol = None
    if tolerances.explicit_for(name):
        error.rtol, error.atol = tolerances.for_output(name, dtype)
        error.mismatches += compare_arrays(ref, cand, error.rtol, error.atol).mismatches
    return error


def _reference_note(exact: ExactReference) -> str | None:
    """What the report says of the float64 reference: on which input sets it was computed, and
    whether it is suspect (the node that disagreed with ONNX Runtime)."""
    suspect = exact.suspect
    if suspect is None:
        return exact.note
    doubt = (
        f"the float64 reference is suspect: {suspect.describe()}; judged by the float32 tolerance against the "
        "original as well"
    )
    return doubt if exact.note is None else f"{exact.note}; {doubt}"


def _float64_or_none(model: onnx.ModelProto) -> Float64Evaluator | None:
    try:
        return Float64Evaluator(model)
    except Float64Unavailable:
        return None


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    if norms == 0.0:
        return 1.0 if not a.any() and not b.any() else 0.0
    return float(np.dot(a.reshape(-1), b.reshape(-1)) / norms)


def validate_files(
    reference: Path,
    candidate: Path,
    inputs_npz: Path | None,
    runs: int,
    tolerances: Tolerances,
    input_specs: Sequence[InputSpec] = (),
) -> ValidationResult:
    """`convexport validate`: seeded random inputs (dims from the model, or --input), plus the
    arrays of DATA.npz if given."""
    from ..load.onnx_route import graph_input_specs
    from ..load.routes import load_model

    if runs < 0:
        raise ConvexportError("--runs must be >= 0")
    for path in (reference, candidate):
        if path.suffix.lower() != ".onnx":
            raise ConvexportError(f"{path}: validate compares ONNX models")
    models = [load_model(str(path)).onnx_model for path in (reference, candidate)]
    specs = with_overrides(graph_input_specs(models[0]), list(input_specs), reference)
    feeds = [] if inputs_npz is None else [load_npz(inputs_npz, specs)]
    if runs == 0 and not feeds:
        raise ConvexportError("--runs 0 without --inputs compares nothing")
    if runs:  # made-up data: an image's dynamic dims, as the model takes them
        specs = sized_by_running(models[0], specs)
    candidate_half, reference_half = half_type(models[1]), half_type(models[0])
    # a reference of float16 weights computes in float16 itself: a folded candidate of it too
    precision = (
        candidate_half
        if candidate_half is not None and candidate_half != reference_half
        else weights_half_type(models[0])
    )
    result = compare_models(models[0], models[1], specs, runs, tolerances, extra_feeds=feeds, precision=precision)
    result.precision = precision
    return result


def half_type(model: onnx.ModelProto) -> str | None:
    """The half type the model computes in where it holds weights of it or casts to it
    (convexport's --dtype fp16 and bf16 write both), whatever its interface's type: bfloat16
    where it has both (the coarser roundoff), None where neither."""
    graph = model.graph
    found = {tensor.data_type for tensor in graph.initializer}
    found |= {
        attribute.i
        for node in graph.node
        if node.op_type == "Cast"
        for attribute in node.attribute
        if attribute.name == "to"
    }
    for elem_type, name in ((onnx.TensorProto.BFLOAT16, "bfloat16"), (onnx.TensorProto.FLOAT16, "float16")):
        if elem_type in found:
            return name
    return None
