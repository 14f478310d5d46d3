"""The TorchScript route: a `.pt`/`.pth` holding a TorchScript archive (torch.jit.save),
exported by the TorchScript ONNX exporter, the only one that takes a ScriptModule."""

from __future__ import annotations

from ...util.files import check_readable_file
from ..export import export_script
from ..model import LoadedModel, ModelArgument
from ..torch_archives import is_torchscript_file, read_torchscript
from .route import Route


def _recognises(argument: ModelArgument) -> bool:
    return argument.suffix in (".pt", ".pth") and is_torchscript_file(argument.file)


def _load(argument: ModelArgument, trust_pickle: bool) -> LoadedModel:
    check_readable_file(argument.source, argument.file)
    program = read_torchscript(argument.file, argument.entry or None)
    return LoadedModel(argument.source, ROUTE, argument.default_output(), program=program, files=[argument.file])


ROUTE = Route(
    kind="torchscript",
    takes=(".pt", ".pth"),
    suffixes=(".pt", ".pth"),
    trusts="torch.jit.load: the archive's TorchScript code runs in TorchScript's interpreter, no Python of the file's",
    recognises=_recognises,
    load=_load,
    export=export_script,
    takes_examples=True,
    torch_module=lambda loaded: loaded.program,
    entries="key",
)
