"""A large model on disk: its weights written beside the output before validation, and the
model handed to ONNX Runtime as a file.

  spill              a model's large tensors (file-backed and held) written one after another
                     into the weights file of a folder of convexport's own, the model pointing
                     at it (the optimized model, once rewritten: nothing of it left in memory);
  files_for_runtime  the model as a file ONNX Runtime opens and memory-maps (a session made
                     from bytes copies every weight; from a file, it maps them).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx

from ..util import temporaries
from .large import skeleton
from .weight_files import file_range, is_file_backed, set_range, write_weights

WEIGHTS_NAME = "weights.data"  # in a folder spill made
SPILL_KIND = "weights"  # the spill's folder: temporaries.temporary_folder(..., SPILL_KIND)
SPILL_PREFIX = f"{temporaries.FOLDER_PREFIX}{SPILL_KIND}-"


def spill(model: onnx.ModelProto, folder: Path) -> onnx.ModelProto:
    """The model with all its large tensors in `folder`/WEIGHTS_NAME (written now, one tensor
    after another) and file-backed there: a new model; `model` is left as it is and may be
    dropped, its weights with it."""
    light, large = skeleton(model)
    data = Path(folder) / WEIGHTS_NAME
    with open(data, "wb") as out:
        write_weights(large, out, str(data.resolve()))
    return light


def spilled_weights(model: onnx.ModelProto) -> Path | None:
    """The weights file spill wrote when every large tensor of the model is in it, else None."""
    return _spilled_file(skeleton(model)[1])


def _spilled_file(large: list[tuple[onnx.TensorProto, onnx.TensorProto]]) -> Path | None:
    files = {file_range(original)[0] if is_file_backed(original) else None for original, _ in large}
    (only,) = files if len(files) == 1 else (None,)
    if only is None:
        return None
    path = Path(only)
    return path if path.parent.name.startswith(SPILL_PREFIX) and path.name == WEIGHTS_NAME else None


@contextlib.contextmanager
def files_for_runtime(model: onnx.ModelProto) -> Iterator[str]:
    """The path of a file holding `model` for ONNX Runtime to open, its large tensors beside it
    (ORT reads external data only from the model's own folder): in the folder spill made, when
    every large tensor is there; else in a temporary folder where each data file the model
    names is a hard link (a copy where the system refuses one) and held tensors are written."""
    light, large = skeleton(model)
    own = _spilled_file(large)
    if own is not None:
        for original, stripped in large:
            _, offset, length = file_range(original)
            set_range(stripped, own.name, offset, length)
        handle, path = tempfile.mkstemp(suffix=".onnx", dir=own.parent)
        os.close(handle)
        try:
            onnx.save(light, path)
            yield path
        finally:
            os.unlink(path)
        return
    files = {file_range(original)[0] for original, _ in large if is_file_backed(original)}
    with temporaries.temporary_folder(_place_for_links(files), "session") as folder:
        names = {path: _linked_or_copied(path, Path(folder), index) for index, path in enumerate(sorted(files))}
        held = [(original, stripped) for original, stripped in large if not is_file_backed(original)]
        with open(Path(folder) / WEIGHTS_NAME, "wb") as out:
            write_weights(held, out, WEIGHTS_NAME)
        for original, stripped in large:
            if is_file_backed(original):
                path, offset, length = file_range(original)
                set_range(stripped, names[path], offset, length)
        path = str(Path(folder) / "model.onnx")
        onnx.save(light, path)
        yield path


# folders files_for_runtime may make its folder in besides the system's temporary one (the
# output's, while optimize runs: scratch_beside)
_scratch: contextvars.ContextVar[tuple[Path, ...]] = contextvars.ContextVar("scratch", default=())


@contextlib.contextmanager
def scratch_beside(folder: Path) -> Iterator[None]:
    """files_for_runtime may make its temporary folders in `folder` meanwhile."""
    token = _scratch.set((Path(folder),))
    try:
        yield
    finally:
        _scratch.reset(token)


def scratch_folder() -> Path | None:
    """The folder scratch_beside named (the output's, while optimize writes one), else None."""
    places = _scratch.get()
    return places[0] if places else None


def _place_for_links(files: set[str]) -> Path:
    """Where the temporary folder goes: one on the file system of the data files, where a hard
    link to them can be made (the output's folder or the system's temporary one); else the
    output's folder, whose disk takes the copies (/tmp may be memory: tmpfs)."""
    places = [*_scratch.get(), Path(tempfile.gettempdir())]
    devices = {os.stat(path).st_dev for path in files}
    return next((place for place in places if {os.stat(place).st_dev} >= devices), places[0])


def _linked_or_copied(path: str, folder: Path, index: int) -> str:
    """A name in `folder` for the file at `path`: a hard link to it (no bytes copied), or a
    copy where the system refuses the link (another file system, a file not one's own)."""
    name = f"linked{index}.data"
    try:
        os.link(path, folder / name)
    except OSError:
        shutil.copyfile(path, folder / name)
    return name
