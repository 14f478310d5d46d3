"""How fast and how big ONNX models run on ONNX Runtime: latency, throughput, peak memory and
time per op type, on the CUDA provider (IO binding, device memory) or the CPU provider.

Each model gets one session, which everything measured of it in this process uses:
1. The first run, alone: it carries the one-off work (on CUDA cuDNN building a plan for each
   convolution, seconds on a real model; arenas growing, thread pools starting), so it is timed
   (`phases_s.first_run`) but never counted.
2. Time per op type, right after it (unless per_op is False: --no-per-op): ONNX Runtime's
   profiler is on from the session's start and can be ended but not started again, so every
   run before `end_profiling` is profiled (and slowed: mobileone_s0 on an H200 ran 10.2 ms
   profiled against 3.9 ms). The per-op pass is therefore PER_OP_LEAD runs that are not
   counted, then the per-op runs, whose kernel events alone count (each run's window is its
   model_run event), and profiling ends there: no warm-up or timed run carries the profiler,
   and its events file holds a few runs. The per-op times are checked against the latency:
   their sum per run over the median run time is the entry's `op_time_coverage`, and outside
   [1 - OP_TIME_TOLERANCE, 1 + OP_TIME_TOLERANCE] `op_times_trusted` is false (on CUDA, ORT
   times a kernel's launch on the host, which need not be its time on the device).
3. Warm-up until the run time settles: runs go on until the median of the last WARM_WINDOW
   runs is within SETTLED of the median of the WARM_WINDOW before them (at least `warmup`
   runs, at most WARM_BUDGET_S of them); the settled time sizes the timed runs.
4. Peak memory: on CUDA the device memory in use (NVML) after the warm-up over before the
   session, in this process; on the CPU in a fresh process per model (peak_memory.py), where
   nothing of this one is counted.
Then the number of timed runs is sized from the settled run times (about TIME_BUDGET_S per
model) and the models take turns in blocks of up to BLOCK runs (A x10, B x10, A x10, ...), in
at least ALTERNATIONS blocks each, so machine noise (a machine slowing down for a few seconds)
hits them alike. The first run of each block is not counted: ORT's worker threads spin for a
while after a run, and one session's spinning threads would slow the other's next run if they
alternated run by run (bench/RESULTS.md, "Measurements behind the code"). Where a model is
large (ir.kept_from_serialisation: 256 MiB of weights or more), each model's session is made,
timed and released before the next one's is made (`one_at_a_time` in the result): two sessions
would hold both models' weights at once; the runs are then sized from the first model's.
Every session is released before the peak memory is measured.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from . import heap, ir
from .errors import ConvexportError
from .inputs import DEFAULT_DYNAMIC_SIZE, InputSpec, dynamic_dims_note, random_inputs
from .ir import files_for_runtime, kept_from_serialisation
from .runtime import (
    CPU,
    CUDA,
    checked_run,
    create_session,
    device_memory_used,
    provider_options,
    registered_custom_op_libraries,
)

DEFAULT_RUNS = None  # chosen so that each model is timed for about TIME_BUDGET_S
TIME_BUDGET_S = 2.0
MIN_RUNS, MAX_RUNS = 5, 1000  # a model slower than TIME_BUDGET_S / MIN_RUNS runs MIN_RUNS times
BLOCK = 10
ALTERNATIONS = 5
DEFAULT_WARMUP = 3  # runs at the least
WARM_WINDOW = 3
SETTLED = 0.10
WARM_BUDGET_S = 2.0
PER_OP_LEAD = 2  # profiled runs after the first that the per-op times leave out
PER_OP_RUNS = 10  # at most: about PER_OP_BUDGET_S worth
PER_OP_BUDGET_S = 0.5
OP_TIME_TOLERANCE = 0.2
MEMORY_RUNS = 2  # the arena grows on the first run; a second shows it stays
SETTLE_BELOW_S = 0.05  # a run this short can be slowed by the other session's spinning threads
PEAK_MEMORY_TIMEOUT_S = 600


@dataclass
class _Session:
    """One model's session, warmed, and what was measured of it on the way."""

    run: Callable[[], object]
    settled_s: float  # the median of the last warm-up window
    warmup_runs: int
    measured: dict = field(default_factory=dict)  # op_time_ms and its check, device memory
    session: object = None  # ONNX Runtime's, for after_timing


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
    after_timing: dict[str, Callable[[object], None]] | None = None,
) -> dict:
    """Per model label: latency_ms, throughput, peak_memory_bytes, op_time_ms (see the module
    doc); measured on one device, on `feeds` (random inputs made to `inputs` when None).
    `progress(done, total)` is told the timed runs made so far. `after_timing[label]` is called
    with that model's session once it is timed, before it is released: other work on the same
    model and options uses it instead of a session of its own (a CUDA session's first run builds
    every convolution's cuDNN plan, seconds on a real model)."""
    feeds = random_inputs(inputs, seed=0) if feeds is None else feeds
    after_timing = after_timing or {}
    batch = next((int(v.shape[0]) for v in feeds.values() if v.ndim), 1)
    hint = dynamic_dims_note(inputs, f"made {DEFAULT_DYNAMIC_SIZE}")

    def warmed(label: str, model: onnx.ModelProto) -> _Session:
        return _warmed_session(model, label, feeds, device, warmup, hint, per_op, memory and device == "cuda")

    one_at_a_time = any(isinstance(m, onnx.ModelProto) and kept_from_serialisation(m) for m in models.values())
    if one_at_a_time:  # a large model: never two sessions, each holding a model's weights (issue 34)
        sessions, latencies, timed_s = {}, {}, 0.0
        for label, model in models.items():
            session = sessions[label] = warmed(label, model)
            runs = runs or _runs_for(session.settled_s)  # the first model's (the original, as given)
            told = _offset_progress(progress, sum(map(len, latencies.values())), runs * len(models))
            timed_began = time.perf_counter()
            latencies.update(_block_latency({label: session}, runs, told))
            timed_s += time.perf_counter() - timed_began
            _release(session, after_timing.get(label))
            heap.release()
    else:
        sessions = {label: warmed(label, model) for label, model in models.items()}
        if runs is None:
            runs = _runs_for(max(session.settled_s for session in sessions.values()))
        timed_began = time.perf_counter()
        latencies = _block_latency(sessions, runs, progress)
        timed_s = time.perf_counter() - timed_began
        for label, session in sessions.items():  # released before the peak memory is measured in a process of its own
            _release(session, after_timing.get(label))
    result = {
        "device": device,
        "provider": CUDA if device == "cuda" else CPU,
        "provider_options": provider_options(device),
        "runs": runs,
        "warmup": max(session.warmup_runs for session in sessions.values()),
        "batch": batch,
        "timed_s": round(timed_s, 3),
    }
    if one_at_a_time:
        result["one_at_a_time"] = True  # timed one after the other, not taking turns (see the module doc)
    for label, model in models.items():
        latency = _latency(latencies[label])
        entry = {
            "latency_ms": latency,
            "throughput_per_s": batch * 1e3 / latency["median"] if latency["median"] else None,
            "warmup_runs": sessions[label].warmup_runs,
            **sessions[label].measured,
        }
        if memory and device != "cuda":
            memory_began = time.perf_counter()
            entry.update(_peak_memory(model, feeds, MEMORY_RUNS))
            entry["phases_s"]["memory"] = time.perf_counter() - memory_began
        entry["phases_s"] = {phase: round(seconds, 3) for phase, seconds in entry["phases_s"].items()}
        if "op_time_ms" in entry:
            entry.update(_op_time_check(entry["op_time_ms"], latency["median"]))
        result[label] = entry
    return result


