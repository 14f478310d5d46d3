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
        dense[rows, g * in_per_group:(g + 1) * in_per_group] = weight[rows]
    return dense


def is_block_diagonal(weight: np.ndarray, group: int) -> bool:
    """Whether dense weight [O, I, *k] is zero outside `group` diagonal blocks of [O/g, I/g]."""
    out_channels, in_channels = weight.shape[:2]
    if out_channels % group or in_channels % group:
        return False
    blocks = np.abs(weight).reshape(group, out_channels // group, group, in_channels // group, -1).sum(axis=(1, 3, 4))
    return not np.any(blocks[~np.eye(group, dtype=bool)])


def largest_group_count(weight: np.ndarray) -> int:
    """The largest g for which dense weight [O, I, *k] is block-diagonal with g groups."""
    weight = np.asarray(weight)
    common = math.gcd(weight.shape[0], weight.shape[1])
    divisors = sorted((d for d in range(1, common + 1) if common % d == 0), reverse=True)
    return next(g for g in divisors if is_block_diagonal(weight, g))


def grouped_weight(dense: np.ndarray, group: int) -> np.ndarray:
    """The ONNX weight of a block-diagonal dense kernel.

    dense [O, I, *k] -> [O, I/g, *k], row block g_o keeping its own column block
    dense[g_o*O/g:(g_o+1)*O/g, g_o*I/g:(g_o+1)*I/g]. The caller guarantees block-diagonality.
    """
    out_per_group, in_per_group = dense.shape[0] // group, dense.shape[1] // group
    return np.concatenate([dense[g * out_per_group:(g + 1) * out_per_group, g * in_per_group:(g + 1) * in_per_group]
                           for g in range(group)], axis=0)
