"""Resize in float64: ONNX's reference kernel, except where it disagrees with ONNX Runtime and
torch about align_corners.

align_corners maps an output index i to i * (n_in - 1) / (n_out - 1) of the input, a ratio of
lengths. Given scales rather than sizes, ONNX's reference kernel takes n_out unrounded
(n_in * scale: 2.4 for 4 * 0.6) where ONNX Runtime and torch take the output's actual length
floor(n_in * scale): downsampling [1, 2, 3, 4] by 0.6 gave 3.14 for 4. A model exported from
torch means torch's value, so here the scales become the sizes they give. Every other mode
maps through the scale itself, where the three agree.

Opset 10's Resize takes (X, scales) and maps coordinates as Upsample does (asymmetric, nearest by
floor); the reference kernel read its scales as the roi and refused to run.
"""

from __future__ import annotations

import math

import numpy as np
from onnx.reference.ops.op_resize import Resize as ReferenceResize

from .geometry import attribute_text


class Resize(ReferenceResize):
    def _run(self, X, roi=None, scales=None, sizes=None, **attributes):
        if int(self.run_params.get("opsets", {}).get("", 11) or 11) < 11:
            # opset 10: Resize(X, scales), Upsample's arithmetic (x / scale, nearest by floor)
            scales, roi = roi, None
            attributes.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        mode = attribute_text(attributes.get("coordinate_transformation_mode"))
        if mode == "align_corners" and scales is not None and len(scales) and (sizes is None or not len(sizes)):
            axes = attributes.get("axes") or range(X.ndim)
            sizes = np.array([math.floor(X.shape[a] * float(s)) for a, s in zip(axes, scales)], np.int64)
            scales = None
        return super()._run(X, roi, scales, sizes, **attributes)
