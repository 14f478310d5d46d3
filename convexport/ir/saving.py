"""The optimized model written to OUT, with its weights file when it has one, so that a reader
sees the old pair or the new pair and never one file of each.

A model of 1 GiB of weights or more (or one whose weights were in files already) keeps them in
a file of its own beside OUT, which the model names relative to its folder:
`<OUT>.<8 hex digits>.data`, a name new to each run. That file is renamed into place first,
under its new name (nothing is replaced), then the model that points at it; only then is the
weights file of the model it replaced removed. A crash between the two renames leaves the old
pair whole and an orphan weights file, which the next run writing OUT removes. The renames and
the removals run under an exclusive lock on the output's folder (flock), so that two runs
writing the same OUT at once each put a whole pair in place, the last one's remaining, and
neither removes the other's weights while they are going into place. A fixed name such as
`<OUT>.data` cannot give this: replacing it breaks the old model before the new one is there.

Nothing is written through a link the program did not make: the weights' name is new, and an
old weights file that is a link is removed as a link.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path

import onnx

from .. import ir
from ..errors import ConvexportError
from ..util.files import (
    file_identity,
    give_permissions_of,
    identities_of,
    is_stream,
    rename_all,
    temporary_beside,
    write_atomically,
)

try:
    import fcntl
except ImportError:  # Windows: the pair is still written in order, without the lock
    fcntl = None  # type: ignore[assignment]  # the module, or None where the system has none


def save_atomically(model: onnx.ModelProto, destination: Path, inputs: Sequence[str | Path] = ()) -> Path | None:
    """Write `model` to `destination` (a stream, or a file replaced as the module doc says); the
    path of its weights file, or None when the model holds its weights. Files among `inputs`
    are never removed. A model whose weights were spilled beside OUT before validation
    (ir.spill) has its weights file renamed into place, not copied."""
    if is_stream(destination):
        if ir.needs_external_data(model):
            raise ConvexportError(f"{destination}: a model with external weights cannot be written to a stream")
        write_atomically(destination, lambda path: onnx.save(model, path))
        return None
    if not ir.needs_external_data(model):
        with temporary_beside(destination) as (model_temporary, model_final):
            assert model_temporary is not None  # a file: a stream was written above
            onnx.save(model, model_temporary)
            give_permissions_of(model_final, model_temporary)
            _commit(model_final, [(model_temporary, model_final)], inputs)
        return None
    real = Path(os.path.realpath(destination))
    if real.parent != Path(os.path.realpath(Path(destination).parent)):
        # the model names its data file relative to its folder, and a reader takes the folder
        # from the path it is given: through this link, another folder than the model's
        raise ConvexportError(
            f"{destination}: a link to a file in another folder ({real}); a model with external weights finds "
            "them beside the path it is read by, so give the file's own path; nothing was written"
        )
    data = _new_weights_path(real)
    spilled = ir.spilled_weights(model)
    with contextlib.ExitStack() as stack:
        model_temporary, model_final = stack.enter_context(temporary_beside(destination))
        assert model_temporary is not None  # a file: a stream was written above
        if spilled is not None and spilled.parent.parent == data.parent:
            ir.moved_weights(model, spilled, data.name)
            onnx.save(model, model_temporary)
            data_temporary = str(spilled)
        else:
            made, _ = stack.enter_context(temporary_beside(data))
            assert made is not None  # beside a file
            data_temporary = made
            ir.save_with_external_data(model, model_temporary, data.name, Path(data_temporary))
        give_permissions_of(model_final, model_temporary)
        give_permissions_of(model_final, data_temporary)
        _commit(model_final, [(data_temporary, data), (model_temporary, model_final)], inputs)
    return data


def is_weights_file_of(name: str, model_name: str) -> bool:
    """Whether a file name is one a model at `model_name` had its weights written to: the run's
    `<OUT>.<8 hex>.data`, or `<OUT>.data` (what earlier versions and most exporters name it)."""
    return re.fullmatch(re.escape(model_name) + r"(\.[0-9a-f]{8})?\.data", name) is not None


def _new_weights_path(final: Path) -> Path:
    while True:
        path = final.with_name(f"{final.name}.{secrets.token_hex(4)}.data")
        if not os.path.lexists(path):
            return path


def _commit(final: Path, renames: list[tuple[str, Path]], inputs: Sequence[str | Path]) -> None:
    """Rename each (temporary, final) pair in order, the model last, then remove the weights
    files of OUT's name that the new model does not name: the replaced model's and those of a
    run killed between its renames. All of it under the folder's lock."""
    new = {path.name for _, path in renames[:-1]}
    with _folder_locked(final.parent):
        for _, path in renames[:-1]:
            if os.path.lexists(path):  # a name new to this run, taken meanwhile: nothing replaced
                raise ConvexportError(f"{path}: appeared while {final.name} was being written; nothing was written")
        replaced = _weights_named_by(final)
        rename_all(renames)
        kept = identities_of(inputs)
        for entry in os.scandir(final.parent):
            if entry.name in new or not is_weights_file_of(entry.name, final.name):
                continue
            # <OUT>.data may be another tool's file that OUT never named: removed only as the replaced model's
            ours = entry.name != f"{final.name}.data" or entry.name in replaced
            if ours and file_identity(entry.path) not in kept:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def _weights_named_by(model_path: Path) -> set[str]:
    """The external data files the model at `model_path` names (none when there is no such file,
    or it is not a model), read only where files that could be its weights lie beside it."""
    try:
        beside = [entry.name for entry in os.scandir(model_path.parent)]
    except OSError:
        return set()
    if not any(is_weights_file_of(name, model_path.name) for name in beside) or not model_path.is_file():
        return set()
    try:
        return set(ir.external_data_files(onnx.load(str(model_path), load_external_data=False)))
    except Exception:  # not a model (any file may have been at OUT): it names nothing
        return set()


@contextlib.contextmanager
def _folder_locked(folder: Path) -> Iterator[None]:
    """An exclusive flock on `folder` while the block runs, where the system has one."""
    if fcntl is None:
        yield
        return
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):  # a file system without locks: renamed in order all the same
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)
