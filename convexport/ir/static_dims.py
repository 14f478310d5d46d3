"""Shape arithmetic over partly dynamic shapes, on the ModelProto between folding rounds
(folding.fold_to_fixed_point), after shape inference gave every dim it can.

- fold_static_dims: Gather(Shape(x), i) and Slice(Shape(x), ...) where every dim they pick
  is known become constants. With a dynamic batch the TorchScript exporter writes
  `B, C, H, W = x.shape` as four such Gathers; C, H and W fold, and what reads them with them.
  onnxscript's folder does this for a Gather with 1-D indices, not for the scalar index the
  TorchScript exporter writes, nor for a Slice of a shape.
- constant_reshape_targets: Reshape(x, Concat(...)) whose parts are constants and dims read
  off tensors (`x.view(B, heads, -1)`: B = Unsqueeze(Gather(Shape(t), 0))), or Reshape(x,
  Shape(t)) (`x.reshape_as(t)`), gets a constant target: an entry that is the same dim as x's
  own at its position (the same static size, or the same symbol: shape inference gives two
  dims one name only where they are one size) becomes 0, which copies it; one other run-time
  entry becomes -1 (B * windows), which resolves to it wherever the original runs, since the
  element count is x's either way, where no other entry can be 0. The Shape chains then have
  no reader and go.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from .scopes import proto_scopes
from .weight_files import tensor_array


def fold_static_dims(model: onnx.ModelProto, keep: frozenset[str] = frozenset()) -> onnx.ModelProto:
    """The model with each Gather or Slice of a Shape that picks only static dims replaced by a
    Constant node of those dims (same output name), but for the nodes named in `keep`: a new
    model, or `model` itself when there is none."""
    dims, constants = _known_dims(model), _constant_arrays(model)
    edits = {}  # (scope number, node number) -> the Constant node for it
    for number, scope in enumerate(proto_scopes(model.graph)):
        shapes = {node.output[0]: _shape_value(node, dims) for node in scope.node if node.op_type == "Shape"}
        for index, node in enumerate(scope.node):
            shape = shapes.get(node.input[0]) if node.input and node.domain in ("", "ai.onnx") else None
            if shape is None or node.name in keep:
                continue
            picked = _picked(node, shape, constants)
            if picked is not None:
                value = numpy_helper.from_array(picked)
                constant = onnx.helper.make_node("Constant", [], node.output[:1], name=node.name, value=value)
                edits[number, index] = constant
    if not edits:
        return model
    result = _copied(model)  # only now: a model of many GB is copied only where something folds
    for number, scope in enumerate(proto_scopes(result.graph)):
        for index, node in enumerate(scope.node):
            if (number, index) in edits:
                node.CopyFrom(edits[number, index])
    return result


def _copied(model: onnx.ModelProto) -> onnx.ModelProto:
    result = onnx.ModelProto()
    result.CopyFrom(model)
    return result


def _known_dims(model: onnx.ModelProto, named: bool = False) -> dict[str, list]:
    """Every tensor's dims that shape inference or the model gives: an int for a static dim,
    None for a dynamic one (or, with `named`, its dim_param where it has one)."""
    found = {}
    for scope in proto_scopes(model.graph):
        for value in (*scope.input, *scope.value_info, *scope.output):
            tensor_type = value.type.tensor_type
            if value.type.HasField("tensor_type") and tensor_type.HasField("shape"):
                found[value.name] = [_dim(d, named) for d in tensor_type.shape.dim]
        for initializer in scope.initializer:
            found[initializer.name] = list(initializer.dims)
    return _unambiguous(found, model)


def _unambiguous(found: dict, model: onnx.ModelProto) -> dict:
    """`found` without the names two scopes both make (a merged decoder's If branches share
    every name): by name, one branch's tensor would be taken for the other's."""
    made: dict[str, int] = {}
    for scope in proto_scopes(model.graph):
        names = {name for node in scope.node for name in node.output} | {init.name for init in scope.initializer}
        for name in names:
            made[name] = made.get(name, 0) + 1
    return {name: value for name, value in found.items() if made.get(name, 0) <= 1}


def _dim(dim, named: bool):
    if dim.HasField("dim_value"):
        return dim.dim_value
    return dim.dim_param if named and dim.HasField("dim_param") and dim.dim_param else None


def _constant_arrays(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The small integer constants (indices, bounds, shapes), initializers and Constant nodes, by name."""
    found = {}
    for scope in proto_scopes(model.graph):
        tensors = [(init.name, init) for init in scope.initializer]
        tensors += [(node.output[0], node.attribute[0].t) for node in scope.node if _holds_a_tensor(node)]
        for name, tensor in tensors:
            if tensor.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and np.prod(tensor.dims) <= 16:
                found[name] = tensor_array(tensor)
    return _unambiguous(found, model)


