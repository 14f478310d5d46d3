"""The pickled route: a `.pt`/`.pth` written by torch.save, of an nn.Module or of a checkpoint
dict holding one (`MODEL:KEY` names the entry). Unpickling a module runs code from the file,
so it is read only with --trust-pickle; tensors alone (a state_dict) are read safely and
refused with advice (load/torch_archives.py)."""

from __future__ import annotations

from ...util.files import check_readable_file
from ..export import export_module
from ..model import LoadedModel, ModelArgument
from ..torch_archives import read_pickled_module
from .route import Route


def _recognises(argument: ModelArgument) -> bool:
    return argument.suffix in (".pt", ".pth")


def _load(argument: ModelArgument, trust_pickle: bool) -> LoadedModel:
    check_readable_file(argument.source, argument.file)
    program = read_pickled_module(argument.file, trust_pickle, argument.entry or None)
    return LoadedModel(argument.source, ROUTE, argument.default_output(), program=program, files=[argument.file])


ROUTE = Route(
    kind="module",
    takes=(".pt", ".pth"),
    suffixes=(".pt", ".pth"),
    trusts="tensors only (torch.load weights_only); a pickled module only with --trust-pickle, which runs its code",
    recognises=_recognises,
    load=_load,
    export=export_module,
    takes_examples=True,
    torch_module=lambda loaded: loaded.program,
    entries="key",
)
