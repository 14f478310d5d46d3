"""A weight rounded into the half type so that each output's sum of its weights keeps its value.

A node that reads a weight W linearly makes each output element as y[o] = sum_j W[o, j] x[j]
(+ b[o]): o runs over a *row* of W (a conv's output channel, a MatMul's column), j over the
elements that row sums (a conv's input channels of its group and taps, a MatMul's K). Rounding
every element to the nearest half value leaves errors e[o, j] = fl(W[o, j]) - W[o, j], each
within half a unit in the last place (ulp), and y[o] off by sum_j e[o, j] x[j]. Write x = m + d
with m the mean of x: the part m * sum_j e[o, j] is the same at every position of the output, so
a global average pool or a sum over a sequence keeps it while it averages the rest away, and a
row's sum of errors grows as the square root of its length (0.29 sqrt(n) ulp). Inputs after a
ReLU or a BatchNorm's shift have such a mean.

So each row's sum of errors is brought under about one ulp of its elements: for the row's sum
s = sum_j e[o, j], the elements whose error has the sign of s are rounded to their other
neighbour instead (the half value on the far side of W[o, j]), cheapest first: an element
whose value lies near the midpoint between its two neighbours changes its own error from just
under to just over half an ulp, and moves s by one ulp. An element is taken while it brings s
nearer zero. The cost is a few elements' error in each row (0.29 sqrt(n) of them for equal
ulps), the gain the row's whole sum (bench/RESULTS.md: the bench networks' error against float64,
family by family, with and without it).

Rows are read from the weight's readers (`summed_rows`): Conv, ConvTranspose of one group, Gemm
and MatMul in either operand. A weight read in any other way, or by readers that sum it along
different axes, is rounded to nearest.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import onnx

ROWS_AT_ONCE = 1 << 22  # elements compensated at a time (16 MiB per float32 working array)
WORKERS = 4  # blocks compensated side by side: numpy leaves the GIL in the work on each
CANDIDATES_PER_SQRT = 4  # candidates per row: 4 sqrt(n) + 16, some 14 times the 0.29 sqrt(n) flips a row needs


@dataclass(frozen=True)
class Rows:
    """How a weight's elements form rows: the weight transposed by `order`, its first `kept`
    axes indexing the rows and the rest the elements each row sums."""

    order: tuple[int, ...]
    kept: int

    def matrix(self, values: np.ndarray) -> np.ndarray:
        return values.transpose(self.order).reshape(self.count(values.shape), -1)

    def count(self, shape: tuple[int, ...]) -> int:
        """How many rows a weight of `shape` has."""
        return math.prod(shape[axis] for axis in self.order[: self.kept])

    def original_positions(self, flat: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """Flat positions in the matrix of an array of `shape`, as flat positions in the array."""
        moved = np.unravel_index(flat, tuple(shape[axis] for axis in self.order))
        index: list = [None] * len(shape)
        for position, axis in enumerate(self.order):
            index[axis] = moved[position]
        return np.asarray(np.ravel_multi_index(tuple(index), shape)) if shape else flat


def summed_rows(nodes: list[onnx.NodeProto], names: set[str], shapes: dict[str, tuple[int, ...]]) -> dict[str, Rows]:
    """For each weight in `names` read only by nodes that sum it the same way (module doc): its
    Rows. `shapes` gives the weights' shapes."""
    found: dict[str, Rows | None] = {}
    for node in nodes:
        for position, name in enumerate(node.input):
            if name not in names:
                continue
            rows = _rows_of(node, position, len(shapes[name]))
            if name in found and found[name] != rows:
                rows = None
            found[name] = rows
    return {name: rows for name, rows in found.items() if rows is not None}


def _rows_of(node: onnx.NodeProto, position: int, rank: int) -> Rows | None:
    """The rows `node` sums its input `position` (of rank `rank`) along, or None."""
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    identity = tuple(range(rank))
    if node.op_type == "Conv" and position == 1 and rank >= 3:
        return Rows(identity, 1)  # [O, C/group, k...]: an output channel sums its group's channels and taps
    if node.op_type == "ConvTranspose" and position == 1 and rank >= 3 and attributes.get("group", 1) == 1:
        return Rows((1, 0, *range(2, rank)), 1)  # [C, O, k...]
    if node.op_type == "Gemm" and rank == 2 and position in (0, 1):
        transposed = attributes.get("transA" if position == 0 else "transB", 0)
        # A [M, K] (transA: [K, M]) and B [K, N] (transB: [N, K]): a row of A, a column of B
        along_first = (position == 0) != bool(transposed)
        return Rows((0, 1) if along_first else (1, 0), 1)
    if node.op_type == "MatMul" and position in (0, 1):
        if rank == 1:
            return Rows((0,), 0)  # a vector: one output, all of it summed
        if position == 0:
            return Rows(identity, rank - 1)  # [..., M, K]
        return Rows((*range(rank - 2), rank - 1, rank - 2), rank - 1)  # [..., K, N]: a column
    return None


def rounded_keeping_sums(values: np.ndarray, half: np.dtype, rows: Rows) -> np.ndarray:
    """`values` (float32, finite, within the half type's range) rounded into `half` (float16 or
    bfloat16) with each row's sum of errors brought under about an ulp (module doc)."""
    return with_flips(values, half, flips_keeping_sums(values, half, rows))


def with_flips(values: np.ndarray, half: np.dtype, flipped: np.ndarray) -> np.ndarray:
    """`values` rounded to the nearest `half` value, those at the flat positions `flipped` to
    their other neighbour."""
    chosen = values.astype(half)
    exact = values.reshape(-1)[flipped]
    nearest = chosen.reshape(-1)[flipped]
    chosen.reshape(-1)[flipped] = other_neighbour(exact, nearest, nearest.astype(np.float32) - exact)
    return chosen


