"""Output files: checked before any work, written so that no reader sees half of one and no
path the user gives is lost.

- A regular file (or a new one) is written beside itself and renamed into place: a failure or
  a signal leaves the previous file as it was and no temporary file behind.
- A symbolic link is written through: the file it points to is replaced that way, and the link
  stays a link.
- A character device, a FIFO, a socket or a /dev/std* or /proc/self/fd path is a stream: it is
  opened and written, never replaced (`--report /dev/stdout`, `-o /dev/null`, a named pipe).
- An output that is an input (the model, its weights file, a factory's .py, validate's models,
  an .npz of inputs), that another output of the same run names, or whose folder takes no new
  file, is refused before any work.

Temporary files are made by util/temporaries.py (held while their run lives, removed by a later run
when it was killed); a model and its weights file are replaced as a pair by ir/saving.py.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ..errors import ConvexportError
from . import temporaries

_STREAM_PREFIXES = ("/dev/std", "/dev/fd/", "/proc/self/fd/", "/proc/thread-self/fd/")
_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGINT") if hasattr(signal, name))


def check_paths(inputs: Sequence[str | Path], outputs: Sequence[tuple[str, str | Path | None]]) -> None:
    """Refuse, before any work: an output that is a folder, whose folder does not exist or takes
    no new file, whose name the system cannot take, that is one of `inputs`, or that another
    output names.
    `outputs` are (option, path) pairs; None (not asked for) and "-" (stdout) are passed over."""
    read = identities_of(inputs)
    seen: dict[tuple, str] = {}
    for option, path in outputs:
        if path is None or str(path) == "-":
            continue
        destination = writable_place(path)
        if is_stream(destination):
            continue
        key = file_identity(destination)
        _refuse_an_input(option, path, key, read)
        _check_folder_takes_files(option, path, destination)
        if key in seen:
            raise ConvexportError(f"{option} {path}: is also {seen[key]}; give each output its own file")
        seen[key] = f"{option} {path}"


def identities_of(inputs: Sequence[str | Path]) -> dict[tuple, str]:
    """The existing files among `inputs`, by file_identity (to what each path names)."""
    return {file_identity(path): str(path) for path in inputs if path is not None and _exists(path)}


def _check_folder_takes_files(option: str, path: str | Path, destination: Path) -> None:
    """Refuse an output whose folder takes no new file (read-only, not one's own) before any
    output is written: a run that would fail at its last output leaves all of them as they were."""
    folder = Path(os.path.realpath(destination)).parent
    try:
        temporaries.probe(folder)
    except OSError as exc:
        where = f"{option} {_shown(Path(path))}: cannot write in {_shown(folder)}"
        raise ConvexportError(f"{where} ({exc.strerror or exc}); nothing was written") from None


def _refuse_an_input(option: str, path, key: tuple, read: dict[tuple, str]) -> None:
    if key in read:
        raise ConvexportError(f"{option} {path}: is the input {read[key]}; the input is never modified")


def writable_place(destination: str | Path) -> Path:
    """`destination` as a Path, checked before any work is done for it: its folder exists, it
    is not itself a folder, and its name is one the system takes (whether the folder takes a
    new file shows only on writing)."""
    destination = Path(destination)
    try:
        if is_stream(destination):
            return destination
        if os.path.islink(destination):
            _check_link_resolves(destination)
        target = Path(os.path.realpath(destination))
        if not target.parent.is_dir():
            # the folder as the user wrote it, unless a link led elsewhere
            folder = destination.parent if target.parent == Path(os.path.abspath(destination.parent)) else target.parent
            if target.parent.exists():
                raise ConvexportError(f"{destination}: {folder} is a file, not a folder")
            raise ConvexportError(f"{destination}: folder {folder} does not exist")
        if target.is_dir():
            raise ConvexportError(f"{destination}: is a folder; give a file name")
        os.stat(target) if target.exists() else _check_name(target)
    except OSError as exc:
        raise ConvexportError(f"{_shown(destination)}: {exc.strerror or exc}") from None
    except UnicodeEncodeError:
        raise ConvexportError(f"{_shown(destination)}: the name cannot be encoded on this system") from None
    return destination


def _check_link_resolves(link: Path) -> None:
    """Raise the OSError of a symbolic link that leads nowhere: a loop (ELOOP), which
    os.path.realpath would silently give back as the link itself, to be replaced. A link to a
    file that does not exist yet is fine: it is written through, creating that file."""
    with contextlib.suppress(FileNotFoundError):
        os.stat(link)


def is_stream(path: str | Path) -> bool:
    """Whether writing to `path` must open it rather than replace it (see the module doc)."""
    text = str(path)
    if text.startswith(_STREAM_PREFIXES):
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def write_atomically(destination: str | Path, write: Callable[[str], None]) -> None:
    """Call write(path) so that `destination` ends up holding what it wrote: through a temporary
    file beside the (link-resolved) destination, renamed into place with the usual permissions
    (0666 less the umask), or, for a stream, straight to it. A failure or SIGTERM/SIGHUP/SIGINT
    leaves the destination as it was and no temporary file."""
    with temporary_beside(destination) as (temporary, final):
        if temporary is None:
            _stream(final, write)
            return
        write(temporary)
        give_permissions_of(final, temporary)
        rename_all([(temporary, final)])


@contextlib.contextmanager
def temporary_beside(destination: str | Path) -> Iterator[tuple[str | None, Path]]:
    """(a new temporary file's path beside the destination, the path to rename it to) while the
    block runs, the temporary file removed if it is still there at the end; (None, the path)
    for a stream. Signals that end the process are turned into exceptions meanwhile, so the
    clean-up runs."""
    destination = writable_place(destination)
    if is_stream(destination):
        yield None, destination
        return
    final = Path(os.path.realpath(destination))  # through a symlink: the link stays
    with contextlib.ExitStack() as stack:
        try:
            temporary = stack.enter_context(temporaries.temporary_file(final.parent, final.name))
        except OSError as exc:  # a folder one may not write in (read-only, /proc)
            raise ConvexportError(f"{destination}: cannot write ({exc.strerror or exc})") from exc
        try:
            with ending_signals_raise():
                yield temporary, final
        except OSError as exc:
            raise ConvexportError(f"{destination}: cannot write ({exc.strerror or exc})") from exc


@contextlib.contextmanager
def temporary_folder_beside(destination: str | Path, kind: str) -> Iterator[Path]:
    """A new folder beside the (regular file) destination while the block runs, removed with
    what is left in it at the end; signals that end the process raise meanwhile, as in
    temporary_beside. Files in it are renamed into place without a copy (the same file system)."""
    final = Path(os.path.realpath(destination))
    with contextlib.ExitStack() as stack:
        try:
            folder = stack.enter_context(temporaries.temporary_folder(final.parent, kind))
        except OSError as exc:
            raise ConvexportError(f"{destination}: cannot write ({exc.strerror or exc})") from exc
        with ending_signals_raise():
            yield folder


def rename_all(pairs: Sequence[tuple[str, Path]]) -> None:
    """os.replace each (temporary, final) in order with the signals that end the process held
    back until all are done (ir/saving.py orders a model after its weights file). Each
    file is on the disk before its rename, and the renames are after (fsync of the files, then
    of their folders): a crash leaves the old file or the whole new one, never an empty one."""
    for temporary, _ in pairs:
        _sync(temporary)
    masked = hasattr(signal, "pthread_sigmask")
    if masked:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        for temporary, final in pairs:
            os.replace(temporary, final)
    finally:
        if masked:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    for folder in dict.fromkeys(Path(final).parent for _, final in pairs):
        _sync(folder)


def _sync(path: str | Path) -> None:
    """fsync a file, or a folder where the system allows it (not on Windows)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def give_permissions_of(final: str | Path, temporary: str | Path) -> None:
    """The permissions of the file `final` (being replaced) for `temporary`, or, for a new
    file, 0666 less the umask, as a plain open() would have made it (mkstemp makes 0600)."""
    try:
        mode = stat.S_IMODE(os.stat(final).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    os.chmod(temporary, mode)


def write_text_atomically(text: str, destination: str | Path) -> None:
    """`text` to `destination` (write_atomically); "-" is standard output."""
    if str(destination) == "-":
        import sys

        sys.stdout.write(text)
        sys.stdout.flush()
        return

    def write(path: str) -> None:
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(text)

    write_atomically(destination, write)


class Terminated(BaseException):
    """A signal that ends the process arrived while an output was being written."""

    def __init__(self, number: int):
        super().__init__(f"signal {number}")
        self.number = number


@contextlib.contextmanager
def ending_signals_raise():
    """SIGTERM and SIGHUP raise Terminated (SIGINT already raises KeyboardInterrupt) while the
    block runs, so that `finally` clauses remove temporary files (an output's, a profile's
    model copy); the previous handlers after.
    Only the main thread can set handlers: elsewhere the block runs as it is."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(number, _frame):
        raise Terminated(number)

    names = [name for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]
    previous = {name: signal.signal(getattr(signal, name), terminate) for name in names}
    try:
        yield
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)


@contextlib.contextmanager
def interrupts_held():
    """Ctrl-C (SIGINT) held back while the block runs (it imports the libraries the command
    needs), then raised as KeyboardInterrupt: raised inside a C extension's module
    initialisation it aborts the process with a C++ traceback (onnx's, built with nanobind,
    calls back into Python: "terminate called ...") or makes the import fail (ONNX Runtime's:
    "initialization failed"), where once the import is done it ends the command as Ctrl-C does.
    Only the main thread can set handlers: elsewhere the block runs as it is."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pressed = []
    previous = signal.signal(signal.SIGINT, lambda number, frame: pressed.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed:
        raise KeyboardInterrupt


def _stream(destination: Path, write: Callable[[str], None]) -> None:
    try:
        write(str(destination))
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise ConvexportError(f"{destination}: cannot write ({exc.strerror or exc})") from exc


def _check_name(target: Path) -> None:
    """Raise the OSError the system gives for a name it cannot take (too long), as opening
    would, without creating anything."""
    limit = os.pathconf(target.parent, "PC_NAME_MAX") if hasattr(os, "pathconf") else 255
    if len(os.fsencode(target.name)) > limit:
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))
    if len(os.fsencode(str(target))) >= 4096:
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))


