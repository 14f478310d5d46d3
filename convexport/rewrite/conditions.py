"""The `require:` conditions of a rule. Each returns None when it holds, else the reason.

    constant: [names]        initializers or Constant outputs (absent optional inputs pass)
    private: [names]         read by exactly one node and not a graph output, so removing
                             the node that makes it removes work instead of duplicating it
    same: [lists]            every element of a variadic list is the same tensor
    count: {list: n}         the variadic list has at least n elements
    static_shape: [names]    every dimension is known
    rank: {name: [r, ...]}   the tensor's rank is one of these
    per_channel: {k: t}      constant k is a scalar or one value per channel of tensor t
                             (broadcasts as [C, 1, ...] without changing t's shape)

The same conditions may stand under `where:`, where a failure means "no match" and is not
reported (a shape of graph the rule is not about), instead of `require:` (a refusal the
report lists with its reason).
"""

from __future__ import annotations

from collections.abc import Callable

from .. import ir
from ..ir import constant_value, is_absent, is_constant, is_static


def _each(values: dict, names) -> list[tuple[str, object]]:
    """(label, tensor) pairs for names that may be shared tensors or per-element lists."""
    pairs = []
    for name in names if isinstance(names, (list, tuple)) else [names]:
        bound = values.get(name)
        if isinstance(bound, list):
            pairs.extend((f"{name}[{i}]", tensor) for i, tensor in enumerate(bound))
        else:
            pairs.append((name, bound))
    return pairs


def _label(name: str, tensor) -> str:
    return f"{name} ({tensor.name})" if getattr(tensor, "name", "") else name


def constant(values: dict, names, graph: ir.Graph) -> str | None:
    for name, tensor in _each(values, names):
        if not is_absent(tensor) and not is_constant(tensor):
            fed = any(tensor is value for value in graph.inputs)
            return f"{_label(name, tensor)} is computed at run time, not a constant" + (
                ": a graph input (an initializer listed as an input too is only its default; "
                "--freeze-input-defaults makes such initializers constants)"
                if fed
                else ""
            )
    return None


def private(values: dict, names, graph: ir.Graph) -> str | None:
    outputs = set(map(id, graph.outputs))
    for name, tensor in _each(values, names):
        if is_absent(tensor):
            continue
        if id(tensor) in outputs:
            return f"{_label(name, tensor)} is a graph output"
        readers = {id(node) for node in tensor.outputs}
        if len(readers) > 1:
            return f"{_label(name, tensor)} is also read by {len(readers) - 1} other node(s)"
    return None


def same(values: dict, names, graph: ir.Graph) -> str | None:
    for name in names:
        elements = values.get(name) or []
        if any(element is not elements[0] for element in elements):
            return f"the elements of {name} are different tensors"
    return None


def count(values: dict, minimums: dict, graph: ir.Graph) -> str | None:
    for name, minimum in minimums.items():
        if len(values.get(name) or []) < int(minimum):
            return f"{name} has {len(values.get(name) or [])} element(s), fewer than {minimum}"
    return None


def static_shape(values: dict, names, graph: ir.Graph) -> str | None:
    for name, tensor in _each(values, names):
        shape = getattr(tensor, "shape", None)
        if not is_absent(tensor) and not is_static(shape):
            return f"{_label(name, tensor)} has no static shape ({shape})"
    return None


def rank(values: dict, ranks: dict, graph: ir.Graph) -> str | None:
    for name, allowed in ranks.items():
        allowed = allowed if isinstance(allowed, list) else [allowed]
        for label, tensor in _each(values, name):
            shape = getattr(tensor, "shape", None)
            if shape is None or len(shape) not in allowed:
                return f"{_label(label, tensor)} has rank {None if shape is None else len(shape)}, not {allowed}"
    return None


def per_channel(values: dict, pairs: dict, graph: ir.Graph) -> str | None:
    for constant_name, tensor_name in pairs.items():
        value, tensor = constant_value(values.get(constant_name)), values.get(tensor_name)
        shape = getattr(tensor, "shape", None)
        if value is None or shape is None or len(shape) < 2:
            return f"{constant_name} or the shape of {tensor_name} is unknown"
        padded = (1,) * (len(shape) - value.ndim) + value.shape
        if (
            value.ndim > len(shape)
            or any(d != 1 for i, d in enumerate(padded) if i != 1)
            or padded[1] not in (1, shape[1])
        ):
            return f"{constant_name} of shape {value.shape} is not per-channel for {tensor_name} {tuple(shape)}"
    return None


CONDITIONS: dict[str, Callable[[dict, object, ir.Graph], str | None]] = {
    "constant": constant,
    "private": private,
    "same": same,
    "count": count,
    "static_shape": static_shape,
    "rank": rank,
    "per_channel": per_channel,
}


def first_failure(require, values: dict, graph: ir.Graph) -> str | None:
    for name, argument in require:
        reason = CONDITIONS[name](values, argument, graph)
        if reason:
            return reason
    return None