def flips_keeping_sums(values: np.ndarray, half: np.dtype, rows: Rows) -> np.ndarray:
    """Where `values` (as in rounded_keeping_sums) go to their other half neighbour instead of
    the nearest one: their flat positions (uint32 where they fit: a few percent of the elements,
    kept for every weight through the stage)."""
    matrix = rows.matrix(values)
    step = max(1, ROWS_AT_ONCE // max(1, matrix.shape[1]))

    def flipped_in(start: int) -> np.ndarray:  # flat positions in the matrix's layout
        exact = np.ascontiguousarray(matrix[start : start + step], dtype=np.float32)
        return np.flatnonzero(_cheapest_flips(exact, exact.astype(half))) + start * matrix.shape[1]

    starts = range(0, matrix.shape[0], step)
    workers = min(WORKERS, os.cpu_count() or 1, len(starts))
    if workers == 1:  # most weights are one block
        in_matrix = [flipped_in(start) for start in starts]
    else:  # numpy's work on each block leaves the GIL: blocks side by side (each holds some 130 MB)
        with ThreadPoolExecutor(workers) as pool:
            in_matrix = list(pool.map(flipped_in, starts))
    positions = rows.original_positions(np.concatenate(in_matrix), values.shape)
    return positions.astype(np.uint32) if values.size <= np.iinfo(np.uint32).max else positions


def _cheapest_flips(exact: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """In each row of `chosen` (the nearest half values of `exact`), the elements whose other
    neighbour moves the row's sum of errors toward zero, cheapest first, each taken where it
    brings the sum nearer zero: a boolean array. A half value less a float32 value within an
    ulp of it is exact in float32 (both are multiples of the smaller one's float32 ulp, and the
    difference needs at most 14 bits), so the errors are computed in float32."""
    rounded = chosen.astype(np.float32)
    error = rounded - exact
    remaining = error.sum(axis=1, dtype=np.float64)
    # the cost |other - exact| - |chosen - exact| = step - 2 |error| where the error has the sum's
    # sign (infinite elsewhere), the step taken as an ulp of chosen's binade (half that below a
    # power of two): an estimate to pick the candidates by, their exact cost computed below
    signed = error * np.sign(remaining).astype(np.float32)[:, None]
    wrong_sign = signed <= 0
    estimate = _ulp(rounded, chosen.dtype)
    signed *= 2
    estimate -= signed
    estimate[wrong_sign] = np.inf
    width = estimate.shape[1]
    wanted = min(width, CANDIDATES_PER_SQRT * int(np.ceil(np.sqrt(width))) + 16)
    if wanted < width:
        candidates = np.argpartition(estimate, wanted - 1, axis=1)[:, :wanted]
    else:
        candidates = np.broadcast_to(np.arange(width), estimate.shape)
    rows = np.arange(chosen.shape[0])[:, None]
    near, far, kept_error = exact[rows, candidates], chosen[rows, candidates], error[rows, candidates]
    other = other_neighbour(near, far, kept_error)
    step = other.astype(np.float64) - far.astype(np.float64)
    usable = (kept_error * remaining[:, None] > 0) & np.isfinite(step)
    cost = np.where(usable, np.abs(step) - 2 * np.abs(kept_error), np.inf)
    order = np.argsort(cost, axis=1)
    candidates, step, cost = (np.take_along_axis(a, order, 1) for a in (candidates, step, cost))
    remaining = np.abs(remaining)
    taken = np.zeros(candidates.shape, dtype=bool)
    for column in range(candidates.shape[1]):  # greedy along each row's candidates, cheapest first
        move = np.abs(step[:, column])
        taken[:, column] = np.isfinite(cost[:, column]) & (move < 2 * remaining)
        remaining -= np.where(taken[:, column], move, 0.0)
    flipped = np.zeros(chosen.shape, dtype=bool)
    flipped[np.broadcast_to(rows, taken.shape)[taken], candidates[taken]] = True
    return flipped


def _ulp(rounded: np.ndarray, half: np.dtype) -> np.ndarray:
    """The spacing of the 16-bit type `half` at `rounded` (its values, as float32): the float32
    exponent's power of two (the mantissa bits cleared) over 2^10 (float16) or 2^7 (bfloat16),
    at least the subnormals' spacing."""
    mantissa_bits, smallest = (10, 2.0**-24) if half == np.float16 else (7, 2.0**-133)
    power = (rounded.view(np.uint32) & np.uint32(0x7F800000)).view(np.float32)
    power *= np.float32(2.0**-mantissa_bits)
    return np.maximum(power, np.float32(smallest), out=power)


def other_neighbour(exact: np.ndarray, chosen: np.ndarray, error: np.ndarray) -> np.ndarray:
    """The half value on the far side of `exact` from `chosen`, on the bits of the 16-bit type
    (sign bit and magnitude): one step smaller in magnitude where `chosen` was rounded away from
    zero, one larger (with `exact`'s sign, for a zero) where it was rounded toward it."""
    bits = chosen.view(np.uint16)
    magnitude = bits & np.uint16(0x7FFF)
    away = (error > 0) == (exact > 0)
    moved = np.where(away, magnitude - np.uint16(1), magnitude + np.uint16(1)).astype(np.uint16)
    sign = np.where(exact < 0, np.uint16(0x8000), np.uint16(0))
    return (moved | sign).view(chosen.dtype)
