"""What a float type's rounding is, and the scale errors are measured against."""

from __future__ import annotations

import numpy as np

UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8, "float64": 2.0**-53}


def dtype_name(array: np.ndarray) -> str:
    """An array's float type by name, bfloat16 (numpy's 'V2') included."""
    return "bfloat16" if array.dtype.name == "bfloat16" else str(array.dtype)


def rms(values: np.ndarray) -> float:
    """The root mean square of finite values (0 for none), without overflow: a square of over
    1e154 is inf in float64, so the values are scaled by the largest first."""
    largest = float(np.abs(values).max(initial=0.0))
    if largest == 0.0:
        return 0.0
    return largest * float(np.sqrt(np.mean(np.square(values / largest))))
