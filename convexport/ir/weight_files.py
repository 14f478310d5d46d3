"""Weights that stay in their files: a large model's external data is read tensor by tensor,
when a rule needs one, and is otherwise only ever copied file to file.

A model of large.SERIALISED_MAX_BYTES of weights or more, read from a file, keeps its external
tensors where they are: `point_at_files` checks each one the way ONNX Runtime does (a relative
location inside the model's folder, no link leading out of it, the range within the file) and
makes its location the file's absolute path. No model on disk holds an absolute location (onnx
and ONNX Runtime refuse them), so such a tensor is "file-backed": its bytes are where
`file_range` says, wherever the model object goes, with no folder to carry beside it.

A file-backed tensor's values are read by `tensor_array` (that tensor's range only: a rule's
fold), and its bytes copied file to file by `write_weights` (a model saved); disk.py writes a
model's weights beside its output and hands ONNX Runtime files.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from .scopes import proto_scopes

COPY_CHUNK_BYTES = 64 << 20


def _nested_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """The tensors that are not the main graph's initializers: node attributes', subgraphs'."""
    for scope in proto_scopes(model.graph):
        if scope is not model.graph:
            yield from scope.initializer
        for node in scope.node:
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    yield attribute.t
                yield from attribute.tensors


def is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def is_file_backed(tensor: onnx.TensorProto) -> bool:
    """An external tensor whose location is an absolute path (point_at_files, spill made it)."""
    return is_external(tensor) and os.path.isabs(external_entries(tensor).get("location", ""))


def file_range(tensor: onnx.TensorProto) -> tuple[str, int, int]:
    """(path, offset, length) of a file-backed tensor's bytes."""
    entries = external_entries(tensor)
    return entries["location"], int(entries.get("offset", 0)), int(entries["length"])


def external_entries(tensor: onnx.TensorProto) -> dict[str, str]:
    """A tensor's external_data entries (location, offset, length, ...) as a dict."""
    return {entry.key: entry.value for entry in tensor.external_data}


