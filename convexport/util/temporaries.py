"""Temporary files and folders that convexport makes beside its outputs, and the removal of
those that a killed run left there.

Each is named so that a later run knows it for one of its own (a file `.NAME.XXXX.convexport.tmp`,
a folder `.convexport-KIND-XXXX`) and is held while its run lives: an exclusive flock on a
descriptor the run keeps open, which the kernel lets go of when the process ends, however it
ends (SIGKILL included). A run that makes a temporary in a folder first removes those of its
kind there that nobody holds and that have not changed for STALE_AFTER_S (the moment between
making one and taking its lock). A pid in the name would not tell: in a container, or on a disk
two machines share, a live run's pid is a dead one to the other. Where there is no flock
(Windows) or the file system refuses it (some network mounts), nothing is removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]  # the module, or None where the system has none

FILE_SUFFIX = ".convexport.tmp"
FOLDER_PREFIX = ".convexport-"
STALE_AFTER_S = 10.0


@contextlib.contextmanager
def temporary_file(folder: str | Path, name_hint: str) -> Iterator[str]:
    """The path of a new empty file in `folder`, held (see the module doc) while the block runs
    and removed at its end unless the block renamed it; raises OSError where the folder takes
    no new file."""
    remove_stale(folder)
    handle, path = tempfile.mkstemp(prefix=f".{name_hint[:64]}.", suffix=FILE_SUFFIX, dir=folder)
    try:
        _hold(handle)
        yield path
    finally:
        Path(path).unlink(missing_ok=True)
        os.close(handle)


@contextlib.contextmanager
def temporary_folder(folder: str | Path, kind: str) -> Iterator[Path]:
    """A new folder in `folder`, held while the block runs and removed with what is in it at
    its end; raises OSError where the folder takes no new folder."""
    remove_stale(folder)
    path = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{kind}-", dir=folder))
    descriptor = os.open(path, os.O_RDONLY)
    try:
        _hold(descriptor)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(descriptor)


def probe(folder: str | Path) -> None:
    """Raise the OSError the system gives when `folder` takes no new file (read-only, not
    one's own), by making one and removing it."""
    handle, path = tempfile.mkstemp(prefix=f"{FOLDER_PREFIX}probe-", dir=folder)
    os.close(handle)
    os.unlink(path)


def remove_stale(folder: str | Path) -> list[str]:
    """Remove this program's temporaries in `folder` that no live run holds; the names removed.
    Anything that cannot be read, locked or removed is left as it is."""
    if fcntl is None:
        return []
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    now = time.time()
    for entry in entries:
        if not is_own_temporary(entry.name):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISLNK(info.st_mode) or now - info.st_mtime < STALE_AFTER_S:
            continue
        if _remove_if_unheld(entry.path, stat.S_ISDIR(info.st_mode)):
            removed.append(entry.name)
    return removed


def is_own_temporary(name: str) -> bool:
    """Whether a file name is one this module makes."""
    return name.startswith(FOLDER_PREFIX) or (name.startswith(".") and name.endswith(FILE_SUFFIX))


def _hold(descriptor: int) -> None:
    if fcntl is None:
        return
    with contextlib.suppress(OSError):  # a file system without locks: the file is then never judged stale
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _remove_if_unheld(path: str, is_folder: bool) -> bool:
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held by a live run (or locks refused: then nothing can be told)
        os.close(descriptor)
        return False
    try:
        if is_folder:
            shutil.rmtree(path)
        else:
            os.unlink(path)
        return True
    except OSError:
        return False
    finally:
        os.close(descriptor)
