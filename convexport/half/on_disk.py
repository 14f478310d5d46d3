"""A large model's half-precision attempts written to the output's disk as they are made.

Each attempt (choose.py) is a whole model in half precision: half the weights' bytes. Held in
memory beside the session that judges it, it was too much: ONNX Runtime's CPU provider, which
has no float16 kernel for most ops, keeps a float32 copy of each weight it casts (the judging
session of a 1 GiB model took 1.06 GiB), and a 10 GiB model's run, its attempts held in
memory, was ended by the kernel at 24 GiB (bench/RESULTS.md). Written out (ir.spill, in a folder of
the output's disk that scratch_beside names) the attempt holds no weights, and ONNX Runtime
maps them from the file. An attempt's folder goes when the attempt is dropped; the chosen
one's is handed to the caller, to go once the model is written (its weights file is renamed
into place then).
"""

from __future__ import annotations

import contextlib
import weakref

from .. import ir
from ..errors import ConvexportError
from ..util import temporaries
from .convert import Converted


def on_disk(converted: Converted) -> Converted:
    """`converted` with its weights in a file of their own, where the model is large
    (ir.kept_from_serialisation) and optimize writes to a folder (ir.scratch_folder); else as
    it is."""
    place = ir.scratch_folder()
    if place is None or not ir.kept_from_serialisation(converted.model):
        return converted
    files = contextlib.ExitStack()
    try:
        folder = files.enter_context(temporaries.temporary_folder(place, ir.SPILL_KIND))
        model = ir.spill(converted.model, folder)
    except OSError as exc:  # a full disk
        files.close()
        raise ConvexportError(f"{place}: cannot write the half-precision weights ({exc.strerror or exc})") from exc
    spilled = Converted(model, converted.casts, converted.half_nodes, converted.weights_rounded, files)
    spilled.removal = weakref.finalize(spilled, files.close)
    return spilled


def handed_over(converted: Converted) -> contextlib.ExitStack | None:
    """The folder of the chosen attempt's weights, no longer removed with the attempt: the
    caller's to close once the model is written. None for a model that holds its weights."""
    if converted.removal is not None:
        converted.removal.detach()
    return converted.files