def set_range(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        tensor.external_data.add(key=key, value=value)


def point_at_files(model: onnx.ModelProto, folder: Path) -> None:
    """Each of the main graph's external initializers file-backed, in place: its location made
    its file's absolute path, after the checks ONNX Runtime makes when it loads the model from
    `folder` (the location is relative and resolves, links followed, inside the folder to a
    regular file; the range lies within it). External tensors elsewhere (a subgraph's, a
    Constant node's: few and small) are read in. ValueError says which tensor fails."""
    from onnx.external_data_helper import load_external_data_for_tensor

    for tensor in _nested_tensors(model):
        if is_external(tensor):
            load_external_data_for_tensor(tensor, str(folder))
    root = os.path.realpath(folder)
    sizes: dict[str, int] = {}
    for tensor in model.graph.initializer:
        if not is_external(tensor):
            continue
        entries = external_entries(tensor)
        location = entries.get("location", "")
        real = os.path.realpath(os.path.join(root, location))
        if not location or os.path.isabs(location) or os.path.commonpath([root, real]) != root:
            raise ValueError(f"tensor {tensor.name!r}: external data location {location!r} is not inside {folder}")
        if real not in sizes:
            if not os.path.isfile(real):
                raise ValueError(f"tensor {tensor.name!r}: external data file {location!r} does not exist")
            sizes[real] = os.path.getsize(real)
        offset = int(entries.get("offset", 0))
        length = int(entries["length"]) if "length" in entries else sizes[real] - offset
        if offset < 0 or length < 0 or offset + length > sizes[real]:
            raise ValueError(f"tensor {tensor.name!r}: bytes {offset}..{offset + length} lie outside {location!r}")
        set_range(tensor, real, offset, length)


def relative_to(model: onnx.ModelProto, folder: Path) -> None:
    """The reverse of point_at_files, in place: file-backed tensors' locations relative to
    `folder` again, as a model read from there with onnx.load(load_external_data=False) has them."""
    for tensor in model.graph.initializer:
        if is_file_backed(tensor):
            path, offset, length = file_range(tensor)
            set_range(tensor, os.path.relpath(path, folder), offset, length)


# told the bytes of each file-backed tensor read, and of each tensor written to a data file:
# the pipeline's progress on a large model (counting_bytes)
_bytes_moved: contextvars.ContextVar[Callable[[int], None] | None] = contextvars.ContextVar("bytes", default=None)


@contextlib.contextmanager
def counting_bytes(told: Callable[[int], None]) -> Iterator[None]:
    """`told(n)` for each tensor of n bytes read from its file or written to one meanwhile."""
    token = _bytes_moved.set(told)
    try:
        yield
    finally:
        _bytes_moved.reset(token)


def _count(length: int) -> None:
    told = _bytes_moved.get()
    if told is not None:
        told(length)


def tensor_array(tensor: onnx.TensorProto) -> np.ndarray:
    """The tensor's values, read from its file when it is file-backed (that tensor's bytes
    only, into an array of their own: the proto is left as it is)."""
    if not is_file_backed(tensor):
        return numpy_helper.to_array(tensor)
    path, offset, length = file_range(tensor)
    _count(length)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    if dtype.itemsize * int(np.prod(tensor.dims)) == length and tensor.data_type != onnx.TensorProto.STRING:
        return np.fromfile(path, dtype=dtype, count=length // dtype.itemsize, offset=offset).reshape(tuple(tensor.dims))
    held = onnx.TensorProto()  # packed types (4-bit) and the like: onnx's own decoding
    held.CopyFrom(tensor)
    held.data_location = onnx.TensorProto.DEFAULT
    del held.external_data[:]
    with open(path, "rb") as data:
        data.seek(offset)
        held.raw_data = data.read(length)
    return numpy_helper.to_array(held)


def copy_range(path: str, offset: int, length: int, out) -> None:
    """`length` bytes of the file at `path` from `offset` appended to the open file `out`,
    kernel to kernel where the system can (os.copy_file_range), never all in memory at once."""
    out.flush()
    with open(path, "rb") as source:
        copied = 0
        if hasattr(os, "copy_file_range"):
            with contextlib.suppress(OSError):  # (across file systems on older kernels)
                while copied < length:
                    done = os.copy_file_range(source.fileno(), out.fileno(), length - copied, offset + copied)
                    if done == 0:
                        break
                    copied += done
            out.seek(0, os.SEEK_END)
        source.seek(offset + copied)
        while copied < length:
            chunk = source.read(min(COPY_CHUNK_BYTES, length - copied))
            if not chunk:
                raise OSError(f"{path}: ends before byte {offset + length}")
            out.write(chunk)
            copied += len(chunk)


def write_weights(large: list[tuple[onnx.TensorProto, onnx.TensorProto]], out, location: str) -> None:
    """Each (original, stripped) pair's bytes appended to the open file `out` (from its file
    for a file-backed original, its proto's for a held one), the stripped copy pointing at
    them under `location`."""
    for original, stripped in large:
        offset = out.tell()
        if is_file_backed(original):
            path, start, length = file_range(original)
            copy_range(path, start, length, out)
        else:
            payload = original.raw_data or numpy_helper.to_array(original).tobytes()
            out.write(payload)
            length = len(payload)
        set_range(stripped, location, offset, length)
        _count(length)


def moved_weights(model: onnx.ModelProto, spilled: Path, location: str) -> None:
    """The tensors in the file `spilled` pointing at `location` instead (a spilled model's
    weights renamed into place beside the model: named relative to its folder), in place."""
    for tensor in model.graph.initializer:
        if is_file_backed(tensor) and Path(file_range(tensor)[0]) == spilled:
            _, offset, length = file_range(tensor)
            set_range(tensor, location, offset, length)
