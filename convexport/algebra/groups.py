"""Grouped <-> dense kernels: ONNX's `group` as a block-diagonal dense kernel and back."""

from __future__ import annotations

import math

import numpy as np


def expand_groups(weight: np.ndarray, group: int) -> np.ndarray:
    """The dense kernel of a grouped one.

    weight [O, I/g, *k] -> dense [O, I, *k] with dense[o, c] = weight[o, c - g_o*I/g] when c
    lies in o's group g_o (o in [g_o*O/g, (g_o+1)*O/g)), and 0 otherwise.
    """
    weight = np.asarray(weight, dtype=np.float64)
    if group < 1 or weight.ndim < 3 or weight.shape[0] % group:
        raise ValueError(f"group={group} does not divide the {weight.shape[0]} output channels of {weight.shape}")
    out_per_group, in_per_group = weight.shape[0] // group, weight.shape[1]
    dense = np.zeros((weight.shape[0], in_per_group * group, *weight.shape[2:]))
    for g in range(group):
        rows = slice(g * out_per_group, (g + 1) * out_per_group)
        dense[rows, g * in_per_group : (g + 1) * in_per_group] = weight[rows]
    return dense


def largest_group_count(weight: np.ndarray) -> int:
    """The largest g for which dense weight [O, I, *k] is zero outside g diagonal blocks of
    [O/g, I/g]: every row o's nonzero input channels lie in block o // (O/g). One pass over
    the weight finds each row's first and last nonzero column; each g is then checked in O(O)."""
    weight = np.asarray(weight)
    out_channels, in_channels = weight.shape[:2]
    nonzero = np.any(weight.reshape(out_channels, in_channels, -1) != 0, axis=2)  # [O, I]
    used = nonzero.any(axis=1)
    first = nonzero.argmax(axis=1)
    last = in_channels - 1 - nonzero[:, ::-1].argmax(axis=1)
    common = math.gcd(out_channels, in_channels)
    for group in sorted((d for d in range(1, common + 1) if common % d == 0), reverse=True):
        begin = np.arange(out_channels) // (out_channels // group) * (in_channels // group)
        if np.all(~used | ((first >= begin) & (last < begin + in_channels // group))):
            return group
    return 1


def grouped_weight(dense: np.ndarray, group: int) -> np.ndarray:
    """The ONNX weight of a block-diagonal dense kernel.

    dense [O, I, *k] -> [O, I/g, *k], row block g_o keeping its own column block
    dense[g_o*O/g:(g_o+1)*O/g, g_o*I/g:(g_o+1)*I/g]. The caller guarantees block-diagonality.
    """
    out_per_group, in_per_group = dense.shape[0] // group, dense.shape[1] // group
    return np.concatenate(
        [
            dense[g * out_per_group : (g + 1) * out_per_group, g * in_per_group : (g + 1) * in_per_group]
            for g in range(group)
        ],
        axis=0,
    )
