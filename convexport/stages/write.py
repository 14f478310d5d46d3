"""Stage 7: the optimized model written atomically to its destination; a large model's weights
go beside it before validation (read back by ONNX Runtime's sessions rather than held), renamed
into place once it is validated."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import onnx

from .. import heap, ir
from ..errors import ConvexportError
from ..files import is_stream, temporary_folder_beside
from ..progress import BytesShown
from ..saving import save_atomically


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
