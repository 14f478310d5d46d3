"""Latency of ONNX models on ONNX Runtime: warm-up, then timed runs, median and p90.

When both models of an `optimize` run are profiled, their runs are interleaved (A, B, A, B,
...) so that machine noise hits both alike.
"""

from __future__ import annotations

import time

import numpy as np
import onnx

from .inputs import InputSpec, random_inputs
from .runtime import CPU, CUDA, create_session

DEFAULT_RUNS = 20
DEFAULT_WARMUP = 3


def profile_models(models: dict[str, onnx.ModelProto], inputs: list[InputSpec], device: str,
                   runs: int = DEFAULT_RUNS, warmup: int = DEFAULT_WARMUP) -> dict:
    """Latency statistics per model label, measured interleaved on one device."""
    sessions = {label: create_session(model, device) for label, model in models.items()}
    feeds = random_inputs(inputs, seed=0)
    names = {label: [o.name for o in session.get_outputs()] for label, session in sessions.items()}
    for _ in range(warmup):
        for label, session in sessions.items():
            session.run(names[label], feeds)
    times: dict[str, list[float]] = {label: [] for label in sessions}
    for _ in range(runs):
        for label, session in sessions.items():
            start = time.perf_counter()
            session.run(names[label], feeds)
            times[label].append((time.perf_counter() - start) * 1e3)
    result = {"device": device, "provider": CUDA if device == "cuda" else CPU, "runs": runs, "warmup": warmup}
    for label, samples in times.items():
        result[label] = {"latency_ms": _latency(samples)}
    return result


def _latency(samples: list[float]) -> dict:
    values = np.asarray(samples)
    return {
        "median": float(np.median(values)), "p90": float(np.percentile(values, 90)),
        "min": float(values.min()), "mean": float(values.mean()),
    }
