"""How the half-precision stage rounds a stored float constant (an initializer, a Constant
node's value) into the half type.

A weight its readers sum along rows (a Conv's, a MatMul's: row_sums.py) is rounded keeping each
row's sum; any other constant to the nearest half value. A finite value beyond the half type's
range stands for an infinity (an attention mask's finfo(float32).min) and becomes half the
largest finite value, 32752 for float16: an infinity times a mask's zero would be NaN, and the
largest value plus any negative score is an infinity again, which makes a fully masked row's
softmax NaN instead of uniform. The outputs' judgement says whether the model still computes
what it did.

Keeping the sums removes the part of a row's output error that is its input's mean times the
row's sum of errors, at the cost of a few elements each further from its exact value: on an
input without a mean that is all cost, and which one a model's outputs feel is for them to say
(choose.py, step 4: the model converted each way, to_nearest() and by_input_moments() giving
the others). Rounded by its input's second moments (input_moments.py), a weight's errors are
placed where the input it meets is small: its mean (what the sums keep) and its correlations.

The stage rounds the same weights for the per-node measurement and for every attempt it
judges; keeping the rows' sums costs ten times rounding to nearest (bench/RESULTS.md), so each
weight's choice is made once and kept as the positions of the elements that went to their other
neighbour (a few percent of them, 4 bytes each: about a 20th of the weights' float32 bytes).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ..ir import tensor_array
from ..ir.slots import NUMPY_TYPES
from .input_moments import flips_by_moments
from .row_sums import Rows, flips_keeping_sums, summed_rows, with_flips

FLOAT = TensorProto.FLOAT
# how a stored constant may be rounded (WeightRounding.way), as the report names them
ROUNDING_WAYS = ("keeping_row_sums", "by_input_moments", "to_nearest")


class WeightRounding:
    """The stored float constants of one graph rounded into `half` (module doc), by name: a
    weight of `moments` (input_moments.input_moments) by its input's second moments, any other
    weight with rows keeping their sums where `keeping_sums`, the rest to nearest."""

    def __init__(
        self,
        graph: onnx.GraphProto,
        half: int,
        keeping_sums: bool = True,
        moments: dict[str, list] | None = None,
        given: dict[str, tuple[onnx.TensorProto, str]] | None = None,
    ):
        self.half = half
        self.rows = weight_rows(graph) if keeping_sums or moments else {}
        self.moments = moments or {}
        # name -> its half tensor and way, rounded already where the weight is also read elsewhere
        # (an If's other branch: branches.py), so that both read one weight
        self.given = given or {}
        self._flipped: dict[str, np.ndarray] = {}  # name -> the flat positions at their other neighbour
        self._graph = graph
        self._keeping_sums = keeping_sums

    def rounded(self, tensor: onnx.TensorProto, name: str | None = None) -> onnx.TensorProto:
        """`tensor` (the constant `name`, its own name where not given) in the half type."""
        name = name or tensor.name
        if name in self.given:
            own = onnx.TensorProto()
            own.CopyFrom(self.given[name][0])
            own.name = tensor.name
            return own
        values = tensor_array(tensor)
        rows = self.rows.get(name)
        if rows is None or values.dtype != np.float32 or not values.size or not _all_in_range(values, self.half):
            return rounded(tensor, self.half)
        dtype = NUMPY_TYPES[self.half]
        if name not in self._flipped:
            if name in self.moments:
                self._flipped[name] = flips_by_moments(values, dtype, rows, self.moments[name])
            elif self._keeping_sums:
                self._flipped[name] = flips_keeping_sums(values, dtype, rows)
            else:
                return rounded(tensor, self.half)
        return numpy_helper.from_array(with_flips(values, dtype, self._flipped[name]), tensor.name)

    def way(self, name: str) -> str:
        """How the constant `name` was rounded: "by_input_moments", "keeping_row_sums" or
        "to_nearest" (the report's words)."""
        if name in self.given:
            return self.given[name][1]
        if name not in self._flipped:
            return "to_nearest"
        return "by_input_moments" if name in self.moments else "keeping_row_sums"

    def to_nearest(self) -> WeightRounding:
        """The same graph's constants, every one rounded to nearest."""
        return WeightRounding(self._graph, self.half, keeping_sums=False, given=self.given)

    def by_input_moments(self, moments: dict[str, list]) -> WeightRounding:
        """The same graph's constants, those of `moments` rounded by their input's second
        moments, the other weights with rows keeping their sums."""
        return WeightRounding(self._graph, self.half, moments=moments, given=self.given)


def weight_rows(graph: onnx.GraphProto) -> dict[str, Rows]:
    """The stored float constants the graph's nodes sum along rows (row_sums.py): name -> Rows."""
    shapes = weight_shapes(graph)
    return summed_rows(list(graph.node), set(shapes), shapes)


def weight_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    """The shape of each stored float32 constant (initializer or Constant node's value), by name."""
    shapes = {tensor.name: tuple(tensor.dims) for tensor in graph.initializer if tensor.data_type == FLOAT}
    for node in graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value" and attribute.t.data_type == FLOAT:
                    shapes[node.output[0]] = tuple(attribute.t.dims)
    return shapes


def rounded(tensor: onnx.TensorProto, half: int) -> onnx.TensorProto:
    """`tensor` rounded to the nearest value of the half type (ties to even), a value beyond its
    range saturated (module doc)."""
    values = tensor_array(tensor)
    if half == TensorProto.FLOAT16:
        largest = _largest(half)
        beyond = np.isfinite(values) & (np.abs(values) > largest)
        values = np.where(beyond, np.clip(values, -largest, largest), values)
    return numpy_helper.from_array(values.astype(np.float32).astype(NUMPY_TYPES[half]), tensor.name)


def _all_in_range(values: np.ndarray, half: int) -> bool:
    """Whether every one of `values` is finite and within _largest (no stand-in infinity; a NaN
    makes the largest magnitude NaN, and the comparison false)."""
    largest = _largest(half)
    return bool(values.max() <= largest and values.min() >= -largest)


def _largest(half: int) -> float:
    """Half the half type's largest finite value: where a stand-in infinity is saturated to."""
    return float(ml_dtypes.finfo(NUMPY_TYPES[half]).max) / 2
