"""The factory route: `path/file.py[:callable]` or `package.module:callable`, a function
(default `build`) that returns an nn.Module or a (module, example_inputs) pair; a module-level
`example_inputs()` gives the inputs where the factory does not. The user's code runs (that is
what a factory is); whatever it raises, and a sys.exit() or os._exit() too, is an error naming
it, and the standard streams are put back if it closed them."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from ...errors import ConvexportError, did_you_mean, first_line
from ...util.files import Terminated, check_readable_file
from ..export import export_module
from ..model import LoadedModel, ModelArgument, train_mode_note
from .route import Route

DEFAULT_FACTORY = "build"


def _recognises(argument: ModelArgument) -> bool:
    """A .py file, or `package.module:callable` (dotted identifiers that are no file)."""
    if argument.path is None:
        return False
    text = str(argument.path)
    dotted = all(part.isidentifier() for part in text.split(".")) and not os.path.exists(text)
    return argument.suffix == ".py" or bool(argument.entry and dotted)


def _load(argument: ModelArgument, trust_pickle: bool) -> LoadedModel:
    source, path_text, factory_name = argument.source, str(argument.path), argument.entry or DEFAULT_FACTORY
    module = _import_factory_module(source, path_text)
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        callables = [name for name, value in vars(module).items() if callable(value) and not name.startswith("_")]
        raise ConvexportError(
            f"{source}: {path_text} has no callable {factory_name!r}{did_you_mean(factory_name, callables)}"
        )
    produced = _user_call(source, f"{factory_name}()", factory)
    program, inputs = _unpack_factory_result(source, produced)
    if inputs is None and callable(getattr(module, "example_inputs", None)):
        inputs = _as_tuple(_user_call(source, "example_inputs()", module.example_inputs))
    # named after the factory where the file may hold several (net.py:small -> net.small.opt.onnx)
    named = "" if factory_name == DEFAULT_FACTORY else f".{factory_name}"
    if path_text.endswith(".py"):
        default_output = Path(path_text).with_name(f"{Path(path_text).stem}{named}.opt.onnx")
        files = [Path(path_text)]
    else:
        default_output = Path.cwd() / f"{path_text.rsplit('.', 1)[-1]}{named}.opt.onnx"
        files = [Path(module.__file__)] if getattr(module, "__file__", None) else []
    in_train_mode = getattr(program, "training", False)
    loaded = LoadedModel(source, ROUTE, default_output, program=program.eval(), example_inputs=inputs)
    loaded.files = files
    if in_train_mode:
        loaded.notes.append(train_mode_note(source))
    return loaded


def _import_factory_module(source: str, path_text: str):
    if path_text.endswith(".py"):
        path = Path(path_text)
        check_readable_file(source, path)
        # named by its path, not by hash(): the module's name is in the exported graph's metadata,
        # so one file optimized twice writes the same bytes
        name = f"convexport_user_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:  # (a .py file always has both)
            raise ConvexportError(f"{source}: {path_text} cannot be imported as a Python module")
        loader = spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        loader_dir = str(path.resolve().parent)
        sys.path.insert(0, loader_dir)  # let the file import its neighbours
        try:
            _user_call(source, f"importing {path_text}", lambda: loader.exec_module(module))
        except ConvexportError:
            del sys.modules[name]
            raise
        finally:
            sys.path.remove(loader_dir)
        return module
    added = _current_folder_importable()
    try:
        return _user_call(source, f"importing module {path_text!r}", lambda: importlib.import_module(path_text))
    finally:
        if added:
            sys.path.remove(added)


def _current_folder_importable() -> str | None:
    """Put the working directory on sys.path, as `python -m` does, when it is not there yet;
    what was added (for the caller to take back), or None."""
    cwd = os.getcwd()
    if "" in sys.path or cwd in sys.path:
        return None
    sys.path.insert(0, cwd)
    return cwd


def _user_call(source: str, what: str, call):
    """call(): the user's code (a factory, its module, example_inputs). Any exception, and a
    sys.exit() too, is a ConvexportError naming it; the standard streams are put back if the
    code closed them."""
    real_exit = os._exit
    os._exit = _refused_exit  # a factory that ends the process would leave exit 0 and nothing written
    try:
        return call()
    except (SystemExit, _ProcessExit) as exc:
        how = "os._exit" if isinstance(exc, _ProcessExit) else "sys.exit"
        raise ConvexportError(f"{source}: {what} called {how}({exc.code!r}); a factory must return the model") from None
    except (ConvexportError, KeyboardInterrupt, Terminated):
        raise
    except BaseException as exc:  # an Exception, or a BaseException of the user's own
        raise ConvexportError(f"{source}: {what} raised {type(exc).__name__}: {first_line(exc)}") from exc
    finally:
        os._exit = real_exit
        _reopen_closed_standard_streams()


class _ProcessExit(BaseException):
    """os._exit(code) called by the user's code, turned into an exception while it runs."""

    def __init__(self, code):
        super().__init__(code)
        self.code = code


def _refused_exit(code=0):
    raise _ProcessExit(code)


def _reopen_closed_standard_streams() -> None:
    """A sys.stdout or sys.stderr the user's code closed, open again on its file descriptor
    (or on the null device when that is closed too): convexport still reports to them."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        if stream is not None and not stream.closed:
            continue
        try:
            reopened = open(os.dup(fd), "w", encoding="utf-8", errors="backslashreplace")  # noqa: SIM115 (kept open)
        except OSError:
            reopened = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (kept open: the process's stream)
        setattr(sys, name, reopened)


def _unpack_factory_result(source: str, produced) -> tuple[Any, tuple | None]:
    import torch

    if isinstance(produced, torch.nn.Module):
        return produced, None
    if isinstance(produced, (tuple, list)) and len(produced) == 2 and isinstance(produced[0], torch.nn.Module):
        return produced[0], _as_tuple(produced[1])
    raise ConvexportError(
        f"{source}: the factory returned {type(produced).__name__}; expected an nn.Module or a "
        "(module, example_inputs) pair"
    )


def _as_tuple(inputs) -> tuple:
    import torch

    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    return tuple(inputs)


ROUTE = Route(
    kind="module",
    takes=("file.py[:callable]", "package.module:callable"),
    suffixes=(".py",),
    trusts="the factory's own code, which it is given to run",
    recognises=_recognises,
    load=_load,
    export=export_module,
    takes_examples=True,
    torch_module=lambda loaded: loaded.program,
    entries="callable",
)
