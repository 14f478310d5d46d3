"""How fast and how big ONNX models run on ONNX Runtime: latency, throughput, peak memory and
time per op type, on the CUDA provider (IO binding, device memory) or the CPU provider.

Latency: warm-up, then timed runs. When several models are profiled (before/after) they take
turns in blocks of up to BLOCK runs (A x10, B x10, A x10, ...), and in at least ALTERNATIONS
blocks each (a slow model timed 10 times goes A x2, B x2, ...), so machine noise (a machine slowing down
for a few seconds) hits them alike instead of the one model timed during it. The first run of
each block is not counted: ORT's worker threads spin for a while after a run, and one
session's spinning threads would slow the other's next run if they alternated run by run
(bench/RESULTS.md, "Measurements behind the code"). Per-op time comes
from ORT's own profiler in a separate session. Peak memory is measured in a process of its
own per model (peak_memory.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import onnx

from . import ir
from .errors import ConvexportError
from .inputs import DEFAULT_DYNAMIC_SIZE, InputSpec, dynamic_dims_note, random_inputs
from .ir import needs_external_data, save_with_external_data
from .runtime import CPU, CUDA, checked_run, create_session, registered_custom_op_libraries

DEFAULT_RUNS = None  # chosen so that each model is timed for about TIME_BUDGET_S
TIME_BUDGET_S = 2.0
MIN_RUNS, MAX_RUNS = 5, 200  # a model slower than TIME_BUDGET_S / MIN_RUNS runs MIN_RUNS times
BLOCK = 10
ALTERNATIONS = 5
DEFAULT_WARMUP = 3
PER_OP_RUNS = 10  # at most: about PER_OP_BUDGET_S worth
PER_OP_BUDGET_S = 1.0
MEMORY_RUNS = 2  # the arena grows on the first run; a second shows it stays
SETTLE_BELOW_S = 0.05  # a run this short can be slowed by the other session's spinning threads
PEAK_MEMORY_TIMEOUT_S = 600


def profile_models(
    models: dict[str, onnx.ModelProto],
    inputs: list[InputSpec],
    device: str,
    runs: int | None = DEFAULT_RUNS,
    warmup: int = DEFAULT_WARMUP,
    memory: bool = True,
    per_op: bool = True,
    progress: Callable[[int, int], None] | None = None,
    feeds: dict | None = None,
) -> dict:
    """Per model label: latency_ms, throughput, peak_memory_bytes, op_time_ms; measured on one
    device, on `feeds` (random inputs made to `inputs` when None). `progress(done, total)` is
    told the timed runs made so far."""
    feeds = random_inputs(inputs, seed=0) if feeds is None else feeds
    batch = next((int(v.shape[0]) for v in feeds.values() if v.ndim), 1)
    hint = dynamic_dims_note(inputs, f"made {DEFAULT_DYNAMIC_SIZE}")
    latencies, runs = _block_latency(models, feeds, device, runs, warmup, hint=hint, progress=progress)
    result = {
        "device": device,
        "provider": CUDA if device == "cuda" else CPU,
        "runs": runs,
        "warmup": warmup,
        "batch": batch,
    }
    for label, model in models.items():
        latency = _latency(latencies[label])
        entry = {
            "latency_ms": latency,
            "throughput_per_s": batch * 1e3 / latency["median"] if latency["median"] else None,
        }
        if memory:
            entry.update(_peak_memory(model, feeds, device, MEMORY_RUNS))
        if per_op:
            per_op_runs = int(min(PER_OP_RUNS, max(1, PER_OP_BUDGET_S * 1e3 / max(latency["median"], 1e-3))))
            entry["op_time_ms"] = _op_times(model, feeds, device, per_op_runs)
        result[label] = entry
    return result


def time_models(models: dict[str, onnx.ModelProto], feeds: dict, device: str, budget_s: float) -> dict:
    """Median milliseconds per model label, timed side by side (block-interleaved) for about
    `budget_s` each, and the number of runs."""
    latencies, runs = _block_latency(models, feeds, device, None, DEFAULT_WARMUP, budget_s)
    return {"runs": runs, **{label: float(np.median(samples)) for label, samples in latencies.items()}}


def _block_latency(
    models, feeds, device, runs, warmup, budget_s=TIME_BUDGET_S, hint: str = "", progress=None
) -> tuple[dict[str, list[float]], int]:
    named = {label: f"the model profiled as {label!r}" for label in models}  # in load and run failures
    runners = {
        label: session_runner(create_session(model, device, what=named[label]), feeds, device)
        for label, model in models.items()
    }
    slowest = 0.0
    for label, run in runners.items():
        for index in range(max(warmup, 1)):  # a model that cannot run on `feeds` fails here, in one line
            start = time.perf_counter()
            checked_run(run, feeds, named[label], hint)
            slowest = max(slowest, time.perf_counter() - start)
            if index and slowest * (index + 1) > budget_s:  # warm by now: no more of the budget on it
                break
    if runs is None:
        runs = int(min(MAX_RUNS, max(MIN_RUNS, budget_s / max(slowest, 1e-6))))
    times: dict[str, list[float]] = {label: [] for label in runners}
    block = max(1, min(BLOCK, runs // ALTERNATIONS))
    total = runs * len(runners)
    while any(len(samples) < runs for samples in times.values()):
        for label, run in runners.items():
            if slowest < SETTLE_BELOW_S:
                run()  # let the other session's threads settle
            for _ in range(min(block, runs - len(times[label]))):
                start = time.perf_counter()
                run()
                times[label].append((time.perf_counter() - start) * 1e3)
            if progress is not None:
                progress(sum(map(len, times.values())), total)
    return times, runs


def session_runner(session, feeds, device):
    """A no-argument callable running the session once; on CUDA the inputs stay on the device
    and the outputs are allocated there (IO binding), so no host copies are timed."""
    names = [output.name for output in session.get_outputs()]
    if device != "cuda":
        return lambda: session.run(names, feeds)
    import onnxruntime as ort

    binding = session.io_binding()
    for name, value in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
    for name in names:
        binding.bind_output(name, "cuda", 0)

    def run():
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()

    return run


def _latency(samples: list[float]) -> dict:
    values = np.asarray(samples)
    return {
        "median": float(np.median(values)),
        "p10": float(np.percentile(values, 10)),
        "p25": float(np.percentile(values, 25)),
        "p75": float(np.percentile(values, 75)),
        "p90": float(np.percentile(values, 90)),
        "min": float(values.min()),
        "mean": float(values.mean()),
    }


def _op_times(model: onnx.ModelProto, feeds, device, runs: int) -> dict[str, float]:
    """Milliseconds per run spent in each op type, from ORT's profiler (largest first)."""
    with tempfile.TemporaryDirectory() as folder:
        session = create_session(model, device, profile_path=os.path.join(folder, "ort"))
        run = session_runner(session, feeds, device)
        run()  # the first run includes one-off work
        for _ in range(runs):
            run()
        with open(session.end_profiling(), encoding="utf-8") as stream:
            events = json.load(stream)
    # A Scan, Loop or If node's time includes its body's nodes, which ORT reports as well: only
    # the main graph's nodes count (by name), else the body's time would be counted twice.
    main = {node.name for node in model.graph.node} if any(ir.proto_subgraphs(n) for n in model.graph.node) else None
    totals: dict[str, float] = defaultdict(float)
    for event in events:
        name = event.get("name", "")
        is_kernel = event.get("cat") == "Node" and name.endswith("_kernel_time")
        if is_kernel and (main is None or name[: -len("_kernel_time")] in main):
            totals[event["args"]["op_name"]] += event["dur"] / 1e3
    return {op: total / (runs + 1) for op, total in sorted(totals.items(), key=lambda item: -item[1])}


def _peak_memory(model: onnx.ModelProto, feeds, device, runs: int) -> dict:
    """Measured in a fresh Python process (peak_memory.py), so that nothing of this one is
    counted; a process of its own rather than multiprocessing's spawn, which re-runs the
    caller's script (a script without an `if __name__ == "__main__":` guard would start over)."""
    with tempfile.TemporaryDirectory() as folder:
        model_path, feeds_path = os.path.join(folder, "model.onnx"), os.path.join(folder, "feeds.npz")
        if needs_external_data(model):
            save_with_external_data(model, model_path, "model.onnx.data")
        else:
            onnx.save(model, model_path)
        np.savez(feeds_path, **feeds)
        command = [sys.executable, "-m", "convexport.peak_memory", model_path, feeds_path, device, str(runs)]
        command += registered_custom_op_libraries()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=PEAK_MEMORY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ConvexportError(f"measuring peak memory took over {PEAK_MEMORY_TIMEOUT_S} s") from None
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise ConvexportError(f"measuring peak memory failed: {reason}")
        return json.loads(done.stdout)
