"""Atomic output files: written beside the destination, then renamed into place."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from .errors import ConvexportError


def write_atomically(destination: str | Path, write: Callable[[str], None]) -> None:
    """Call write(temporary_path), then rename it to `destination` with the usual permissions
    (0666 less the umask); a reader never sees a half-written file, a failure leaves none."""
    destination = writable_place(destination)
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{destination.name}.", suffix=".tmp", dir=destination.parent)
    except OSError as exc:  # a folder one may not write in (read-only, /proc)
        raise ConvexportError(f"{destination}: cannot write ({exc.strerror or exc})") from exc
    os.close(handle)
    try:
        write(temporary)
        give_default_permissions(temporary)
        os.replace(temporary, destination)
    except OSError as exc:
        Path(temporary).unlink(missing_ok=True)
        raise ConvexportError(f"{destination}: cannot write ({exc.strerror or exc})") from exc
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def writable_place(destination: str | Path) -> Path:
    """`destination` as a Path, checked before any work is done for it: its folder exists and
    it is not itself a folder (whether the folder takes a new file shows only on writing)."""
    destination = Path(destination)
    if not destination.parent.is_dir():
        raise ConvexportError(f"{destination}: folder {destination.parent} does not exist")
    if destination.is_dir():
        raise ConvexportError(f"{destination}: is a folder; give a file name")
    return destination


def give_default_permissions(path: str | Path) -> None:
    """0666 less the umask, as a plain open() would have made it (mkstemp makes 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def write_text_atomically(text: str, destination: str | Path) -> None:
    def write(path: str) -> None:
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(text)

    write_atomically(destination, write)
