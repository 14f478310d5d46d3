"""The sizes the profile times a model at, where the model leaves dims dynamic.

Validation runs made-up inputs at the smallest sizes the model runs on (every dynamic dim 1,
an image or a waveform a Conv reads as small as it runs: input_domains.sized_for_data): the
values are what is checked there, and small runs are cheap. Timed at those sizes, a
transformer's sequence of one token measures ONNX Runtime's cost per node, not the model's
work, and where two graphs rank differently at the two extremes (a kernel ONNX Runtime fuses
that is slower on larger tensors) the verdict would hold only for a size no one runs.

So the dims the model leaves dynamic, but its batch, are grown together, each doubled from its
validation size, until a run of the original takes WORKING_RUN_S (a few thousand nodes' worth
of ONNX Runtime's per-node cost on a CPU: from there the model's own work is most of a run),
the model refuses a size (a position table of 512 rows refuses a sequence of 1024: the last
size it ran at is kept), the input set grows past MAX_INPUT_BYTES, or the dims are MAX_GROWTH
times what they were. The batch dim, named as a model names it, is a dim that is only ever an
input's first: it stays at 1, the latency of one request (--input-data times a batch).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

from ..load.inputs import InputSpec, random_inputs

WORKING_RUN_S = 0.002
MAX_GROWTH = 512
MAX_INPUT_BYTES = 64 << 20
RUNS_PER_SIZE = 3


def batch_dims(graph_specs: list[InputSpec]) -> set[str]:
    """The dynamic dims that are only ever an input's first."""
    first = {spec.dims[0] for spec in graph_specs if spec.dims and isinstance(spec.dims[0], str)}
    elsewhere = {dim for spec in graph_specs for dim in spec.dims[1:] if isinstance(dim, str)}
    return first - elsewhere


def grown(graph_specs: list[InputSpec], specs: list[InputSpec], factor: int) -> list[InputSpec]:
    """`specs` with every dim the graph leaves dynamic, but the batch, `factor` times its size
    there (an expression of dims, `past_sequence_length + sequence_length`, grows with them)."""
    batch = batch_dims(graph_specs)
    sized = []
    for graph, spec in zip(graph_specs, specs):
        dims = tuple(
            size * factor if isinstance(declared, str) and declared not in batch else size
            for declared, size in zip(graph.dims, spec.concrete_shape())
        )
        sized.append(dataclasses.replace(spec, dims=dims))
    return sized


def timed_sizes(graph_specs: list[InputSpec], specs: list[InputSpec], run: Callable[[dict], None]) -> list[InputSpec]:
    """The specs the profile times at (module doc): `specs` grown, each dim concrete. `run(feeds)`
    runs the original once (an exception where it cannot); `specs` as they are (each dim
    concrete) where the graph leaves no dim but its batch dynamic."""
    base = grown(graph_specs, specs, 1)
    if base == grown(graph_specs, specs, 2):
        return base
    kept, factor, seconds = base, 1, _run_seconds(run, base)
    while seconds is not None and seconds < WORKING_RUN_S and factor < MAX_GROWTH:
        factor *= 2
        larger = grown(graph_specs, specs, factor)
        if sum(spec.data_bytes() for spec in larger) > MAX_INPUT_BYTES:
            break
        seconds = _run_seconds(run, larger)
        if seconds is not None:
            kept = larger
    return kept


def _run_seconds(run: Callable[[dict], None], specs: list[InputSpec]) -> float | None:
    """The median of RUNS_PER_SIZE runs on made-up inputs of `specs` after one not counted, or
    None where the model does not run on them."""
    feeds = random_inputs(specs, seed=0)
    try:
        run(feeds)
        times = []
        for _ in range(RUNS_PER_SIZE):
            began = time.perf_counter()
            run(feeds)
            times.append(time.perf_counter() - began)
    except Exception:  # the model refuses these sizes (ONNX Runtime's errors have no common base)
        return None
    return statistics.median(times)
