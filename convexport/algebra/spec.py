"""The normal form every fold works on: one Conv as a ConvSpec, and the Refusal a fold raises
when its result would not be exact.

Per spatial axis a conv reads `x[s*i - a + d*t]` for t in [0, k), with begin pad a and end pad
e; x is zero outside [0, L). AxisGeometry holds those five numbers for one axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


class Refusal(Exception):  # noqa: N818 (a verdict, not an error: the rewrite stage's one "no")
    """Every "no" of the rewrite stage, with its reason: a fold whose result would not be
    exact, a condition that fails, a rewrite that a cost or measure decision declined (with
    its numbers in `decision`), or, not `reported`, a match that is simply not a case for the
    primitive (a full-rank kernel for a low-rank split): the report's `skipped` lists only the
    reported ones.

    The one way a primitive, and the algebra and helpers under it, say no: they raise it (the
    engine catches it; any other exception is a bug). The engine passes it on as a value."""

    def __init__(self, reason: str, decision: dict | None = None, reported: bool = True):
        super().__init__(reason)
        self.reason, self.decision, self.reported = reason, decision, reported

    def __eq__(self, other) -> bool:
        return isinstance(other, Refusal) and (self.reason, self.reported) == (other.reason, other.reported)

    def __hash__(self) -> int:
        return hash((self.reason, self.reported))

    def __repr__(self) -> str:
        return f"Refusal({self.reason!r}{'' if self.reported else ', reported=False'})"


@dataclass(frozen=True)
class AxisGeometry:
    """One spatial axis of a conv: output i reads input `stride*i - pad_begin + dilation*t`."""

    kernel: int
    stride: int
    dilation: int
    pad_begin: int
    pad_end: int

    @property
    def span(self) -> int:
        """Input positions one output covers: d*(k-1) + 1."""
        return self.dilation * (self.kernel - 1) + 1

    @property
    def length_offset(self) -> int:
        """c in `out = floor((L + c) / s) + 1`: a + e - span."""
        return self.pad_begin + self.pad_end - self.span

    def output_length(self, length: int) -> int:
        """floor((L + a + e - d*(k-1) - 1) / s) + 1; below 1 when the conv does not fit."""
        return (length + self.length_offset) // self.stride + 1

    def min_input_length(self) -> int:
        """The smallest L >= 1 with an output length of at least 1."""
        return max(1, self.span - self.pad_begin - self.pad_end)


def int_tuple(name: str, values: Sequence[int], nd: int, minimum: int) -> tuple[int, ...]:
    result = tuple(int(v) for v in values)
    if len(result) != nd or any(v < minimum for v in result):
        raise ValueError(f"{name} must be {nd} integers >= {minimum}, got {tuple(values)}")
    return result


@dataclass(frozen=True, eq=False, repr=False)
class ConvSpec:
    """One ONNX Conv in normal form: dense kernel, explicit pads.

    weight [O, I, *k] is dense (groups expanded to a block-diagonal kernel) and bias [O];
    both are stored as read-only float64 copies. has_bias records whether the Conv had a bias
    input, so that conv_to_onnx can leave out an all-zero bias the original never had.
    """

    weight: np.ndarray
    bias: np.ndarray
    has_bias: bool
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]

    def __post_init__(self):
        weight = np.array(self.weight, dtype=np.float64)
        if weight.ndim < 3:
            raise ValueError(f"a conv weight is [O, I, *k] with at least one spatial axis, got shape {weight.shape}")
        bias = np.array(self.bias, dtype=np.float64)
        if bias.shape != weight.shape[:1]:
            raise ValueError(f"bias shape {bias.shape} does not match {weight.shape[0]} output channels")
        weight.flags.writeable = False
        bias.flags.writeable = False
        nd = weight.ndim - 2
        object.__setattr__(self, "weight", weight)
        object.__setattr__(self, "bias", bias)
        object.__setattr__(self, "has_bias", bool(self.has_bias))
        object.__setattr__(self, "strides", int_tuple("strides", self.strides, nd, 1))
        object.__setattr__(self, "dilations", int_tuple("dilations", self.dilations, nd, 1))
        object.__setattr__(self, "pads_begin", int_tuple("pads_begin", self.pads_begin, nd, 0))
        object.__setattr__(self, "pads_end", int_tuple("pads_end", self.pads_end, nd, 0))

    def __repr__(self) -> str:
        return (
            f"ConvSpec({self.out_channels}x{self.in_channels}, kernel={self.kernel_shape}, strides={self.strides}, "
            f"dilations={self.dilations}, pads={self.pads_begin}+{self.pads_end}, has_bias={self.has_bias})"
        )

    @property
    def nd(self) -> int:
        return self.weight.ndim - 2

    @property
    def out_channels(self) -> int:
        return self.weight.shape[0]

    @property
    def in_channels(self) -> int:
        return self.weight.shape[1]

    @property
    def kernel_shape(self) -> tuple[int, ...]:
        return tuple(self.weight.shape[2:])

    def axis(self, index: int) -> AxisGeometry:
        """The geometry of spatial axis `index`."""
        return AxisGeometry(
            self.kernel_shape[index],
            self.strides[index],
            self.dilations[index],
            self.pads_begin[index],
            self.pads_end[index],
        )

    def axes(self) -> tuple[AxisGeometry, ...]:
        return tuple(self.axis(i) for i in range(self.nd))

    def output_shape(self, spatial: Sequence[int]) -> tuple[int, ...]:
        """The output's spatial shape for an input of spatial shape `spatial` (floor formula).
        An empty output (a window longer than its padded input, as ONNX allows) is refused,
        not reported: there is nothing to fold."""
        if len(spatial) != self.nd:
            raise ValueError(f"{self.nd}-D conv given a {len(spatial)}-D spatial shape {tuple(spatial)}")
        shape = tuple(axis.output_length(int(length)) for axis, length in zip(self.axes(), spatial))
        if any(n < 1 for n in shape):
            raise Refusal(f"the conv's output is empty for input spatial shape {tuple(spatial)}", reported=False)
        return shape


def known(lengths: Sequence[int | None]) -> tuple[int, ...] | None:
    """The lengths where every one is known, else None."""
    given = tuple(int(length) for length in lengths if length is not None)
    return given if len(given) == len(lengths) else None


def spatial_lengths(input_spatial: Sequence[int | None] | None, nd: int) -> tuple[int | None, ...]:
    """The input's spatial lengths, one per axis, None where unknown."""
    if input_spatial is None:
        return (None,) * nd
    if len(input_spatial) != nd:
        raise ValueError(f"{nd}-D conv given a {len(input_spatial)}-D input spatial shape {tuple(input_spatial)}")
    return tuple(None if length is None else int(length) for length in input_spatial)
