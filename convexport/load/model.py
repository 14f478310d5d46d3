"""What every route of convexport/load/routes/ shares: the model a user gives (ModelArgument), the
model a route loads (LoadedModel), and the checks on a model file before anything reads it.

MODEL is one of (docs/commands.md; each route says which it takes):
  *.onnx                         an ONNX model, used as it is
  *.pt / *.pth[:KEY]             a TorchScript archive; a pickled nn.Module, or a checkpoint dict
                                 holding one (under KEY), only when trusted (load/torch_archives.py)
  *.pt2                          an ExportedProgram saved by torch.export.save
  path/file.py[:callable]        a factory (default `build`) returning a module or a
  package.module:callable        (module, example_inputs) pair
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelArgument:
    """The model as the user gave it: a MODEL string (or Path) split into the file or module
    before ':' and the entry after it, or an object handed to the Python API."""

    given: Any  # the str, Path or object as given
    source: str  # how messages and the report name it: MODEL as given, <ClassName> for an object
    path: Path | None = None  # the file (or dotted module) before ':'; None for an object
    entry: str = ""  # what follows ':' (a factory, a checkpoint's key), "" for none

    @classmethod
    def of(cls, given) -> ModelArgument:
        if not isinstance(given, (str, Path)):
            return cls(given, f"<{type(given).__name__}>")
        path_text, _, entry = _split_factory(str(given))
        return cls(given, str(given), Path(path_text), entry)

    @property
    def suffix(self) -> str:
        return self.path.suffix.lower() if self.path is not None else ""

    @property
    def file(self) -> Path:
        """The file before ':', for the routes that read one (they recognise a suffix, which an
        object has not)."""
        if self.path is None:
            raise TypeError(f"{self.source} is an object, not a file")
        return self.path

    def default_output(self) -> Path:
        """<stem>[.<entry>].opt.onnx beside the model file."""
        return self.file.with_name(self.file.stem + (f".{self.entry}" if self.entry else "") + ".opt.onnx")


def _split_factory(source: str) -> tuple[str, str, str]:
    """'a/b.py:make' -> ('a/b.py', ':', 'make'), 'ckpt.pt:ema' -> ('ckpt.pt', ':', 'ema');
    a file that exists under the whole name, and Windows drive letters, are left alone."""
    if os.path.exists(source):
        return source, "", ""
    head, sep, tail = source.rpartition(":")
    if sep and tail and "/" not in tail and "\\" not in tail and len(head) > 1:
        return head, sep, tail
    return source, "", ""


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
    """What a MODEL argument names, ready for export by its route."""

    source: str  # the MODEL argument as given
    route: Any  # the routes.Route that loaded it (and exports it)
    default_output: Path  # <stem>.opt.onnx beside the model (cwd for modules)
    onnx_model: Any = None  # onnx.ModelProto, from the ONNX route
    program: Any = None  # nn.Module, ScriptModule or ExportedProgram
    example_inputs: tuple | None = None
    input_names: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)  # what it was read from: never to be written
    program_inputs: list[ProgramInput] = field(default_factory=list)  # an exported program's, in order
    notes: list[str] = field(default_factory=list)  # what a user should know of how it was read, in words
    restore: Callable[[], None] = lambda: None  # undoes what loading changed in the caller's own object


def train_mode_note(source: str) -> str:
    """Said where a factory (or the API's caller) gave a module in train mode."""
    return (
        f"{source} gave the module in train mode; it was exported in eval mode, as it is deployed (Dropout off, "
        "BatchNorm on its running statistics)"
    )