def _release(session: _Session, then: Callable[[object], None] | None) -> None:
    """Hands the session to `then` (if any), then drops every reference to it."""
    if then is not None:
        then(session.session)
    session.session = session.run = None


def _offset_progress(progress, done: int, total: int):
    """progress(done, total) told of one model's runs among all the models' runs (None: none)."""
    return None if progress is None else lambda made, _: progress(done + made, total)


def _runs_for(settled_s: float, budget_s: float = TIME_BUDGET_S) -> int:
    """Timed runs for about `budget_s` of a model whose runs settled at `settled_s` seconds."""
    return int(min(MAX_RUNS, max(MIN_RUNS, budget_s / max(settled_s, 1e-6))))


def time_models(models: dict[str, onnx.ModelProto], feeds: dict, device: str, budget_s: float) -> dict:
    """Median milliseconds per model label, timed side by side (block-interleaved) for about
    `budget_s` each after each has settled, and the number of runs."""
    sessions = {
        label: _warmed_session(model, label, feeds, device, DEFAULT_WARMUP, "", False, False)
        for label, model in models.items()
    }
    runs = _runs_for(max(session.settled_s for session in sessions.values()), budget_s)
    latencies = _block_latency(sessions, runs)
    return {"runs": runs, **{label: float(np.median(samples)) for label, samples in latencies.items()}}


