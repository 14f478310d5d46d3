"""The report stage: the report's sections no single stage writes (what was run on what: model,
output, exporter, interface, environment; the graph before and after), and the optimized model
written atomically to its destination (a large model's weights go beside it before validation,
read back by ONNX Runtime's sessions rather than held, renamed into place once it is validated)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import onnx

from .. import __version__, ir
from ..errors import ConvexportError
from ..ir import heap
from ..ir.saving import save_atomically
from ..ir.stats import graph_stats
from ..load.export import ExportResult
from ..load.model import LoadedModel
from ..load.onnx_route import overridable_input_count
from ..profile.environment import measured_environment
from ..report.types import SCHEMA_VERSION, GraphStats, Growth, OptimizeReport
from ..util.files import is_stream, temporary_folder_beside
from ..util.progress import BytesShown
from .rewrite import Rewritten

# A file (or, in the profile, a peak memory) this much larger than the original's is flagged
# as a regression.
REGRESSION_RATIO = 1.05


def base_report(loaded: LoadedModel, exported: ExportResult, rewritten: Rewritten) -> OptimizeReport:
    """The report as the rewrite leaves it: validation and profile still to come (null)."""
    model = rewritten.outcome.model
    before = _stats(exported.reference, exported.declared)
    # FLOPs are counted from the shapes the value_info holds: a Reshape whose target a Shape
    # chain computes leaves what follows unshaped, and uncounted, until constant folding makes
    # the target a constant (in a merged decoder ONNX's inference cannot propagate it). The
    # folded model the rules ran on is the same computation: each count misses only what its
    # shapes do not give, so the larger.
    before["flops"] = max(before["flops"], graph_stats(rewritten.folded)["flops"])
    after = before if model is exported.reference else _stats(model, exported.declared)
    larger, growth = _against(before, after)
    return {
        "schema_version": SCHEMA_VERSION,
        "convexport_version": __version__,
        "model": loaded.source,
        "output": None,  # the written model's path, once the write stage has written it
        "exporter": exported.exporter,
        "export_warnings": exported.warnings,
        "opset": ir.onnx_opset(exported.model),
        "conversions": exported.conversions,
        "input_changes": exported.input_changes,
        "notes": loaded.notes,
        "overridable_inputs": overridable_input_count(exported.model),
        "inputs": [str(spec) for spec in exported.inputs],
        "before": before,
        "after": after,
        "size_regression": larger,
        "strategy": rewritten.strategy,
        "growth": growth,
        "outputs": [_output_spec(value) for value in exported.reference.graph.output],
        "environment": measured_environment(rewritten.device),
        "rewrites": rewritten.outcome.applied,
        "skipped": rewritten.outcome.skipped,
        "validation": None,
        "profile": None,
        **rewritten.sections,
    }


class Restated(NamedTuple):
    after: GraphStats
    size_regression: bool
    growth: Growth


def restated(before: GraphStats, after: onnx.ModelProto, declared: Sequence[onnx.ValueInfoProto]) -> Restated:
    """The report's `after` (and what it gives) for the model written, when it is not the one
    the rewrite gave."""
    stats = _stats(after, declared)
    return Restated(stats, *_against(before, stats))


def _stats(model: onnx.ModelProto, declared: Sequence[onnx.ValueInfoProto]) -> GraphStats:
    """graph_stats (its FLOPs from every shape inference gave) and the bytes of the model as
    written: annotated with what the model given declared (ir.as_declared)."""
    stats = graph_stats(model)
    return {
        "nodes": stats["nodes"],
        "ops": stats["ops"],
        "flops": stats["flops"],
        "params": stats["params"],
        "model_bytes": ir.serialized_bytes(model, ir.declared_entries(model, declared)),
    }


def _against(before: GraphStats, after: GraphStats) -> tuple[bool, Growth]:
    """Whether the file grew past REGRESSION_RATIO, and FLOPs and parameters after over before."""
    larger = after["model_bytes"] > REGRESSION_RATIO * before["model_bytes"]
    growth: Growth = {
        "flops": after["flops"] / before["flops"] if before["flops"] else None,
        "params": after["params"] / before["params"] if before["params"] else None,
    }
    return larger, growth


def _output_spec(value: onnx.ValueInfoProto) -> str:
    """An output as NAME:DIMS:DTYPE, as the report's inputs are written."""
    tensor_type = value.type.tensor_type
    dims = "x".join(
        str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor_type.shape.dim
    )
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).name if tensor_type.elem_type else "?"
    return f"{value.name}:{dims}:{dtype}"


def scratch_on_output_disk(destination: Path | None, cleanup: contextlib.ExitStack) -> None:
    """A large model's sessions make their folders on the output's disk."""
    if destination is not None and not is_stream(destination):
        cleanup.enter_context(ir.scratch_beside(Path(os.path.realpath(destination)).parent))


def spill_before_validation(
    outcome, reference: onnx.ModelProto, destination: Path | None, cleanup: contextlib.ExitStack, say
) -> None:
    """For a large model (ir.kept_from_serialisation) written to a file, not a stream: its
    weights written beside the output now, `outcome.model` then naming them (read back by ONNX
    Runtime's sessions, not held: the 1 GiB the rewrite made), renamed into place once it is
    validated. Any other model is left as it is."""
    model = outcome.model
    if destination is None or model is reference or not ir.kept_from_serialisation(model) or is_stream(destination):
        return
    say("writing weights")
    folder = cleanup.enter_context(temporary_folder_beside(destination, ir.SPILL_KIND))
    try:
        with ir.counting_bytes(BytesShown(say, "writing weights", "written", ir.weight_bytes(model))):
            outcome.model = ir.spill(model, folder)
    except OSError as exc:  # a full disk
        raise ConvexportError(f"{destination}: cannot write ({exc.strerror or exc})") from exc
    del model
    heap.release()


def written(model: onnx.ModelProto, destination: Path, read_from: list[Path], say) -> Path | None:
    """The model saved at `destination` (never over a file it was read from); its weights file
    beside it, or None where the model holds its weights."""
    say("writing")
    with ir.counting_bytes(BytesShown(say, "writing", "written", ir.weight_bytes(model))):
        return save_atomically(model, destination, read_from)
