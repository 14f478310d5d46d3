"""The torch.export route: a `.pt2` saved by torch.export.save, an ExportedProgram whose inputs'
dims and dtypes the program itself declares. The dynamo ONNX exporter exports it as it is (it
is not traced again); --input can only describe the dims it has, or name those it leaves
dynamic, and torch's names for those (s0, s77) become stable ones in the ONNX graph."""

from __future__ import annotations

import re

import onnx

from ... import ir
from ...errors import ConvexportError
from ...util.files import check_readable_file
from ..export import ExportAsk, ExportResult, example_arguments, torch_graph
from ..inputs import InputSpec
from ..model import LoadedModel, ModelArgument, ProgramDim, ProgramInput
from ..onnx_route import BATCH_DIM, graph_input_specs
from ..torch_archives import read_exported_program
from .route import Route


def _recognises(argument: ModelArgument) -> bool:
    return argument.suffix == ".pt2"


def _load(argument: ModelArgument, trust_pickle: bool) -> LoadedModel:
    check_readable_file(argument.source, argument.file)
    program = read_exported_program(argument.file, trust_pickle)
    declared = _program_inputs(program)
    return LoadedModel(
        str(argument.path),
        ROUTE,
        argument.default_output(),
        program=program,
        example_inputs=None if declared is None else _example_tensors(declared),
        input_names=[] if declared is None else [value.name for value in declared],
        program_inputs=declared or [],
        files=[argument.file],
    )


def _export(loaded: LoadedModel, ask: ExportAsk) -> ExportResult:
    """The dynamo exporter on the program; its dims are its own (torch.onnx.export takes no
    dynamic_shapes for a program)."""
    args, names, specs = _program_arguments(loaded, ask.specs, ask.dynamic_batch)
    model, exporter, tracer_warnings = torch_graph(loaded, args, names, ask.opset, None, ("dynamo",))
    _name_torch_symbols(model, specs)
    inferred = ir.infer_shapes(model, loaded.source)
    return ExportResult(
        inferred, graph_input_specs(model), exporter, tracer_warnings, reference=inferred,
        argument_names=list(names), declared=ir.declared_value_info(model),
    )  # fmt: skip


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


def _program_arguments(
    loaded: LoadedModel, specs: list[InputSpec], dynamic_batch: bool
) -> tuple[tuple, list[str], list[InputSpec]]:
    """An exported program's example tensors, its inputs' names (--input's where given) and
    --input's specs in the order of its inputs, checked against them. torch.onnx.export does not
    trace a program again: the examples only have to exist, and --input or --dynamic-batch can
    only describe the dims the program has, or name those it leaves dynamic."""
    if loaded.example_inputs is None:  # inputs without the fake tensors that give their shapes
        args, names = example_arguments(loaded, specs, [])
        return args, names, specs
    paired = _paired_with_program(loaded, specs)
    _check_program_dynamic_batch(loaded, dynamic_batch)
    return loaded.example_inputs, [spec.name for spec in paired] or list(loaded.input_names), paired


def _paired_with_program(loaded: LoadedModel, specs: list[InputSpec]) -> list[InputSpec]:
    """--input's specs, one per program input in its order, each checked against that input:
    by name where every spec names one (an input left out stands as its name with no dims),
    else by position, where the spec's name renames the ONNX input as it does for a module.
    [] when no --input was given."""
    if not specs:
        return []
    declared = loaded.program_inputs
    if all(spec.name in {value.name for value in declared} for spec in specs):
        given = {spec.name: spec for spec in specs}
        paired = [given.get(value.name) for value in declared]
    elif len(specs) == len(declared):
        paired = list(specs)
    else:
        raise ConvexportError(
            f"--input: {loaded.source} takes {len(declared)} tensor input(s) "
            f"({', '.join(value.name for value in declared) or 'none'}), not {len(specs)}"
        )
    for spec, value in zip(paired, declared):
        if spec is not None:
            _check_against_program(loaded.source, spec, value)
    return [spec or InputSpec(value.name, ()) for spec, value in zip(paired, declared)]


def _check_against_program(source: str, spec: InputSpec, value: ProgramInput) -> None:
    """A ConvexportError unless `spec` fits the program input `value`: its dtype, its rank, its
    static dims as they are, a concrete size for a dynamic dim within the dim's range."""
    if spec.dtype_given and spec.dtype != value.dtype:
        raise ConvexportError(
            f"--input {spec}: {source} input {value.name!r} is {value.dtype}; a torch.export program's input "
            "types are fixed when it is exported (leave the type out, or give that one)"
        )
    if len(spec.dims) != len(value.dims):
        raise ConvexportError(
            f"--input {spec}: {source} input {value.name!r} has rank {len(value.dims)}, not {len(spec.dims)}"
        )
    for axis, (given, declared) in enumerate(zip(spec.dims, value.dims)):
        if isinstance(declared, int) and given != declared:
            raise ConvexportError(
                f"--input {spec}: {source} input {value.name!r} has dim {axis} of {declared}; a torch.export "
                "program's dims are fixed when it is exported (export it with dynamic_shapes, or give the "
                "module's factory)"
            )
        if isinstance(given, int) and not isinstance(declared, int) and not declared.admits(given):
            raise ConvexportError(
                f"--input {spec}: {source} input {value.name!r} allows dim {axis} only in "
                f"[{declared.lower}, {'inf' if declared.upper is None else declared.upper}]"
            )