def _warmed_session(model, label, feeds, device, warmup, hint, per_op, device_memory) -> _Session:
    """The model's session after its first run, its per-op pass (as asked), its warm-up and its
    device memory, in that order (see the module doc). A model that cannot run on `feeds` fails
    in its first run, in one line."""
    what = f"the model profiled as {label!r}"
    before = device_memory_used() if device_memory else None
    with tempfile.TemporaryDirectory(prefix="convexport-profile-") as folder:
        profile_path = os.path.join(folder, "ort") if per_op else None
        began = time.perf_counter()
        session = create_session(model, device, profile_path=profile_path, what=what)
        run = session_runner(session, feeds, device)
        made = time.perf_counter()
        first_run = _timed(lambda: checked_run(run, feeds, what, hint))
        # where a profile's time goes besides its timed runs, for the report (phases_s)
        phases = {"session": made - began, "first_run": first_run}
        measured: dict = {"phases_s": phases}
        if per_op:
            per_op_began = time.perf_counter()
            lead = [_timed(run) for _ in range(PER_OP_LEAD)]
            profiled_s = float(np.median(lead)) if lead else first_run
            for _ in range(int(min(PER_OP_RUNS, max(1, PER_OP_BUDGET_S / max(profiled_s, 1e-6))))):
                run()
            with open(session.end_profiling(), encoding="utf-8") as stream:
                events = json.load(stream)
            measured["op_time_ms"] = op_times(events, 1 + PER_OP_LEAD, model)
            measured["profiled_run_ms"] = profiled_run_ms(events, 1 + PER_OP_LEAD)
            phases["per_op"] = time.perf_counter() - per_op_began
        times = warm_up(run, warmup)
        phases["warm_up"] = sum(times)
    if before is not None:
        measured["peak_memory_bytes"] = max(device_memory_used() - before, 0)
    return _Session(run, float(np.median(times[-WARM_WINDOW:])), 1 + len(times), measured, session)


def warm_up(run: Callable[[], object], least: int, budget_s: float | None = None) -> list[float]:
    """Run until the run time settles (see the module doc): the seconds of each run made. The
    first run, with its one-off work, is made before, so that it counts neither towards the
    budget nor in the windows compared (a search of several seconds once sized the runs)."""
    budget_s = WARM_BUDGET_S if budget_s is None else budget_s
    times: list[float] = []
    began = time.perf_counter()
    while True:
        times.append(_timed(run))
        if len(times) >= max(least, 2 * WARM_WINDOW) and _settled(times):
            return times
        if time.perf_counter() - began > budget_s:
            return times


def _timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _settled(times: list[float]) -> bool:
    last = float(np.median(times[-WARM_WINDOW:]))
    previous = float(np.median(times[-2 * WARM_WINDOW : -WARM_WINDOW]))
    return abs(last - previous) <= SETTLED * previous