def _exists(path: str | Path) -> bool:
    try:
        return os.path.exists(path)
    except (OSError, ValueError):
        return False


def file_identity(path: str | Path) -> tuple:
    """What makes two paths the same file: device and inode where it exists (hard links and
    symlinks included), else the resolved path."""
    try:
        info = os.stat(path)
        return ("inode", info.st_dev, info.st_ino)
    except (OSError, ValueError):
        return ("path", os.path.realpath(path))


def _shown(path: Path) -> str:
    """A path for a one-line message: shortened when it is very long, undecodable bytes escaped."""
    text = os.fsencode(str(path)).decode("utf-8", "backslashreplace")
    return text if len(text) <= 200 else f"{text[:96]}...{text[-96:]}"


def check_readable_file(source: str, path: Path, what: str = "a model file") -> None:
    """A regular file, or a ConvexportError saying what the path is instead (nothing there, a
    folder, a FIFO or device, which opening would block on or misread, or an unusable name);
    `what` names the file wanted."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ConvexportError(f"{source}: no such file") from None
    except OSError as exc:
        raise ConvexportError(f"{source}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise ConvexportError(f"{source}: is a folder, not {what}")
    if not stat.S_ISREG(info.st_mode):
        raise ConvexportError(f"{source}: is not a regular file (a FIFO, socket or device); give {what}")
