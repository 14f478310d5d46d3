"""The routes from what a user gives to an ONNX graph, one module each, in one table.

ROUTES is read in order: the first route that recognises the model loads and exports it. A
route is a routes.Route (route.py): what it takes, what it trusts, how it recognises, loads and
exports its kind of model. Adding one is a module and a line here (docs/architecture.md).
"""

from __future__ import annotations

from pathlib import Path

from ...errors import ConvexportError
from ..model import LoadedModel, ModelArgument
from . import exported_program, factory, module_object, onnx_file, pickled, torchscript
from .route import Route

ROUTES: list[Route] = [
    onnx_file.ROUTE,  # model.onnx, or an onnx.ModelProto
    torchscript.ROUTE,  # model.pt / .pth holding a TorchScript archive
    pickled.ROUTE,  # model.pt / .pth[:KEY] written by torch.save
    exported_program.ROUTE,  # model.pt2 written by torch.export.save
    factory.ROUTE,  # file.py[:callable], package.module:callable
    module_object.ROUTE,  # an nn.Module given to the Python API
]

__all__ = ["ROUTES", "Route", "load_model", "model_suffixes", "route_for"]


def load_model(given: str | Path | object, trust_pickle: bool = False) -> LoadedModel:
    """The model `given` (a MODEL string or Path, or an object for the Python API) loaded by its
    route; every failure is a ConvexportError naming the file and what to do."""
    argument = ModelArgument.of(given)
    route = route_for(argument)
    if argument.entry and not route.entries:
        keyed = ", ".join(dict.fromkeys(suffix for each in ROUTES if each.entries == "key" for suffix in each.suffixes))
        raise ConvexportError(f"{argument.source}: only a checkpoint ({keyed}) has entries to name after ':'")
    return route.load(argument, trust_pickle)


def route_for(argument: ModelArgument) -> Route:
    for route in ROUTES:
        if route.recognises(argument):
            return route
    if argument.path is None:
        raise ConvexportError(
            f"cannot optimize a {type(argument.given).__name__}: give a path, an onnx.ModelProto or an nn.Module"
        )
    taken = list(dict.fromkeys(text for route in ROUTES for text in route.takes))
    raise ConvexportError(
        f"{argument.source}: unknown model type {argument.path.suffix or '(no suffix)'!r}; expected "
        f"{', '.join(taken[:-1])} or {taken[-1]}"
    )


def model_suffixes() -> tuple[str, ...]:
    """The suffixes of every file a route reads as a model (or its code)."""
    return tuple(dict.fromkeys(suffix for route in ROUTES for suffix in route.suffixes))
