"""erf over a float64 array at numpy's elementwise speed, to 2 ulps of math.erf.

The error function is the sum of its Taylor series about the nearest point c of a grid of step
1/64 on [0, 6] (|t| = |x - c| <= 1/128):

    erf(c + t) = erf(c) + sum_{n>=1} a_n(c) t^n,
    a_n(c) = erf^(n)(c) / n! = (2 / sqrt(pi)) e^(-c^2) (-1)^(n-1) H_(n-1)(c) / n!

(H_k the physicists' Hermite polynomials, H_(k+1) = 2c H_k - 2k H_(k-1)), cut after t^7: the
remainder is at most |t|^8 max|erf^(8)| / 8! < 2e-18, far below an ulp of erf(x) for every x.
The coefficients of each grid point are one table row, made once from math.erf and math.exp;
a value is one row lookup per coefficient and a Horner sum. erf is odd (erf(-x) = -erf(x)),
and erf(x) rounds to 1 in float64 for x >= 6 (erfc(6) = 2e-17 < ulp(1) / 2); NaN stays NaN.
Measured against math.erf over [-7, 7]: at most 2 ulps (tests/test_float64_kernels.py).
"""

from __future__ import annotations

import functools
import math

import numpy as np

GRID = 64  # grid points per unit
DEGREE = 7
SATURATES = 6.0


@functools.cache
def _coefficient_columns() -> tuple[np.ndarray, ...]:
    """Column n holds a_n(c) of every grid point c = k / GRID, k = 0 .. 6 * GRID."""
    rows = []
    for k in range(int(SATURATES * GRID) + 1):
        c = k / GRID
        scale = 2 / math.sqrt(math.pi) * math.exp(-c * c)
        hermite = [1.0, 2 * c]
        while len(hermite) < DEGREE:
            order = len(hermite) - 1
            hermite.append(2 * c * hermite[-1] - 2 * order * hermite[-2])
        rows.append(
            [math.erf(c)] + [scale * (-1) ** (n - 1) * hermite[n - 1] / math.factorial(n) for n in range(1, DEGREE + 1)]
        )
    return tuple(np.ascontiguousarray(column) for column in np.array(rows).T)


def erf(x: np.ndarray) -> np.ndarray:
    """erf of every element of the float64 array `x` (see the module doc)."""
    columns = _coefficient_columns()
    magnitude = np.minimum(np.abs(x), SATURATES)
    nearest = np.rint(magnitude * GRID)
    nan = np.isnan(nearest)
    nearest[nan] = 0
    index = nearest.astype(np.intp)
    t = magnitude - index / GRID
    y = columns[DEGREE].take(index)
    for n in range(DEGREE - 1, -1, -1):
        y *= t
        y += columns[n].take(index)
    y[magnitude >= SATURATES] = 1.0
    y[nan] = np.nan
    return np.copysign(y, x)
