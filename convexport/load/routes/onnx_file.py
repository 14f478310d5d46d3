"""The ONNX route: a `.onnx` file (its external data beside it), or an onnx.ModelProto given to
the Python API. Nothing is exported: the model is made ready for the rules (load/onnx_route.py)."""

from __future__ import annotations

from pathlib import Path

from ...errors import ConvexportError, first_line
from ...util.files import check_readable_file
from ..export import export_onnx
from ..model import LoadedModel, ModelArgument
from .route import Route


def _recognises(argument: ModelArgument) -> bool:
    import onnx

    return isinstance(argument.given, onnx.ModelProto) or (argument.path is not None and argument.suffix == ".onnx")


def _load(argument: ModelArgument, trust_pickle: bool) -> LoadedModel:
    if argument.path is None:  # an onnx.ModelProto
        return LoadedModel("<onnx.ModelProto>", ROUTE, Path.cwd() / "model.opt.onnx", onnx_model=argument.given)
    check_readable_file(argument.source, argument.path)
    model, data_files = read_onnx(argument.path)
    return LoadedModel(
        argument.source, ROUTE, argument.default_output(), onnx_model=model, files=[argument.path, *data_files]
    )


def read_onnx(path: Path):
    """The model and the external data files it names. A large model's external weights stay
    in their files, file-backed (ir.weight_files: read tensor by tensor when a rule needs one);
    a smaller one's are read in."""
    import onnx
    from google.protobuf.message import DecodeError
    from onnx.external_data_helper import load_external_data_for_model

    from ...ir import external_data_files, kept_from_serialisation, point_at_files

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


ROUTE = Route(
    kind="onnx",
    takes=(".onnx",),
    suffixes=(".onnx",),
    trusts="nothing runs: the file is read as protobuf, its external data only from its own folder",
    recognises=_recognises,
    load=_load,
    export=export_onnx,
)