def _block_latency(sessions: dict[str, _Session], runs: int, progress=None) -> dict[str, list[float]]:
    """Milliseconds of each timed run per label, the models taking turns (see the module doc)."""
    times: dict[str, list[float]] = {label: [] for label in sessions}
    block = max(1, min(BLOCK, runs // ALTERNATIONS))
    total = runs * len(sessions)
    settle = max(session.settled_s for session in sessions.values()) < SETTLE_BELOW_S
    while any(len(samples) < runs for samples in times.values()):
        for label, session in sessions.items():
            if settle:
                session.run()  # not counted: the other session's threads settle meanwhile
            for _ in range(min(block, runs - len(times[label]))):
                start = time.perf_counter()
                session.run()
                times[label].append((time.perf_counter() - start) * 1e3)
            if progress is not None:
                progress(sum(map(len, times.values())), total)
    return times


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


def op_times(events: list[dict], skip_runs: int, model: onnx.ModelProto) -> dict[str, float]:
    """Milliseconds per run spent in each op type (largest first), from ORT's profiler events,
    counting only the kernels of the runs after the first `skip_runs` (the warm-up's)."""
    windows = sorted(
        (event["ts"], event["ts"] + event["dur"])
        for event in events
        if event.get("cat") == "Session" and event.get("name") == "model_run"
    )[skip_runs:]
    if not windows:
        return {}
    # A Scan, Loop or If node's time includes its body's nodes, which ORT reports as well: only
    # the main graph's nodes count (by name), else the body's time would be counted twice.
    main = {node.name for node in model.graph.node} if any(ir.proto_subgraphs(n) for n in model.graph.node) else None
    starts = np.asarray([start for start, _ in windows])
    ends = np.asarray([end for _, end in windows])
    totals: dict[str, float] = defaultdict(float)
    for event in events:
        name = event.get("name", "")
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        if main is not None and name[: -len("_kernel_time")] not in main:
            continue
        index = int(np.searchsorted(starts, event["ts"], side="right")) - 1
        if index >= 0 and event["ts"] <= ends[index]:
            totals[event["args"]["op_name"]] += event["dur"] / 1e3
    return {op: total / len(windows) for op, total in sorted(totals.items(), key=lambda item: -item[1])}


def profiled_run_ms(events: list[dict], skip_runs: int) -> float | None:
    """The median duration of the per-op runs as the profiler saw them (its own overhead in)."""
    runs = sorted((e["ts"], e["dur"]) for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    durations = [length / 1e3 for _, length in runs[skip_runs:]]
    return float(np.median(durations)) if durations else None


def _op_time_check(op_time_ms: dict[str, float], median_ms: float) -> dict:
    """The per-op times' sum per run against the median run time (see the module doc)."""
    total = float(sum(op_time_ms.values()))
    coverage = total / median_ms if median_ms > 0 else None
    trusted = coverage is not None and abs(coverage - 1) <= OP_TIME_TOLERANCE
    return {"op_time_total_ms": total, "op_time_coverage": coverage, "op_times_trusted": trusted}


def _peak_memory(model: onnx.ModelProto, feeds, runs: int) -> dict:
    """Measured in a fresh Python process (peak_memory.py), so that nothing of this one is
    counted; a process of its own rather than multiprocessing's spawn, which re-runs the
    caller's script (a script without an `if __name__ == "__main__":` guard would start over)."""
    with tempfile.TemporaryDirectory() as folder, contextlib.ExitStack() as large:
        model_path, feeds_path = os.path.join(folder, "model.onnx"), os.path.join(folder, "feeds.npz")
        if kept_from_serialisation(model):  # its weights mapped from their files, as validation's sessions
            model_path = large.enter_context(files_for_runtime(model))
        else:
            onnx.save(model, model_path)
        np.savez(feeds_path, **feeds)
        command = [sys.executable, "-m", "convexport.peak_memory", model_path, feeds_path, str(runs)]
        command += registered_custom_op_libraries()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=PEAK_MEMORY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ConvexportError(f"measuring peak memory took over {PEAK_MEMORY_TIMEOUT_S} s") from None
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise ConvexportError(f"measuring peak memory failed: {reason}")
        return json.loads(done.stdout)
