"""Does the candidate graph compute what the reference computes? ONNX Runtime decides.

Both models run on the CPU provider with graph optimisations off (so ORT's own fusions cannot
hide or cause a difference) on seeded random inputs (dynamic dims take the sizes 1, 2, 3, ...
in successive runs) and on any input sets given. compare_models runs them (runs.py), picks
one criterion for each input set (judges.judge_of_set: the float64 result where the set has
one, else the noise floor measured on the sets that had one, else the tolerances), judges
every output of the set by it and gathers what was found (results.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from ..errors import ConvexportError
from ..ir import heap
from ..ir.same import same_computation
from ..ir.stats import graph_stats
from ..load.float32_twin import weights_half_type
from ..load.input_data import load_npz
from ..load.input_domains import sized_by_running
from ..load.inputs import InputSets, InputSpec, with_overrides
from ..runtime import MissingKernel, checked_run, create_session
from .exact_check import ExactReference, ExactRequest, exact_reference
from .judges import NoiseFloor, compare_arrays, judge_of_set, reference_note
from .results import NonfiniteOn, OutputError, ReferenceRuns, Tolerances, ValidationResult
from .runs import candidate_runs, float64_or_none, reference_runs, rounded_reference


def compare_models(
    reference: onnx.ModelProto,
    candidate: onnx.ModelProto,
    inputs: InputSets,
    tolerances: Tolerances = Tolerances(),
    *,
    labels: tuple[str, str] = ("the reference model", "the candidate"),
    device: str = "cpu",
    exact: ExactReference | ExactRequest | None = ExactRequest(),
    precision: str | None = None,
) -> ValidationResult:
    """Run both models on the input sets, compare every output: against the reference's float64
    result where it has one (validate/exact_check.py; `exact`: an ExactRequest to compute it
    here, an ExactReference computed before on the same input sets, None for none), else with
    the tolerances; explicit tolerances (--rtol/--atol) bound the candidate against the
    reference's own run besides. The reference failing to run is a RunFailure (the inputs do
    not suit the model); the candidate failing where the reference runs fails the
    validation. `labels` name the two models in those messages. On CUDA both run with TF32 off
    (tf32_effect reads TF32's own effect). `precision` names the type the candidate computes in
    where it is coarser than its outputs' (float16 inside a float32 interface): its roundoff
    sets the bound (a float16 interface is fed its inputs in float16), and the reference run
    with every value rounded to it (validate/rounded_run.py) counts as its own error as well, for
    each output that run keeps."""
    tolerances.check_outputs([out.name for out in reference.graph.output], labels[0])
    result = ValidationResult(True, len(inputs), tolerances, inputs=[str(spec) for spec in inputs.specs])
    # One session at a time: the reference's outputs on every input set are computed and its
    # session released before the candidate's opens (a session holds the model's weights: two
    # at once doubled validation's peak memory on large models).
    names, all_feeds, expected_runs = reference_runs(reference, inputs, labels[0], device)
    result.reference_runs = ReferenceRuns(names, all_feeds, expected_runs, device)
    result.nonfinite_on = nonfinite_on_sets(expected_runs, inputs.made_up)
    heap.release_after(reference)  # its session, before the float64 evaluator's or the candidate's
    if isinstance(exact, ExactRequest):
        exact = exact_reference(
            reference, all_feeds, graph_stats(candidate)["flops"], exact.budget_s, exact.torch_source, expected_runs
        )
    if exact is not None:
        result.reference = "float64" if exact.available(0) else "float32"
        result.reference_note, result.exact = reference_note(exact), exact
    # a reference that disagrees with ONNX Runtime node by node is suspect: the float32 check too
    strict = exact is not None and exact.suspect is not None
    unchanged = same_computation(reference, candidate)
    if unchanged:  # the reference's graph node for node: ONNX Runtime computes it alike
        actual_runs, problem = expected_runs, None
    else:
        actual_runs, problem = candidate_runs(candidate, names, all_feeds, labels[1], device)
    if problem is not None:
        result.passed, result.problem = False, problem
        return result
    result.sample = (all_feeds[0], actual_runs[0]) if all_feeds else None
    rounded = rounded_reference(reference, names, all_feeds, expected_runs, exact, precision)
    floor = NoiseFloor.measured(reference, names, all_feeds, expected_runs, exact, device) if not strict else None
    candidate64 = float64_or_none(candidate) if exact is not None and exact.candidate_too and not unchanged else None
    for index, (feeds, expected, actual) in enumerate(zip(all_feeds, expected_runs, actual_runs)):
        float64_run = candidate64.run(feeds) if candidate64 is not None and exact and exact.available(index) else None
        if unchanged and exact is not None and exact.available(index) and exact.source == "onnx":
            float64_run = exact.outputs[index]  # the reference's own float64 run
        judge = judge_of_set(index, names, exact, floor, result.outputs, float64_run, tolerances, precision)
        for position, (name, ref, cand) in enumerate(zip(names, expected, actual)):
            if ref.shape != cand.shape:
                result.passed = False
                result.problem = f"output {name!r}: shape {cand.shape} instead of {ref.shape}"
                return result
            error = judge(position, name, ref, cand, rounded[index].get(name))
            result.outputs[name] = result.outputs[name].merge(error) if name in result.outputs else error
    if candidate64 is not None:
        del candidate64
        heap.release_after(candidate)
    result.passed = all(error.mismatches == 0 for error in result.outputs.values())
    return result


def nonfinite_on_sets(expected_runs: list[list[np.ndarray]], made_up: int) -> NonfiniteOn | None:
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
    result = compare_models(models[0], models[1], InputSets(specs, runs, feeds), tolerances, precision=precision)
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
