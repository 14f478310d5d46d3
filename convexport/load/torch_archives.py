"""Models in torch's own files: TorchScript archives, `torch.save` files (a pickled module, or
a checkpoint dict holding one) and torch.export archives, read the way the user saved them,
and without running code from the file unless the user trusts it (load/untrusted.py).

Every failure is a ConvexportError that names the file and says what to do.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import pickletools
import re
import stat
import sys
import zipfile
from pathlib import Path

from ..errors import ConvexportError, first_line
from ..util.quiet import quiet_libraries
from .untrusted import ArchiveRunsCode, compiled_code_members, no_code_from_archive, unsafe_guard

TRUST_HINT = "pass --trust-pickle if you trust the file"
# torch.save's legacy (non-zip) format starts with this number, pickled
_LEGACY_MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
STATE_DICT_HINT = "give a file.py:factory that builds the module and loads the weights into it"


def read_exported_program(path: Path, trust_pickle: bool):
    """torch.export.load(path), refusing (unless trusted) an archive whose loading would run
    code from it."""
    import torch

    if not zipfile.is_zipfile(path):
        raise ConvexportError(f"{path}: not a torch.export archive (not a zip file); {_PT2_HINT}")
    compiled = compiled_code_members(path)
    if compiled and not trust_pickle:
        raise ConvexportError(
            f"{path}: holds compiled code ({compiled[0]}), which loading the archive would run; {TRUST_HINT}, "
            "or save the program without AOTInductor (torch.export.save)"
        )
    guard = contextlib.nullcontext() if trust_pickle else no_code_from_archive()
    try:
        with quiet_libraries(), guard:
            program = torch.export.load(str(path))
    except ArchiveRunsCode as refused:
        raise ConvexportError(f"{path}: holds {refused}; {TRUST_HINT}") from None
    except Exception as exc:  # torch raises many types for a bad archive
        raise ConvexportError(f"{path}: not a readable torch.export archive ({first_line(exc)}); {_PT2_HINT}") from exc
    # its guards become Python code that every call of program.module() runs (load/untrusted.py)
    unsafe = None if trust_pickle else unsafe_guard(list(getattr(program, "_guards_code", None) or []))
    if unsafe is not None:
        raise ConvexportError(
            f"{path}: holds a guard that is not a comparison of input sizes ({unsafe[:60]!r}), which exporting the "
            f"program would run; {TRUST_HINT}"
        )
    return program


_PT2_HINT = "save one with torch.export.save(torch.export.export(model, inputs), 'model.pt2')"


def is_torchscript_file(path: Path) -> bool:
    """Whether `path` is a regular file holding a TorchScript archive (never opening anything
    else: a FIFO or a device would block or be misread)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        return zipfile.is_zipfile(path) and _is_torchscript_archive(path)
    except (OSError, zipfile.BadZipFile):
        return False


def read_torchscript(path: Path, key: str | None = None):
    """The ScriptModule of a TorchScript archive."""
    if key is not None:
        raise ConvexportError(f"{path}:{key}: a TorchScript archive holds one model and no entries to name")
    return _read_torchscript(path)


def read_pickled_module(path: Path, trust_pickle: bool, key: str | None):
    """The nn.Module of a torch.save file (zip or legacy) of a module or of a checkpoint dict
    holding one (`key` names which entry, when given or when several hold modules)."""
    if not zipfile.is_zipfile(path) and not _is_legacy_torch_save(path):
        raise ConvexportError(
            f"{path}: neither a TorchScript archive nor a torch.save file; save the model with "
            "torch.jit.save(torch.jit.script(model) or torch.jit.trace(model, x), 'model.pt')"
        )
    return _module_in(path, _unpickled(path, trust_pickle), key)


def _read_torchscript(path: Path):
    import torch

    try:
        with quiet_libraries():
            return torch.jit.load(str(path), map_location="cpu").eval()
    except Exception as exc:
        custom = re.search(r"__torch__\.torch\.classes\.([\w.]+)", str(exc))
        if custom:
            raise ConvexportError(
                f"{path}: uses the TorchScript custom class {custom[1]}, whose C++ library is not loaded here; "
                "give a file.py:factory that loads it (torch.ops.load_library) and returns torch.jit.load(...)"
            ) from exc
        raise ConvexportError(f"{path}: unreadable TorchScript archive ({first_line(exc)})") from exc


