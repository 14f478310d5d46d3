"""Stage 6: the original and the optimized graph profiled side by side on the device, and the
speedup judged against the timings' noise."""

from __future__ import annotations

import math
from collections.abc import Callable

import onnx

from ..profile import profile_models
from ..report_types import OptimizeReport
from ..runtime import MissingKernel
from .inputs import RunInputs
from .report import REGRESSION_RATIO
from .request import Request


def profiled(
    original: onnx.ModelProto,
    optimized: onnx.ModelProto,
    inputs: RunInputs,
    request: Request,
    report: OptimizeReport,
    after_timing: Callable[[object], None] | None = None,
) -> None:
    """report["profile"], or report["profile_skipped"] where the device has no kernel for a
    graph. `after_timing` is handed the optimized graph's session once it is timed (TF32's
    effect is read on it: stages/check.py)."""
    device = request.device
    say = request.steps.start
    say(f"profiling on {device}")
    try:
        measured = profile_models(
            {"before": original, "after": optimized},
            inputs.specs,
            device,
            feeds=inputs.real_data[0] if inputs.made_up_runs == 0 else None,
            per_op=request.options.per_op,
            progress=lambda done, total: say(f"profiling on {device}", f"{done}/{total} runs"),
            after_timing={"after": after_timing} if after_timing else None,
        )
    except MissingKernel as exc:
        report["profile_skipped"] = str(exc)
        return
    if measured:
        report["profile"] = judged_profile(measured, unchanged=optimized is original)


def judged_profile(measured: dict, unchanged: bool) -> dict:
    """The profile with its speedup, the noise of that ratio and a verdict a person can read.
    `noise` is the half-width of a 95% interval of the ratio of the two medians: each median's
    relative standard error is 1.253 * sigma / sqrt(runs) / median, sigma read from the
    interquartile range (IQR / 1.349, robust to the odd slow run). A speedup within it is "no
    measurable change" (never shown as a slowdown), as is an unchanged graph."""
    before, after = measured["before"]["latency_ms"], measured["after"]["latency_ms"]
    speedup = before["median"] / after["median"] if after["median"] > 0 else None
    runs = max(int(measured.get("runs") or 1), 1)

    def relative_error(latency: dict) -> float:
        spread = latency.get("p75", latency["p90"]) - latency.get("p25", latency["p10"])
        return 1.253 * spread / 1.349 / math.sqrt(runs) / latency["median"] if latency["median"] > 0 else 0.0

    noise = 1.96 * math.hypot(relative_error(before), relative_error(after))
    if unchanged:
        verdict = "unchanged graph"
    elif speedup is None or abs(speedup - 1) <= noise:
        verdict = "no measurable change"
    else:
        verdict = "faster" if speedup > 1 else "slower"
    profile = {**measured, "speedup": speedup, "noise": noise, "verdict": verdict}
    peak_before, peak_after = measured["before"].get("peak_memory_bytes"), measured["after"].get("peak_memory_bytes")
    if peak_before and peak_after:
        profile["memory_ratio"] = peak_after / peak_before
        profile["memory_regression"] = peak_after > REGRESSION_RATIO * peak_before
    return profile
