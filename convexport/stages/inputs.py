"""The inputs validation, half precision and the profile run the models on: the graph's inputs
with the dims --input gives, made-up input sets sized by running the model, and the caller's
arrays (--input-data)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConvexportError
from ..load import input_domains
from ..load.export import ExportResult
from ..load.input_data import load_npz
from ..load.inputs import DEFAULT_RUNS, InputSets, InputSpec, in_units
from ..profile.environment import available_memory_bytes
from ..profile.timed_sizes import timed_sizes
from .request import Request


@dataclass
class RunInputs:
    # the sets: a spec per graph input (dims concrete where --input made them so), the number of
    # seeded random sets (0: the caller's only), the caller's (--input-data) as arrays by name
    sets: InputSets
    note: str | None = None  # the report's made_up_inputs where --input-data replaces them
    timed: list[InputSpec] | None = None  # the sizes the profile times made-up inputs at (profile/timed_sizes.py)


# Validation holds every input set, and beside the one it judges that set's float64 copy (twice
# its float32 bytes) and ONNX Runtime's copy: the input sets need this many times one set's bytes
# besides their own (the outputs and the model's weights come on top).
HELD_BESIDE_THE_SETS = 3


def run_inputs(exported: ExportResult, request: Request) -> RunInputs:
    options = request.options
    specs = _validation_inputs(exported, request.specs)
    made_up_runs = DEFAULT_RUNS if options.made_up_inputs else 0
    if options.validate or options.profile:
        _check_memory(specs, made_up_runs + (options.input_data is not None))
    real_data = [load_npz(Path(options.input_data), specs)] if options.input_data is not None else []
    if made_up_runs and (options.validate or options.profile):
        specs = input_domains.sized_by_running(exported.reference, specs)
    note = None if options.made_up_inputs else "not used: --input-data replaces them"
    timed = _timed_sizes(exported, specs, request) if made_up_runs and options.profile else None
    return RunInputs(InputSets(specs, made_up_runs, real_data), note, timed)


def _timed_sizes(exported: ExportResult, specs: list[InputSpec], request: Request) -> list[InputSpec]:
    """profile/timed_sizes.py's sizes, the model as given run on the device it is profiled on (a session
    made only where a size is to be tried)."""
    from ..runtime import create_session

    opened: list = []  # the session, once one is needed

    def run(feeds: dict) -> None:
        if not opened:
            opened.append(create_session(exported.as_given(), request.device, threads=request.options.threads))
        opened[0].run(None, feeds)

    return timed_sizes(exported.inputs, specs, run)


def _check_memory(specs: list[InputSpec], sets: int) -> None:
    """Refuse, before any is drawn or read, input sets that validation and the profile would
    hold beyond the memory this machine has free (an 8 GiB input on a 24 GB machine was drawn,
    widened and run until the kernel killed the process, taking other work with it)."""
    available = available_memory_bytes()
    one_set = sum(spec.data_bytes() for spec in specs)
    needed = one_set * (sets + HELD_BESIDE_THE_SETS)
    if available is None or needed <= available:
        return
    largest = max(specs, key=lambda spec: spec.data_bytes())
    raise ConvexportError(
        f"the inputs take {in_units(one_set)} a set ({largest.name} {'x'.join(map(str, largest.concrete_shape()))} "
        f"{largest.dtype} the most); validating and profiling hold about {in_units(needed)} of them, more than the "
        f"{in_units(available)} this machine has free: give smaller dims with --input, or --no-validate --no-profile"
    )


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
            shape = dims if same_rank else spec.dims
            spec = InputSpec(spec.name, shape, spec.dtype, value_range=value_range, mask=spec.mask)
        resolved.append(spec)
    return resolved