def _check_program_dynamic_batch(loaded: LoadedModel, dynamic_batch: bool) -> None:
    """--dynamic-batch on an exported program is met where every input's first dim is already
    dynamic, and refused where one is static: the program cannot be changed."""
    if not dynamic_batch:
        return
    for value in loaded.program_inputs:
        if value.dims and isinstance(value.dims[0], int):
            raise ConvexportError(
                f"{loaded.source}: input {value.name!r} has a static batch of {value.dims[0]}; a torch.export "
                "program's dims are fixed when it is exported, so --dynamic-batch cannot change them (export it "
                "with dynamic_shapes={...: {0: torch.export.Dim('batch')}}, or give the module's factory)"
            )


# torch's names for the sizes an exported program leaves dynamic (s0, s77): an artefact of the
# trace, different from one torch version or model to the next.
_TORCH_SYMBOL = re.compile(r"^s\d+$")
_DIM_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _name_torch_symbols(model: onnx.ModelProto, specs: list[InputSpec]) -> None:
    """Give the dynamic dims torch named by symbol stable, readable names, the same one
    wherever a symbol appears (inputs, outputs, value_info, in expressions such as 2*s77)."""
    names = _symbol_names(model, specs)
    if not names:
        return
    for graph in ir.proto_scopes(model.graph):
        for value in [*graph.input, *graph.output, *graph.value_info]:
            _rename_dims(value.type, names)


def _symbol_names(model: onnx.ModelProto, specs: list[InputSpec]) -> dict[str, str]:
    """{torch symbol: name} for the symbols that are whole dims of the graph's inputs: the
    name --input gave that dim, else "batch" for a first dim, else INPUT_dimAXIS; a name
    already used (by another symbol, or a dim that is no symbol) gets the INPUT_dimAXIS form,
    then a number: two symbols are two sizes torch found independent."""
    given = {spec.name: spec.dims for spec in specs}
    initializers = {init.name for init in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializers]
    taken = {
        dim.dim_param
        for graph in ir.proto_scopes(model.graph)
        for value in [*graph.input, *graph.output, *graph.value_info]
        for dim in value.type.tensor_type.shape.dim
        if dim.dim_param and not _TORCH_SYMBOL.match(dim.dim_param)
    }
    names: dict[str, str] = {}
    for value in inputs:
        dims_given = given.get(value.name, ())
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            symbol = dim.dim_param
            if not _TORCH_SYMBOL.match(symbol) or symbol in names:
                continue
            given_dim = dims_given[axis] if axis < len(dims_given) else None
            named = given_dim if isinstance(given_dim, str) else None
            fallback = f"{value.name}_dim{axis}"
            names[symbol] = _unused_name([named or (BATCH_DIM if axis == 0 else fallback), fallback], taken)
            taken.add(names[symbol])
    return names


def _unused_name(wanted: list[str], taken: set[str]) -> str:
    """The first of `wanted` not taken, else the last with the first free number after it."""
    for name in wanted:
        if name not in taken:
            return name
    number = 2
    while f"{wanted[-1]}_{number}" in taken:
        number += 1
    return f"{wanted[-1]}_{number}"


def _rename_dims(value_type: onnx.TypeProto, names: dict[str, str]) -> None:
    """Rename the symbols in every dim_param of a type (a tensor's, or the element type of a
    sequence, an optional or a map's values), inside expressions too."""
    kind = value_type.WhichOneof("value")
    if kind == "tensor_type":
        for dim in value_type.tensor_type.shape.dim:
            if dim.dim_param:
                dim.dim_param = _DIM_TOKEN.sub(lambda token: names.get(token[0], token[0]), dim.dim_param)
    elif kind in ("sequence_type", "optional_type"):
        _rename_dims(getattr(value_type, kind).elem_type, names)
    elif kind == "map_type":
        _rename_dims(value_type.map_type.value_type, names)


ROUTE = Route(
    kind="exported_program",
    takes=(".pt2",),
    suffixes=(".pt2",),
    trusts="the program's graph and weights; compiled code (AOTInductor) and guards that are not size "
    "comparisons only with --trust-pickle (load/untrusted.py)",
    recognises=_recognises,
    load=_load,
    export=_export,
    torch_module=lambda loaded: loaded.program.module(),
)
