"""The inputs validation, half precision and the profile run the models on: the graph's inputs
with the dims --input gives, made-up input sets sized by running the model, and the caller's
arrays (--input-data)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from .. import input_domains
from ..export import ExportResult
from ..input_data import load_npz
from ..inputs import InputSpec
from ..validate import DEFAULT_RUNS
from .request import Request


@dataclass
class RunInputs:
    specs: list[InputSpec]  # one per graph input, dims concrete where --input made them so
    real_data: list[dict]  # the caller's input sets (--input-data), as arrays by name
    made_up_runs: int  # seeded random input sets (0: the caller's only)
    note: str | None = None  # the report's made_up_inputs where --input-data replaces them


def run_inputs(exported: ExportResult, request: Request) -> RunInputs:
    options = request.options
    specs = _validation_inputs(exported, request.specs)
    real_data = [load_npz(Path(options.input_data), specs)] if options.input_data is not None else []
    made_up_runs = DEFAULT_RUNS if options.made_up_inputs else 0
    if made_up_runs and (options.validate or options.profile):
        specs = input_domains.sized_by_running(exported.reference, specs)
    note = None if options.made_up_inputs else "not used: --input-data replaces them"
    return RunInputs(specs, real_data, made_up_runs, note)


def reported_inputs(exported: ExportResult, request: Request) -> list[str]:
    """The report's `inputs`: the graph's, each with the value range --input gave it."""
    ranges = {spec.name: spec.value_range for spec in request.specs if spec.value_range}
    return [str(dataclasses.replace(spec, value_range=ranges.get(spec.name))) for spec in exported.inputs]


def _validation_inputs(exported: ExportResult, specs: list[InputSpec]) -> list[InputSpec]:
    """The graph's inputs, with any dims --input names concretely and the range it gives."""
    given = {spec.name: spec for spec in specs}
    resolved = []
    for spec in exported.inputs:
        override = given.get(spec.name)
        if override is not None:
            same_rank = len(override.dims) == len(spec.dims)
            dims = tuple(o if isinstance(o, int) else s for o, s in zip(override.dims, spec.dims))
            value_range = override.value_range or spec.value_range  # --input's range, else the graph's
            spec = InputSpec(spec.name, dims if same_rank else spec.dims, spec.dtype, value_range=value_range)
        resolved.append(spec)
    return resolved