def _is_torchscript_archive(path: Path) -> bool:
    with zipfile.ZipFile(path) as archive:
        return any(name.endswith("/constants.pkl") or "/code/" in name for name in archive.namelist())


def _is_legacy_torch_save(path: Path) -> bool:
    """Whether the file starts as torch.save's legacy format does (a pickled magic number)."""
    with open(path, "rb") as stream:
        head = stream.read(64)
    try:
        for op, argument, _ in pickletools.genops(io.BytesIO(head)):
            if op.name not in ("PROTO", "FRAME"):
                return op.name in ("LONG1", "LONG4", "LONG") and argument == _LEGACY_MAGIC_NUMBER
    except (ValueError, EOFError):
        pass
    return False


def _unpickled(path: Path, trust_pickle: bool):
    """What torch.save wrote: tensors and containers of them are read safely in any case;
    anything else (a module, other Python objects) only when trusted, with the current
    folder and the file's folder importable, as they were for the script that saved it."""
    import torch

    try:
        with quiet_libraries():
            return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        if not trust_pickle:
            raise ConvexportError(
                f"{path}: holds a pickled nn.Module (or other Python objects) and unpickling runs code from the "
                f"file; {TRUST_HINT}, or save a TorchScript archive or a state_dict instead"
            ) from None
    except Exception as exc:
        raise ConvexportError(f"{path}: not a readable torch.save file ({first_line(exc)})") from exc
    folders = [os.getcwd(), str(path.resolve().parent)]
    added = [folder for folder in dict.fromkeys(folders) if folder not in sys.path]
    sys.path[:0] = added
    try:
        with quiet_libraries():
            return torch.load(str(path), map_location="cpu", weights_only=False)
    except AttributeError as exc:
        missing = re.search(r"Can't get attribute '(\w+)' on <module '[\w.]*__main__'", str(exc))
        if missing:
            raise ConvexportError(
                f"{path}: the model's class {missing[1]} was defined in the script that saved it (__main__), which "
                f"convexport cannot import; save model.state_dict() instead and {STATE_DICT_HINT}"
            ) from None
        raise ConvexportError(f"{path}: could not unpickle ({first_line(exc)})") from exc
    except ModuleNotFoundError as exc:
        raise ConvexportError(
            f"{path}: the model's class is in module {exc.name!r}, which is not importable here; run convexport "
            f"from the folder that holds it, or {STATE_DICT_HINT}"
        ) from None
    except Exception as exc:
        raise ConvexportError(f"{path}: could not unpickle ({first_line(exc)})") from exc
    finally:
        for folder in added:
            sys.path.remove(folder)


def _module_in(path: Path, loaded, key: str | None):
    """The nn.Module that `loaded` is or that a checkpoint dict holds (under `key` when given;
    the only module among its entries otherwise)."""
    import torch

    if isinstance(loaded, torch.nn.Module):
        if key is not None:
            raise ConvexportError(f"{path}:{key}: the file holds one nn.Module and no entries to name")
        return loaded.eval()
    if not isinstance(loaded, dict):
        raise ConvexportError(f"{path}: holds a {type(loaded).__name__}, not a model; {STATE_DICT_HINT}")
    keys = ", ".join(map(repr, list(loaded)[:12])) + (", ..." if len(loaded) > 12 else "")
    if key is not None:
        if not isinstance(loaded.get(key), torch.nn.Module):
            what = "no such entry" if key not in loaded else f"a {type(loaded[key]).__name__}"
            raise ConvexportError(f"{path}:{key}: {what}, not an nn.Module (entries: {keys})")
        return loaded[key].eval()
    modules = [name for name, value in loaded.items() if isinstance(value, torch.nn.Module)]
    if len(modules) == 1:
        return loaded[modules[0]].eval()
    if modules:
        raise ConvexportError(
            f"{path}: a checkpoint with {len(modules)} modules ({', '.join(map(repr, modules))}); name one as "
            f"{path}:{modules[0]}"
        )
    if all(isinstance(value, torch.Tensor) for value in loaded.values()):
        raise ConvexportError(f"{path}: holds tensors (a state_dict), not a model; {STATE_DICT_HINT}")
    raise ConvexportError(f"{path}: a checkpoint dict (entries: {keys}) with no nn.Module in it; {STATE_DICT_HINT}")
