"""The module route of the Python API: an nn.Module handed to optimize() (a state_dict handed
instead is refused with what to do)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ...errors import ConvexportError
from ..export import export_module
from ..model import LoadedModel, ModelArgument, train_mode_note
from .route import Route


def _recognises(argument: ModelArgument) -> bool:
    import torch

    given = argument.given
    return argument.path is None and (isinstance(given, torch.nn.Module) or _is_state_dict(given))


def _is_state_dict(given) -> bool:
    import torch

    return isinstance(given, Mapping) and bool(given) and all(isinstance(v, torch.Tensor) for v in given.values())


def _load(argument: ModelArgument, trust_pickle: bool) -> LoadedModel:
    given = argument.given
    if _is_state_dict(given):
        raise ConvexportError(
            f"a {type(given).__name__} of {len(given)} tensors is a state_dict: weights without the module that uses "
            "them; build the module, load_state_dict() it, and pass the module"
        )
    in_train_mode = given.training
    modes = [(module, module.training) for module in given.modules()]

    def restore() -> None:
        """The caller's module and each submodule back in the mode it was given in."""
        for module, training in modes:
            module.training = training

    loaded = LoadedModel(argument.source, ROUTE, Path.cwd() / "model.opt.onnx", program=given.eval(), restore=restore)
    if in_train_mode:
        loaded.notes.append(train_mode_note(argument.source))
    return loaded


ROUTE = Route(
    kind="module",
    takes=(),
    suffixes=(),
    trusts="the module the caller hands over, already in memory",
    recognises=_recognises,
    load=_load,
    export=export_module,
    takes_examples=True,
    torch_module=lambda loaded: loaded.program,
)
