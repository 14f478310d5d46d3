"""Turn a MODEL argument into something exportable: an ONNX model or a torch program.

MODEL is one of (docs/commands.md):
  *.onnx                         an ONNX model, used as it is
  *.pt / *.pth[:KEY]             a TorchScript archive; a pickled nn.Module, or a checkpoint dict
                                 holding one (under KEY), only when trusted (torch_archives.py)
  *.pt2                          an ExportedProgram saved by torch.export.save
  path/file.py[:callable]        a factory (default `build`) returning a module or a
  package.module:callable        (module, example_inputs) pair
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConvexportError, first_line
from .files import Terminated
from .torch_archives import read_exported_program, read_torch_file

DEFAULT_FACTORY = "build"
MODEL_SUFFIXES = (".onnx", ".pt", ".pth", ".pt2")  # the model files convexport reads


@dataclass(frozen=True)
class ProgramDim:
    """A dim a torch.export program left dynamic: torch's name for it (a symbol such as s77,
    or an expression over symbols such as 2*s77), the sizes the program allows (upper None:
    unbounded) and the size its example inputs give it."""

    symbol: str
    lower: int
    upper: int | None
    example: int

    def admits(self, size: int) -> bool:
        return self.lower <= size and (self.upper is None or size <= self.upper)


@dataclass(frozen=True)
class ProgramInput:
    """A tensor input of a torch.export program, as the program declares it."""

    name: str
    dims: tuple[int | ProgramDim, ...]
    dtype: str  # torch's name without "torch.": float32, int64, ...


@dataclass
class LoadedModel:
    """What a MODEL argument names, ready for export."""

    source: str  # the MODEL argument as given
    kind: str  # onnx | torchscript | exported_program | module
    default_output: Path  # <stem>.opt.onnx beside the model (cwd for modules)
    onnx_model: Any = None  # onnx.ModelProto when kind == "onnx"
    program: Any = None  # nn.Module, ScriptModule or ExportedProgram
    example_inputs: tuple | None = None
    input_names: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)  # what it was read from: never to be written
    program_inputs: list[ProgramInput] = field(default_factory=list)  # an exported program's, in order
    notes: list[str] = field(default_factory=list)  # what a user should know of how it was read, in words


def load_model(source: str, trust_pickle: bool = False) -> LoadedModel:
    """Load MODEL; every failure is a ConvexportError naming the file and what to do."""
    path_text, _, name = _split_factory(source)
    path = Path(path_text)
    suffix = path.suffix.lower()
    if suffix == ".py" or (name and _is_module_name(path_text)):
        return _load_factory(source, path_text, name or DEFAULT_FACTORY)
    if suffix not in MODEL_SUFFIXES:
        raise ConvexportError(
            f"{source}: unknown model type {path.suffix or '(no suffix)'!r}; expected .onnx, .pt, "
            ".pth, .pt2, file.py[:callable] or package.module:callable"
        )
    if name and suffix not in (".pt", ".pth"):
        raise ConvexportError(f"{source}: only a checkpoint (.pt, .pth) has entries to name after ':'")
    _check_readable_file(source, path)
    default_output = path.with_name(path.stem + (f".{name}" if name else "") + ".opt.onnx")
    if suffix == ".onnx":
        model, data_files = _load_onnx(path)
        return LoadedModel(source, "onnx", default_output, onnx_model=model, files=[path, *data_files])
    if suffix == ".pt2":
        loaded = _load_exported_program(path, default_output, trust_pickle)
    else:
        kind, program = read_torch_file(path, trust_pickle, name or None)
        loaded = LoadedModel(source, kind, default_output, program=program)
    loaded.files = [path]
    return loaded


def _is_module_name(text: str) -> bool:
    """`package.module` (dotted identifiers) that is no file: a module to import. A name that
    ends in a model file's suffix is a file that is not there, never a module: importing
    `weights.pt` would run weights.py."""
    if Path(text).suffix.lower() in (*MODEL_SUFFIXES, ".py"):
        return False
    return all(part.isidentifier() for part in text.split(".")) and not os.path.exists(text)


def _split_factory(source: str) -> tuple[str, str, str]:
    """'a/b.py:make' -> ('a/b.py', ':', 'make'), 'ckpt.pt:ema' -> ('ckpt.pt', ':', 'ema');
    a file that exists under the whole name, and Windows drive letters, are left alone."""
    if os.path.exists(source):
        return source, "", ""
    head, sep, tail = source.rpartition(":")
    if sep and tail and "/" not in tail and "\\" not in tail and len(head) > 1:
        return head, sep, tail
    return source, "", ""


def _load_onnx(path: Path):
    """The model and the external data files it names. A large model's external weights stay
    in their files, file-backed (ir.weight_files: read tensor by tensor when a rule needs one);
    a smaller one's are read in."""
    import onnx
    from google.protobuf.message import DecodeError
    from onnx.external_data_helper import load_external_data_for_model

    from .ir import external_data_files, kept_from_serialisation, point_at_files

    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, OSError, RuntimeError) as exc:
        raise _unreadable(path, exc) from exc
    if not model.graph.node and not model.graph.output:
        raise ConvexportError(f"{path}: the file parses as ONNX but holds no graph")
    data_files = [path.parent / name for name in external_data_files(model)]
    try:
        large = kept_from_serialisation(model)  # reads the external entries' lengths
        if large:
            point_at_files(model, path.parent)
        else:
            load_external_data_for_model(model, str(path.parent))
    # onnx.checker.ValidationError: an external-data file that is missing
    except (ValueError, OSError, onnx.checker.ValidationError) as exc:
        raise _unreadable(path, exc) from exc
    try:  # a large model by path, its weights unread (the checker would serialise it whole)
        onnx.checker.check_model(str(path) if large else model, full_check=False)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ConvexportError(f"{path}: invalid ONNX model: {first_line(exc)}") from exc
    return model, data_files


