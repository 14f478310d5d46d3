"""A weight rounded into the half type so that its rounding errors meet its input as little as
they can: each element to one of its two half neighbours, chosen against the second moments of
what the weight's reader multiplies it by.

A reader sums a row o of the weight W (row_sums.py: a conv's output channel, a Gemm's or
MatMul's output column) against an input vector x of K elements (a conv's patch: its group's
channels times its taps; a MatMul's K), so a rounding error d[o] = fl(W[o]) - W[o] (1 x K) puts
the output off by d[o] x, and over the input's positions and samples

    E[(d[o] x)^2] = d[o] H d[o]^T,    H = E[x x^T]  (K x K, from the exact input values)

Rounding to nearest minimises each |d[o, k]| alone; where x's elements are correlated (a conv's
neighbouring taps on a smooth feature map, channels that move together, any input with a mean:
H then holds m m^T, the case row_sums.py keeps the sums for) the errors can instead be placed
where H is small. Each element keeps to its two neighbours (the nearest half value and the one
on the far side of W[o, k]), so no element is further than an ulp from its value, and they are
chosen greedily, the elements of largest H[k, k] first: with g = (d[o] chosen so far) H, the
element k costs d^2 H[k, k] + 2 d g[k] more for an error d, and the cheaper of its two is taken
(all rows at once). H of the identity gives rounding to nearest; H = m m^T the rows' sums kept.

H comes from the float64 values of the made-up input set the stage measures nodes on, its
correlations shrunk toward none as the vectors it is measured on are few (_shrunk_moments), and
choose.py step 4 keeps this rounding only where the outputs, judged on every input set, are
nearer with it. A weight is rounded so where it has one reader, at input 1 (Conv, Gemm, MatMul
with a 2-D weight), whose data input has a value, within the work allowed (MOMENT_WORK); the
greedy pass brings the pull on the elements still to choose up to date GREEDY_BLOCK at a time.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import onnx

from .row_sums import Rows, other_neighbour

# multiply-adds one weight's greedy pass may cost (rows x K^2), and all of a model's together: a
# weight over the first (a 4096 x 4096 MatMul: 6.9e10) and the weights past the second keep the
# rounding they had
MOMENT_WORK = 1 << 31
MODEL_MOMENT_WORK = 1 << 34
GREEDY_BLOCK = 64  # elements chosen between two updates of the pull on the rest (_greedy_flips)
# the input vectors' elements H is estimated on, at most (K x N, 128 MiB in float64): an even
# subsample of a large feature map's positions
SAMPLED_ELEMENTS = 1 << 24


def input_moments(
    graph: onnx.GraphProto, rows: dict[str, Rows], shapes: dict[str, tuple[int, ...]], values: dict[str, np.ndarray]
) -> dict[str, list[np.ndarray]]:
    """For each weight of `rows` (its Rows, `shapes` its shape) that the module doc rounds by its
    input's second moments: its H, one K x K matrix per group of its rows (a conv's groups, else
    one). `values` holds the exact value of each tensor the graph computes."""
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for position, name in enumerate(node.input):
            if name in rows:
                readers.setdefault(name, []).append((node, position))
    moments: dict[str, list[np.ndarray]] = {}
    spent = 0
    for name, read in readers.items():
        if len(read) != 1 or read[0][1] != 1 or read[0][0].input[0] not in values:
            continue
        node, shape = read[0][0], shapes[name]
        row_count = rows[name].count(shape)
        width = math.prod(shape) // max(row_count, 1)
        work = row_count * width * width
        if work > MOMENT_WORK or spent + work > MODEL_MOMENT_WORK:
            continue
        patches = _patches(node, np.asarray(values[node.input[0]]), shape)
        if patches is None:
            continue
        spent += work
        moments[name] = [_shrunk_moments(sample) for sample in patches]
    return moments


def _shrunk_moments(vectors: np.ndarray) -> np.ndarray:
    """E[x x^T] of the K x N `vectors`, its covariance part shrunk toward its diagonal by
    K / (K + N): H = m m^T + (1 - a) C + a diag(C). N vectors measure K x K correlations only
    where N is well over K (a pooled conv's 3x3 output positions against its 576 weights per
    row: H of nine vectors is their span, and rounding against it fits those nine); the mean
    (what row_sums.py keeps the sums for) is measured well by any N."""
    count = vectors.shape[1]
    mean = vectors.mean(axis=1)
    centred = vectors - mean[:, None]
    covariance = centred @ centred.T / count
    shrink = vectors.shape[0] / (vectors.shape[0] + count)
    shrunk = (1 - shrink) * covariance
    shrunk[np.diag_indices_from(shrunk)] = np.diagonal(covariance)
    return np.outer(mean, mean) + shrunk


def flips_by_moments(values: np.ndarray, half: np.dtype, rows: Rows, moments: list[np.ndarray]) -> np.ndarray:
    """Where `values` (float32, finite, within the half type's range) go to their other half
    neighbour instead of the nearest one, rounded against `moments` (module doc): their flat
    positions."""
    matrix = rows.matrix(values)
    per_group = matrix.shape[0] // len(moments)
    flipped = np.zeros(matrix.shape, dtype=bool)
    for group, second in enumerate(moments):
        block = slice(group * per_group, (group + 1) * per_group)
        flipped[block] = _greedy_flips(np.ascontiguousarray(matrix[block], dtype=np.float32), half, second)
    return rows.original_positions(np.flatnonzero(flipped), values.shape)


def _greedy_flips(exact: np.ndarray, half: np.dtype, second: np.ndarray) -> np.ndarray:
    """Each element of `exact` (rows x K) at the neighbour that costs its row less against
    `second` (K x K), the elements of the largest diagonal first: True where that is the
    other neighbour. The pull of the errors chosen so far on the elements still to choose is
    brought up to date a block of GREEDY_BLOCK elements at a time (one matrix product), within
    the block element by element. (A half value less a float32 value within an ulp of it is
    exact in float32: row_sums._cheapest_flips.)"""
    order = np.argsort(-np.diagonal(second), kind="stable")
    second = second[np.ix_(order, order)]
    exact = exact[:, order]
    nearest = exact.astype(half)
    near_error = nearest.astype(np.float32) - exact
    far_error = other_neighbour(exact, nearest, near_error).astype(np.float32) - exact
    near_error, far_error = near_error.astype(np.float64), far_error.astype(np.float64)
    pull = np.zeros(exact.shape, dtype=np.float64)  # (errors chosen so far) @ second
    chosen = np.zeros(exact.shape, dtype=np.float64)
    flipped = np.zeros(exact.shape, dtype=bool)
    width = exact.shape[1]
    for start in range(0, width, GREEDY_BLOCK):
        block = slice(start, min(start + GREEDY_BLOCK, width))
        local = pull[:, block].copy()  # the pull on the block's elements, kept up to date inside it
        for offset, k in enumerate(range(block.start, block.stop)):
            near, far, diagonal = near_error[:, k], far_error[:, k], second[k, k]
            here = local[:, offset]
            far_cheaper = np.isfinite(far) & (far * (far * diagonal + 2 * here) < near * (near * diagonal + 2 * here))
            flipped[:, k] = far_cheaper
            chosen[:, k] = np.where(far_cheaper, far, near)
            local += np.outer(chosen[:, k], second[k, block])
        pull[:, block.stop :] += chosen[:, block] @ second[block, block.stop :]
    unordered = np.empty_like(flipped)
    unordered[:, order] = flipped
    return unordered


def _patches(node: onnx.NodeProto, data: np.ndarray, shape: tuple[int, ...]) -> list[np.ndarray] | None:
    """What `node` multiplies its weight (input 1, of `shape`) by: per group of its rows, a
    K x N matrix of N input vectors (evenly spaced where SAMPLED_ELEMENTS asks); None where the
    weight is not read as the module doc reads it."""
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Conv" and len(shape) >= 3 and data.ndim == len(shape):
        return _conv_patches(data, shape, attributes)
    if node.op_type in ("Gemm", "MatMul") and len(shape) == 2 and data.ndim >= 2:
        if node.op_type == "Gemm" and attributes.get("transA", 0):
            data = data.T
        return [_sampled(data.reshape(-1, data.shape[-1]).T.astype(np.float64))]
    return None


def _conv_patches(data: np.ndarray, shape: tuple[int, ...], attributes: dict) -> list[np.ndarray] | None:
    """A Conv's input patches (im2col), per group: K = channels per group x taps."""
    if attributes.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
        return None
    spatial = len(shape) - 2
    kernel = shape[2:]
    strides = attributes.get("strides", [1] * spatial)
    dilations = attributes.get("dilations", [1] * spatial)
    pads = attributes.get("pads", [0] * (2 * spatial))
    padded = np.pad(data.astype(np.float64), [(0, 0), (0, 0)] + [(pads[i], pads[i + spatial]) for i in range(spatial)])
    out = [(padded.shape[2 + i] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1 for i in range(spatial)]
    if min(out, default=1) < 1:
        return None
    # every output position's patch, or those of a coarser grid of them where that is too many
    wanted = max(1, SAMPLED_ELEMENTS // (shape[1] * math.prod(kernel) * data.shape[0]))
    coarser = max(1, math.ceil((math.prod(out) / wanted) ** (1 / max(spatial, 1))))
    strides = [stride * coarser for stride in strides]
    out = [(size - 1) // coarser + 1 for size in out]
    taps = []
    for offset in itertools.product(*(range(size) for size in kernel)):
        window = tuple(
            slice(offset[i] * dilations[i], offset[i] * dilations[i] + strides[i] * (out[i] - 1) + 1, strides[i])
            for i in range(spatial)
        )
        taps.append(padded[(slice(None), slice(None), *window)])
    stacked = np.stack(taps, axis=2)  # N, C, taps, out...
    batch, channels = stacked.shape[:2]
    groups = attributes.get("group", 1)
    per_group = channels // groups
    if per_group != shape[1]:
        return None
    stacked = stacked.reshape(batch, channels, len(taps), -1)
    found = []
    for group in range(groups):
        block = stacked[:, group * per_group : (group + 1) * per_group]  # N, C/g, taps, positions
        found.append(block.transpose(1, 2, 0, 3).reshape(per_group * len(taps), -1))
    return found


def _sampled(vectors: np.ndarray) -> np.ndarray:
    """`vectors` (K x N) with at most SAMPLED_ELEMENTS of its elements, its columns evenly spaced."""
    step = max(1, math.ceil(vectors.size / SAMPLED_ELEMENTS))
    return vectors[:, ::step]
