"""Arrays the user gives for the model's inputs (`optimize --input-data`, `validate --inputs`):
an .npz with one array per input name, read without trusting the file.

The archive is opened as the zip it is and only the members the inputs name are read (an unused
member is never touched, whatever it holds). Before a member's data is read its size is bounded
twice: its uncompressed size (the zip's own record) by MAX_INPUT_BYTES, as for the data --input
makes, and the size its .npy header declares by the member's actual size, so that a header that
claims 7 TiB in a small file is refused rather than allocated. Object arrays (pickles) are
refused. Every failure (a .npy where an .npz belongs, a truncated or corrupt archive, a member
of the wrong type) is one ConvexportError naming the file.
"""

from __future__ import annotations

import math
import os
import stat
import zipfile
from pathlib import Path

import numpy as np

from ..errors import ConvexportError
from .inputs import MAX_INPUT_BYTES, InputSpec

NPY_MAGIC = b"\x93NUMPY"


def check_data_file(path: Path) -> None:
    """Refuse, before any work, a data file that is not there or not a regular file: a zip is
    read by seeking, which a FIFO or a device cannot do, and opening a FIFO waits for a writer."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ConvexportError(
            f"{path}: {exc.strerror or exc}; give an .npz file (numpy.savez(PATH, x=array))"
        ) from None
    if not stat.S_ISREG(mode):
        raise ConvexportError(f"{path}: not a regular file (a folder, FIFO, socket or device); give an .npz file")


def load_npz(path: Path, inputs: list[InputSpec]) -> dict[str, np.ndarray]:
    """{input name: array} for `inputs`, from the .npz at `path` (module doc)."""
    check_data_file(path)
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        raise ConvexportError(f"{path}: {_why_not_an_archive(path, exc)}") from None
    with archive:
        members = {info.filename.removesuffix(".npy"): info for info in archive.infolist()}
        missing = [spec.name for spec in inputs if spec.name not in members]
        if missing:
            raise ConvexportError(
                f"{path}: lacks arrays for input(s) {', '.join(missing)} (has {', '.join(members) or 'none'})"
            )
        return {spec.name: _as_input(path, _read_member(path, archive, members[spec.name]), spec) for spec in inputs}


def _why_not_an_archive(path: Path, exc: BaseException) -> str:
    try:
        with open(path, "rb") as stream:
            start = stream.read(len(NPY_MAGIC))
    except OSError:
        start = b""
    if start == NPY_MAGIC:
        return "a .npy file holds one array; give an .npz with one array per input name (numpy.savez(PATH, x=array))"
    reason = getattr(exc, "strerror", None) or str(exc)
    return f"not a readable .npz file ({reason})"


def _read_member(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    name = info.filename.removesuffix(".npy")
    if info.file_size > MAX_INPUT_BYTES + (1 << 20):
        raise ConvexportError(
            f"{path}: array {name!r} is {info.file_size / 2**30:.1f} GiB uncompressed; convexport reads at most "
            f"{MAX_INPUT_BYTES / 2**30:.0f} GiB per input"
        )
    try:
        with archive.open(info) as stream:
            version = np.lib.format.read_magic(stream)
            shape, _, dtype = _read_header(stream, version)
            if dtype.hasobject:
                raise ConvexportError(f"{path}: array {name!r} holds Python objects (a pickle); give numbers")
            declared = math.prod(shape) * dtype.itemsize
            if declared > info.file_size:
                raise ConvexportError(
                    f"{path}: array {name!r} declares {declared:,} bytes of data but its member holds "
                    f"{info.file_size:,}: the file is damaged"
                )
        with archive.open(info) as stream:
            return np.lib.format.read_array(stream, allow_pickle=False)
    except ConvexportError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile) as exc:
        raise ConvexportError(f"{path}: array {name!r} cannot be read ({exc})") from None


def _read_header(stream, version):
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(stream)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(stream)
    raise ValueError(f"unknown .npy version {version}")


def _as_input(path: Path, array: np.ndarray, spec: InputSpec) -> np.ndarray:
    """A given array as the input's type: strings for a string input (ONNX Runtime takes
    numpy's), else numbers of the same kind that the type holds; of the input's rank and fixed
    dims (a dynamic dim, named, takes any size)."""
    fixed = [dim if isinstance(dim, int) else None for dim in spec.dims]
    if spec.dims and (
        array.ndim != len(fixed) or any(want is not None and want != got for want, got in zip(fixed, array.shape))
    ):
        shape = "x".join(map(str, array.shape)) or "a scalar"
        declared = "x".join(map(str, spec.dims))
        raise ConvexportError(f"{path}: array {spec.name!r} is {shape}; the model's input {spec.name} is {declared}")
    if spec.dtype == "string":
        if array.dtype.kind not in "US":
            raise ConvexportError(f"{path}: array {spec.name!r} is {array.dtype}, but the input is string")
        return array.astype(str)
    wanted = spec.numpy_dtype
    if not np.can_cast(array.dtype, wanted, casting="same_kind") or array.dtype.kind != wanted.kind:
        raise ConvexportError(
            f"{path}: array {spec.name!r} is {array.dtype}, but the model's input {spec.name!r} is {wanted}; "
            "save it as that type"
        )
    return array.astype(wanted)