def _unreadable(path: Path, exc: BaseException) -> ConvexportError:
    return ConvexportError(
        f"{path}: not a readable ONNX model ({first_line(exc)}); re-export it or check the file was copied whole"
    )


def _load_exported_program(path: Path, default_output: Path, trust_pickle: bool) -> LoadedModel:
    program = read_exported_program(path, trust_pickle)
    declared = _program_inputs(program)
    return LoadedModel(
        str(path),
        "exported_program",
        default_output,
        program=program,
        example_inputs=None if declared is None else _example_tensors(declared),
        input_names=[] if declared is None else [value.name for value in declared],
        program_inputs=declared or [],
    )


def _program_inputs(program) -> list[ProgramInput] | None:
    """The program's tensor user inputs with their dims and dtypes, from the fake tensors its
    placeholders carry (meta["val"]), or None where one carries none. Parameters and buffers
    are placeholders too but not user inputs; a constant argument (an int, None) is listed in
    user_inputs by its value and torch.export baked it into the graph: neither is an input of
    the ONNX graph."""
    import torch

    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    ranges = {str(symbol): bounds for symbol, bounds in program.range_constraints.items()}
    declared = []
    for name in program.graph_signature.user_inputs:
        if not isinstance(name, str) or name not in placeholders:
            continue
        value = placeholders[name].meta.get("val")
        if not isinstance(value, torch.Tensor):  # a SymInt input, or an archive without fake tensors
            return None
        try:
            dims = tuple(_program_dim(size, ranges) for size in value.shape)
        except (TypeError, ValueError):  # an expression that does not come out a whole number
            return None
        declared.append(ProgramInput(name, dims, str(value.dtype).removeprefix("torch.")))
    return declared


def _program_dim(size, ranges: dict) -> int | ProgramDim:
    """A static dim as its int; a symbolic one (a torch.SymInt) as a ProgramDim whose example
    gives each of its symbols the size _example_size picks in that symbol's range."""
    if isinstance(size, int):
        return size
    expression = size.node.expr
    values = {symbol: _example_size(*_bounds(ranges.get(str(symbol)))) for symbol in expression.free_symbols}
    lower, upper = _bounds(ranges.get(str(expression)))
    return ProgramDim(str(expression), lower, upper, int(expression.subs(values)))


def _bounds(value_range) -> tuple[int, int | None]:
    """A torch ValueRanges as (lower, upper or None when unbounded, torch's int_oo); a symbol
    without one is any size."""
    if value_range is None:
        return 0, None
    lower = int(value_range.lower) if value_range.lower.is_Integer else 0
    upper = int(value_range.upper) if value_range.upper.is_Integer else None
    return lower, upper


def _example_size(lower: int, upper: int | None) -> int:
    """The smallest size of at least 2 in [lower, upper]: torch specialises a dim of size 0 or
    1 to a constant, so an example of 2 keeps the dim what the program says it is."""
    size = max(lower, 2)
    return size if upper is None or size <= upper else upper


def _example_tensors(declared: list[ProgramInput]) -> tuple:
    """Zero tensors of the declared dtypes and shapes (symbolic dims at their example sizes)."""
    import torch

    return tuple(
        torch.zeros(
            tuple(dim if isinstance(dim, int) else dim.example for dim in value.dims), dtype=getattr(torch, value.dtype)
        )
        for value in declared
    )


def _load_factory(source: str, path_text: str, factory_name: str) -> LoadedModel:
    module = _import_factory_module(source, path_text)
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise ConvexportError(f"{source}: {path_text} has no callable {factory_name!r}")
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
    loaded = LoadedModel(source, "module", default_output, program=program.eval(), example_inputs=inputs)
    loaded.files = files
    if in_train_mode:
        loaded.notes.append(train_mode_note(source))
    return loaded


def train_mode_note(source: str) -> str:
    """Said where a factory (or the API's caller) gave a module in train mode."""
    return (
        f"{source} gave the module in train mode; it was exported in eval mode, as it is deployed (Dropout off, "
        "BatchNorm on its running statistics)"
    )


def _import_factory_module(source: str, path_text: str):
    if path_text.endswith(".py"):
        path = Path(path_text)
        _check_readable_file(source, path)
        name = f"convexport_user_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        loader_dir = str(path.resolve().parent)
        sys.path.insert(0, loader_dir)  # let the file import its neighbours
        try:
            _user_call(source, f"importing {path_text}", lambda: spec.loader.exec_module(module))
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


def _check_readable_file(source: str, path: Path) -> None:
    """A regular file, or a ConvexportError saying what the path is instead (nothing there, a
    folder, a FIFO or device, which opening would block on or misread, or an unusable name)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ConvexportError(f"{source}: no such file") from None
    except OSError as exc:
        raise ConvexportError(f"{source}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise ConvexportError(f"{source}: is a folder, not a model file")
    if not stat.S_ISREG(info.st_mode):
        raise ConvexportError(f"{source}: is not a regular file (a FIFO, socket or device); give a model file")


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
