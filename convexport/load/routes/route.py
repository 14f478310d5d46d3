"""A route: one kind of model a user gives, from recognising it to its ONNX graph."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..export import ExportAsk, ExportResult
from ..model import LoadedModel, ModelArgument


@dataclass(frozen=True)
class Route:
    """How one kind of model is recognised, loaded and exported.

    `load(argument, trust_pickle)` reads the model, running no code of the file's unless
    `trusts` says so; every failure is a ConvexportError naming the file. `export(loaded, ask)`
    gives the ONNX graph (load/export.py has the exporters). `torch_module(loaded)` is the torch
    module validation's float64 reference runs, for a route that has one."""

    kind: str  # the kind of model, as messages name it: onnx, torchscript, exported_program, module
    takes: tuple[str, ...]  # the MODEL strings it takes, as the unknown-type message lists them ("" for none)
    suffixes: tuple[str, ...]  # the model files it reads: never written over, a folder's other models
    trusts: str  # what loading runs of the file, and what --trust-pickle adds (docs/commands.md)
    recognises: Callable[[ModelArgument], bool]
    load: Callable[[ModelArgument, bool], LoadedModel]
    export: Callable[[LoadedModel, ExportAsk], ExportResult]
    takes_examples: bool = False  # example tensors given to optimize() are what it is exported on
    torch_module: Callable[[LoadedModel], object] | None = None
    entries: str = ""  # what MODEL:NAME names: "key" (an entry of the file), "callable" (a factory), "" nothing
