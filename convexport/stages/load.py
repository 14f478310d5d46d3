"""Stage 1: the MODEL argument (a path or MODEL string, an onnx.ModelProto, an nn.Module) as a
loaded model, by its route (convexport/routes/), and where its output goes, checked against
every file it was read from."""

from __future__ import annotations

import glob
import os
from pathlib import Path

from ..errors import ConvexportError
from ..files import check_paths
from ..loading import LoadedModel
from ..routes import load_model, model_suffixes
from ..saving import is_weights_file_of


def loaded_model(model, trust_pickle: bool, examples: tuple | None = None) -> LoadedModel:
    """MODEL loaded by its route (convexport/routes/); `examples`, example tensors given instead
    of --input, are what a torch model is exported on."""
    loaded = load_model(model, trust_pickle)
    if examples is not None:
        if not loaded.route.takes_examples:
            raise ConvexportError(
                f"{loaded.source}: example tensors are for a torch module; give a "
                f"{loaded.route.kind.replace('_', ' ')} input specs (NAME:DIMS) instead, and real data as "
                "input_data=DATA.npz"
            )
        loaded.example_inputs = examples
    return loaded


def destination(loaded: LoadedModel, output: str | Path | None, others=()) -> Path:
    """Where the model goes: checked, with its weights file and the `others` outputs, against
    every file the model was read from and against each other, before any work."""
    written = Path(output) if output is not None else loaded.default_output
    check_paths(loaded.files, [("-o", written), *others])
    if output is None:
        loaded.notes.extend(_shared_default_output(loaded, written))
    real = Path(os.path.realpath(written))
    for option, path in others:  # a report named as OUT's weights file would be taken for one and removed
        if path is None or str(path) == "-":
            continue
        other = Path(os.path.realpath(path))
        if other.parent == real.parent and is_weights_file_of(other.name, real.name):
            raise ConvexportError(
                f"{option} {path}: is where {written}'s weights go when they need a file of their own; "
                "give each output its own file"
            )
    return written


def _shared_default_output(loaded: LoadedModel, written: Path) -> list[str]:
    """A note where the default output, already there, is also another model's of this folder
    (net.pt and net.pt2 both write net.opt.onnx): the run replaces what that one wrote."""
    if not written.exists() or not loaded.files:
        return []
    given = loaded.files[0]
    stem = written.name.removesuffix(".opt.onnx")
    others = sorted(
        path.name
        for path in written.parent.glob(f"{glob.escape(stem)}.*")
        if path.stem == stem and path.suffix in model_suffixes() and path.resolve() != given.resolve()
    )
    if not others:
        return []
    return [f"{written} was replaced; {', '.join(others)} in the same folder writes it too (give -o to keep both)"]
