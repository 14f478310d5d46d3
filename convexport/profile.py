"""How fast and how big ONNX models run on ONNX Runtime: latency, throughput, peak memory and
time per op type, on the CUDA provider (IO binding, device memory) or the CPU provider.

Latency: warm-up, then timed runs. When several models are profiled (before/after) they take
turns in blocks of up to BLOCK runs (A x10, B x10, A x10, ...), and in at least ALTERNATIONS
blocks each (a slow model timed 10 times goes A x2, B x2, ...), so machine noise (a machine slowing down
for a few seconds) hits them alike instead of the one model timed during it. The first run of
each block is not counted: ORT's worker threads spin for a while after a run, and one
session's spinning threads would slow the other's next run if they alternated run by run
(bench/RESULTS.md, "Measurements behind the code"). Per-op time comes
from ORT's own profiler in a separate session. Peak memory is measured in a child process
per model: on the CPU, the growth of its peak resident set over what it had before creating
the session (weights, arena, activations); on a GPU, the growth of device memory in use
(NVML), which ORT's arena keeps at its peak.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
import time
from collections import defaultdict

import numpy as np
import onnx

from .inputs import DEFAULT_DYNAMIC_SIZE, InputSpec, dynamic_dims_note, random_inputs
from .ir import needs_external_data, save_with_external_data
from .runtime import CPU, CUDA, checked_run, create_session

DEFAULT_RUNS = None  # chosen so that each model is timed for about TIME_BUDGET_S
TIME_BUDGET_S = 2.0
MIN_RUNS, MAX_RUNS = 10, 200
BLOCK = 10
ALTERNATIONS = 5
DEFAULT_WARMUP = 3
PER_OP_RUNS = 10


def profile_models(
    models: dict[str, onnx.ModelProto],
    inputs: list[InputSpec],
    device: str,
    runs: int | None = DEFAULT_RUNS,
    warmup: int = DEFAULT_WARMUP,
    memory: bool = True,
    per_op: bool = True,
) -> dict:
    """Per model label: latency_ms, throughput, peak_memory_bytes, op_time_ms; measured on one device."""
    feeds = random_inputs(inputs, seed=0)
    batch = next((int(v.shape[0]) for v in feeds.values() if v.ndim), 1)
    hint = dynamic_dims_note(inputs, f"made {DEFAULT_DYNAMIC_SIZE}")
    latencies, runs = _block_latency(models, feeds, device, runs, warmup, hint=hint)
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
            entry.update(_peak_memory(model, feeds, device, 3))
        if per_op:
            entry["op_time_ms"] = _op_times(model, feeds, device)
        result[label] = entry
    return result


def time_models(models: dict[str, onnx.ModelProto], feeds: dict, device: str, budget_s: float) -> dict:
    """Median milliseconds per model label, timed side by side (block-interleaved) for about
    `budget_s` each, and the number of runs."""
    latencies, runs = _block_latency(models, feeds, device, None, DEFAULT_WARMUP, budget_s)
    return {"runs": runs, **{label: float(np.median(samples)) for label, samples in latencies.items()}}


def _block_latency(
    models, feeds, device, runs, warmup, budget_s=TIME_BUDGET_S, hint: str = ""
) -> tuple[dict[str, list[float]], int]:
    named = {label: f"the model profiled as {label!r}" for label in models}  # in load and run failures
    runners = {
        label: _runner(create_session(model, device, what=named[label]), feeds, device)
        for label, model in models.items()
    }
    slowest = 0.0
    for label, run in runners.items():
        for _ in range(max(warmup, 1)):  # a model that cannot run on `feeds` fails here, in one line
            start = time.perf_counter()
            checked_run(run, feeds, named[label], hint)
            slowest = max(slowest, time.perf_counter() - start)
    if runs is None:
        runs = int(min(MAX_RUNS, max(MIN_RUNS, budget_s / max(slowest, 1e-6))))
    times: dict[str, list[float]] = {label: [] for label in runners}
    block = max(1, min(BLOCK, runs // ALTERNATIONS))
    while any(len(samples) < runs for samples in times.values()):
        for label, run in runners.items():
            run()  # let the other session's threads settle
            for _ in range(min(block, runs - len(times[label]))):
                start = time.perf_counter()
                run()
                times[label].append((time.perf_counter() - start) * 1e3)
    return times, runs


def _runner(session, feeds, device):
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
        "p90": float(np.percentile(values, 90)),
        "min": float(values.min()),
        "mean": float(values.mean()),
    }


def _op_times(model: onnx.ModelProto, feeds, device) -> dict[str, float]:
    """Milliseconds per run spent in each op type, from ORT's profiler (largest first)."""
    with tempfile.TemporaryDirectory() as folder:
        session = create_session(model, device, profile_path=os.path.join(folder, "ort"))
        run = _runner(session, feeds, device)
        run()  # the first run includes one-off work
        for _ in range(PER_OP_RUNS):
            run()
        with open(session.end_profiling(), encoding="utf-8") as stream:
            events = json.load(stream)
    totals: dict[str, float] = defaultdict(float)
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            totals[event["args"]["op_name"]] += event["dur"] / 1e3
    return {op: total / (PER_OP_RUNS + 1) for op, total in sorted(totals.items(), key=lambda item: -item[1])}


def _peak_memory(model: onnx.ModelProto, feeds, device, runs: int) -> dict:
    """Measured in a child process (spawned, so nothing of this one is counted)."""
    with tempfile.TemporaryDirectory() as folder:
        model_path, feeds_path = os.path.join(folder, "model.onnx"), os.path.join(folder, "feeds.npz")
        if needs_external_data(model):
            save_with_external_data(model, model_path, "model.onnx.data")
        else:
            onnx.save(model, model_path)
        np.savez(feeds_path, **feeds)
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        child = context.Process(target=_measure_in_child, args=(model_path, feeds_path, device, runs, queue))
        child.start()
        try:
            measured = queue.get(timeout=600)
        finally:
            child.join(timeout=60)
    return measured


def _measure_in_child(model_path: str, feeds_path: str, device: str, runs: int, queue) -> None:
    from .runtime import create_session as make_session

    with np.load(feeds_path) as data:
        feeds = {name: data[name] for name in data.files}
    _reset_peak_rss()
    before_rss = _status_bytes("VmRSS")
    before_device = _device_memory_used() if device == "cuda" else None
    run = _runner(make_session(model_path, device), feeds, device)
    for _ in range(runs):
        run()
    peak_rss = _status_bytes("VmHWM")
    result = {"peak_rss_bytes": int(peak_rss), "peak_memory_bytes": int(max(peak_rss - before_rss, 0))}
    if before_device is not None:
        after_device = _device_memory_used()
        result["peak_memory_bytes"] = int(max(after_device - before_device, 0))
        result["peak_host_memory_bytes"] = int(max(peak_rss - before_rss, 0))
    queue.put(result)


def _status_bytes(field: str) -> int:
    """A size from /proc/self/status (VmRSS: now; VmHWM: the peak since the last reset)."""
    with open("/proc/self/status", encoding="ascii") as stream:
        for line in stream:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {field}")


def _reset_peak_rss() -> None:
    """Make VmHWM start from the current RSS (Linux >= 4.0), so the peak is this session's."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as stream:
            stream.write("5")
    except OSError:
        pass


def _device_memory_used() -> int:
    """Bytes in use on GPU 0, from NVML (the driver's library, present wherever CUDA runs)."""
    import ctypes

    class Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    nvml.nvmlInit_v2()
    handle = ctypes.c_void_p()
    nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle))
    memory = Memory()
    nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory))
    return int(memory.used)
