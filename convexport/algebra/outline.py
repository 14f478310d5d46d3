"""The shape of the conv compose.py would build for second(first(x)), from the two ONNX
convs' grouped weights and geometry, without building it: what the cost model needs to refuse
a composite that would be slower. (An Xception depthwise 3x3 then a 2048 -> 2048 pointwise
conv composes to a dense [2048, 2048, 3, 3] kernel, seconds and a gigabyte to build, for a
rewrite that costs nine times the FLOPs and is refused.)

The composite's entry K[o, c, r] is the sum of W2[o, m, u] * W1[m, c, t] over the middle
channels m and the tap pairs (u, t) that land on r (compose.py); call it structurally nonzero
when one of those products is. conv_to_onnx emits the largest group count and the fewest taps
that the nonzeros allow, so on the structural nonzeros the outline is exactly the conv it
emits unless products cancel to 0.0, where it emits a smaller one. Work: O(O*M*C/g1) for the
channel links, O(M*(k1 + k2)) for the taps, against O(O*M*C*k1*k2) for the composite itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .compose import active_pairs, compose_axis
from .groups import largest_group_count
from .spec import AxisGeometry, ConvSpec
from .taps import normalize_taps


@dataclass(frozen=True)
class Outline:
    """The composite conv's ONNX weight shape [O, I/group, *kernel_shape] and group count."""

    out_channels: int
    in_channels: int
    group: int
    kernel_shape: tuple[int, ...]

    @property
    def weight_shape(self) -> tuple[int, ...]:
        return (self.out_channels, self.in_channels // self.group, *self.kernel_shape)


def composite_outline(
    first_weight: np.ndarray,
    first_group: int,
    first_axes: Sequence[AxisGeometry],
    second_weight: np.ndarray,
    second_group: int,
    second_axes: Sequence[AxisGeometry],
) -> Outline:
    """W1 [M, C/g1, *k1] (group g1) then W2 [O, M/g2, *k2] (group g2) -> the Outline of the
    composite conv on structural nonzeros (module doc)."""
    first_weight, second_weight = np.asarray(first_weight), np.asarray(second_weight)
    middle = first_weight.shape[0]
    if second_weight.shape[1] * second_group != middle:
        raise ValueError(
            f"cannot chain a conv with {middle} outputs into a conv with {second_weight.shape[1] * second_group} inputs"
        )
    links = _composite_links(first_weight, first_group, second_weight, second_group)  # [O, C]
    group = largest_group_count(links[:, :, None])
    axes = [compose_axis(f, s) for f, s in zip(first_axes, second_axes)]
    taps = np.zeros([axis.geometry.kernel for axis in axes], dtype=np.float64)
    for pair in np.argwhere(active_pairs(first_weight, second_weight, second_group)):
        u, t = pair[: len(axes)], pair[len(axes) :]
        taps[tuple(int(ui) * axis.step_second + int(ti) * axis.step_first for ui, ti, axis in zip(u, t, axes))] = 1.0
    shape = ConvSpec(
        taps[None, None],
        np.zeros(1),
        False,
        tuple(a.geometry.stride for a in axes),
        tuple(a.geometry.dilation for a in axes),
        tuple(a.geometry.pad_begin for a in axes),
        tuple(a.geometry.pad_end for a in axes),
    )
    return Outline(links.shape[0], links.shape[1], group, normalize_taps(shape).kernel_shape)


def _reads(weight: np.ndarray) -> np.ndarray:
    """[out, in/g] bool: whether an output channel reads an input channel of its group at some tap."""
    return np.any(weight.reshape(weight.shape[0], weight.shape[1], -1) != 0, axis=2)


def _composite_links(first_weight, first_group, second_weight, second_group) -> np.ndarray:
    """[O, C] bool: whether output o reads input c through some middle channel. W2's links
    are expanded to [O, M]; W1's stay in their g1 diagonal blocks [M/g1, C/g1], so the
    product is g1 block products. When every output reads every middle channel (a dense
    second conv, the usual case), o reads c exactly when some middle channel does: O(M*C/g1)."""
    second_reads, first = _reads(second_weight), _reads(first_weight).astype(np.float32)  # [O, M/g2], [M, C/g1]
    middle = first.shape[0]
    if second_group == 1 and second_reads.all():
        read_at_all = first.reshape(first_group, middle // first_group, -1).any(axis=1).reshape(-1)  # [C]
        return np.broadcast_to(read_at_all, (second_reads.shape[0], read_at_all.size))
    second = _dense_links(second_reads, second_group).astype(np.float32)  # [O, M]
    out_channels = second.shape[0]
    blocks = second.reshape(out_channels, first_group, middle // first_group).transpose(1, 0, 2)
    products = blocks @ first.reshape(first_group, middle // first_group, -1)  # [g1, O, C/g1]
    return products.transpose(1, 0, 2).reshape(out_channels, -1) > 0


def _dense_links(reads: np.ndarray, group: int) -> np.ndarray:
    """[out, in/g] group-local links -> [out, in] (zero outside the diagonal blocks)."""
    out_channels, per_group = reads.shape
    rows = out_channels // group
    dense = np.zeros((group, rows, group, per_group), dtype=bool)
    index = np.arange(group)
    dense[index, :, index, :] = reads.reshape(group, rows, per_group)
    return dense.reshape(out_channels, group * per_group)