def _holds_a_tensor(node: onnx.NodeProto) -> bool:
    """A Constant node with its value as a tensor (not value_ints and the like)."""
    return node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value"


def _shape_value(node: onnx.NodeProto, dims: dict) -> list[int | None] | None:
    """The dims a Shape node outputs (its start and end applied), None where its input's rank is unknown."""
    shape = dims.get(node.input[0])
    if shape is None:
        return None
    attributes = {attr.name: attr.i for attr in node.attribute}
    return shape[attributes.get("start", 0) : attributes.get("end", len(shape))]


def _picked(node: onnx.NodeProto, shape: list, constants: dict, keep_dynamic: bool = False) -> np.ndarray | None:
    """What a Gather (axis 0) or Slice (of axis 0) of the shape value yields, where its indices
    or bounds are constants and every dim it picks is static (any dims, with `keep_dynamic`:
    an object array); None otherwise."""
    rank = len(shape)
    if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] in constants:
        if any(attr.name == "axis" and attr.i not in (0, -1) for attr in node.attribute):  # the shape is 1-D
            return None
        indices = constants[node.input[1]].astype(np.int64)
        if np.any((indices < -rank) | (indices >= rank)):
            return None
        picked = np.array(shape, dtype=object)[indices]
    elif node.op_type == "Slice" and all(name in constants for name in node.input[1:] if name):
        starts, ends, axes, steps = (
            constants[node.input[i]].reshape(-1) if len(node.input) > i and node.input[i] else None for i in range(1, 5)
        )
        if starts is None or ends is None:  # (ONNX requires both)
            return None
        if axes is not None and list(axes) not in ([0], [-1]):
            return None
        if steps is not None and int(steps[0]) != 1:
            return None  # (ONNX clamps the bounds of a negative step unlike Python)
        picked = np.array(shape, dtype=object)[int(starts[0]) : int(ends[0])]
    else:
        return None
    if keep_dynamic:
        return np.asarray(picked, dtype=object)
    if any(dim is None for dim in np.asarray(picked).reshape(-1)):
        return None
    return np.asarray(picked, dtype=np.int64)


def constant_reshape_targets(model: onnx.ModelProto, keep: frozenset[str] = frozenset()) -> onnx.ModelProto:
    """The model with each Reshape whose target is a Concat of constants and dims of tensors
    reading a constant target instead (a Constant node inserted before it), but for the
    Reshapes named in `keep`: a new model, or `model` itself when there is none."""
    dims, constants = _known_dims(model, named=True), _constant_arrays(model)
    edits = {}  # (scope number, node number) -> the Reshape's constant target
    for number, scope in enumerate(proto_scopes(model.graph)):
        producers = {output: node for node in scope.node for output in node.output}
        for index, node in enumerate(scope.node):
            if (
                node.op_type == "Reshape"
                and node.domain in ("", "ai.onnx")
                and len(node.input) >= 2
                and node.name not in keep
            ):
                target = _constant_target(node, producers, dims, constants)
                if target is not None:
                    edits[number, index] = target
    if not edits:
        return model
    taken = {name for scope in proto_scopes(model.graph) for node in scope.node for name in node.output}
    result = _copied(model)
    for number, scope in enumerate(proto_scopes(result.graph)):
        for index in sorted((index for scope_number, index in edits if scope_number == number), reverse=True):
            reshape = scope.node[index]  # from the last: an insertion leaves the earlier numbers as they are
            name = _fresh(reshape.output[0] + "_target", taken)
            value = numpy_helper.from_array(edits[number, index])
            reshape.input[1] = name
            scope.node.insert(index, onnx.helper.make_node("Constant", [], [name], name=name, value=value))
    return result


def _fresh(base: str, taken: set[str]) -> str:
    name, number = base, 0
    while name in taken:
        number += 1
        name = f"{base}_{number}"
    taken.add(name)
    return name


def _constant_target(node, producers, dims, constants) -> np.ndarray | None:
    """The Reshape's target as a constant, where its Concat's entries allow (see the module's
    docstring); None otherwise."""
    concat = producers.get(node.input[1])
    if concat is None or node.input[1] in constants:
        return None
    if concat.op_type != "Concat":  # a target of one part: x.reshape(t.shape), x.view(t.shape[:2])
        parts = [_entries(node.input[1], producers, dims, constants)]
        if parts[0] is None or _RUN_TIME in parts[0]:
            return None
    elif any(attr.name == "axis" and attr.i not in (0, -1) for attr in concat.attribute):
        return None
    else:
        parts = [_entries(part, producers, dims, constants) for part in concat.input]
    data_dims = dims.get(node.input[0])
    known = [part for part in parts if part is not None]
    if len(known) != len(parts) or data_dims is None:
        return None
    entries = [entry for part in known for entry in part]
    copies = not any(attr.name == "allowzero" and attr.i for attr in node.attribute)
    target: list[int | None] = []
    for axis, entry in enumerate(entries):
        if isinstance(entry, int) and not isinstance(entry, bool):
            target.append(entry)
        elif copies and entry is not _RUN_TIME and axis < len(data_dims) and data_dims[axis] == entry[1]:
            target.append(0)  # the same dim as the data's here: 0 copies it
        else:
            target.append(None)
    unknown = target.count(None)
    if unknown > 1 or (unknown == 1 and -1 in target):
        return None
    if unknown == 1:  # -1 resolves only where no other entry can be 0
        positive = [entry > 0 or (entry == 0 and copies and _positive(data_dims, axis))
                    for axis, entry in enumerate(target) if entry is not None]  # fmt: skip
        if not all(positive):
            return None
    return np.array([-1 if entry is None else entry for entry in target], np.int64)


_RUN_TIME = ("run time",)  # an entry computed at run time from something other than a dim


def _positive(data_dims: list, axis: int) -> bool:
    return axis < len(data_dims) and isinstance(data_dims[axis], int) and data_dims[axis] > 0


def _entries(name: str, producers, dims, constants) -> list | None:
    """The entries of one part of a shape: an int for a constant or a static dim, ("dim",
    dim_param) for a named dim of a tensor, _RUN_TIME for one entry computed otherwise; None
    where the part's length is not known."""
    if name in constants:
        return [int(v) for v in constants[name].reshape(-1)]
    producer = producers.get(name)
    if producer is None:
        return None
    if producer.op_type == "Unsqueeze" and dims.get(producer.input[0]) == [] and dims.get(name) == [1]:
        return _entries(producer.input[0], producers, dims, constants)
    read = _dims_read(name, producers, dims, constants)
    if read is not None:
        return [dim if isinstance(dim, int) else ("dim", dim) if dim else _RUN_TIME for dim in read]
    return [_RUN_TIME] if dims.get(name) in ([], [1]) else None


def _dims_read(name: str, producers, dims, constants) -> list | None:
    """The dims of a tensor t that `name` holds: Shape(t), a Gather of it with constant
    indices or a Slice of it with step 1 (as _picked reads them); None otherwise."""
    producer = producers.get(name)
    if producer is None or producer.domain not in ("", "ai.onnx"):
        return None
    if producer.op_type == "Shape":
        return _shape_value(producer, dims)
    if producer.op_type not in ("Gather", "Slice") or not producer.input:
        return None
    shape = _dims_read(producer.input[0], producers, dims, constants)
    if shape is None:
        return None
    picked = _picked(producer, shape, constants, keep_dynamic=True)
    return None if picked is None else list(picked.reshape(-1))
