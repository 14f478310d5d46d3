"""How fast and how big ONNX models run on ONNX Runtime: latency, the speedup of one graph
over another with its interval, peak memory and time per op type, on the CUDA provider (IO
binding, device memory) or the CPU provider, at the intra-op thread count asked (`threads`;
None: ONNX Runtime's default, one per physical core).

Each model gets one session, which everything measured of it in this process uses; the
sessions are made and warmed one after the other:
1. The first run, alone: it carries the one-off work (on CUDA cuDNN building a plan for each
   convolution, seconds on a real model; arenas growing, thread pools starting), so it is timed
   (`phases_s.first_run`) but never counted.
2. Time per op type (unless per_op is False: --no-per-op): ONNX Runtime's profiler is on from
   the session's start and can be ended but not started again, so every run before
   `end_profiling` is profiled (and slowed). The per-op pass is PER_OP_LEAD runs that are not
   counted, then the per-op runs, and profiling ends there: no warm-up or timed
   run carries the profiler. Each node's kernel time is its median over the per-op runs, and an
   op type's time the sum of its nodes'; their sum is checked against the profiled runs' own
   median (`profiled_run_ms`, the same runs, the profiler's overhead in both): the entry's
   `op_time_coverage`, trusted within OP_TIME_TOLERANCE (on CUDA, ORT times a kernel's launch
   on the host, which need not be its time on the device: never trusted there).
3. Warm-up until the run time settles: runs go on until the median of the last WARM_WINDOW
   runs is within SETTLED of the median of the WARM_WINDOW before them (at least `warmup`
   runs, at most WARM_BUDGET_S of them).
4. Peak memory: on CUDA the device memory in use (NVML) after the warm-up over before the
   session, in this process; on the CPU in a fresh process per model (profile/peak_memory.py), where
   nothing of this one is counted, once every session is released; the two models' processes
   run at the same time (each reads its own resident set), a large model's one after the
   other. (Measured in this process instead, the sessions of a small model read a tenth of
   what a process of their own shows: ONNX Runtime's per-session costs are paid once a
   process; bench/RESULTS.md.)
Then two models are timed against each other in pairs until the speedup's interval is narrow
(profile/paired_timer.py), one model until its median's is. Where a model is large
(ir.kept_from_serialisation: 256 MiB of weights or more), each model's session is made, timed
and released before the next one's is made (`one_at_a_time` in the result): two sessions would
hold both models' weights at once; the speedup is then the ratio of two medians timed apart,
its interval the ratio of their intervals.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import onnx

from .. import ir
from ..errors import ConvexportError
from ..ir import files_for_runtime, heap, kept_from_serialisation
from ..load.inputs import DEFAULT_DYNAMIC_SIZE, InputSpec, dynamic_dims_note, random_inputs
from ..runtime import (
    CPU,
    CUDA,
    checked_run,
    create_session,
    device_memory_used,
    provider_options,
    registered_custom_op_libraries,
)
from .paired_timer import TARGET, apart, block_size, median_interval, time_one, time_pair

DEFAULT_WARMUP = 3  # runs at the least
WARM_WINDOW = 3
SETTLED = 0.10
WARM_BUDGET_S = 1.0
PER_OP_LEAD = 2  # profiled runs after the first that the per-op times leave out
PER_OP_RUNS = 10  # at most: about PER_OP_BUDGET_S worth
PER_OP_BUDGET_S = 0.25
OP_TIME_TOLERANCE = 0.1
MEMORY_RUNS = 2  # the arena grows on the first run; a second shows it stays
PEAK_MEMORY_TIMEOUT_S = 600


# The intra-op threads of the timings made inside optimize's stages (--strategy measure's,
# deep in the rewrite engine), set once for the run by the pipeline (--threads).
_timing_threads: contextvars.ContextVar[int | None] = contextvars.ContextVar("timing_threads", default=None)


@contextlib.contextmanager
def timing_threads(threads: int | None) -> Iterator[None]:
    """Every time_models call in the block times at `threads` intra-op threads."""
    token = _timing_threads.set(threads)
    try:
        yield
    finally:
        _timing_threads.reset(token)


@dataclass
class _Session:
    """One model's session, warmed, and what was measured of it on the way."""

    run: Callable[[], object]
    settled_s: float  # the median of the last warm-up window
    warmup_runs: int
    measured: dict = field(default_factory=dict)  # op_time_ms and its check, memory, phases
    session: object = None  # ONNX Runtime's, for after_timing


@dataclass(frozen=True)
class TimingSettings:
    """How profile_models times: `runs` timed runs of each model (None: until the paired
    interval is within `target` of the speedup, or `budget_s` of timed runs), after at least
    `warmup` runs; the peak memory and the per-op times measured besides where asked (each in
    runs of its own); sessions of `threads` intra-op threads (None: ONNX Runtime's default)."""

    runs: int | None = None
    warmup: int = DEFAULT_WARMUP
    memory: bool = True
    per_op: bool = True
    threads: int | None = None
    target: float = TARGET
    budget_s: float | None = None


def profile_models(
    models: dict[str, onnx.ModelProto],
    inputs: list[InputSpec],
    device: str,
    settings: TimingSettings = TimingSettings(),
    *,
    feeds: dict | None = None,
    progress: Callable[[int, int], None] | None = None,
    after_timing: dict[str, Callable[[object], None]] | None = None,
) -> dict:
    """Per model label (one model, or two: before and after): latency_ms, throughput,
    peak_memory_bytes, op_time_ms (see the module doc); measured on one device as `settings`
    say, on `feeds` (random inputs made to `inputs` when None), each model fed them in the
    types its inputs declare (a float16 interface gets float16 arrays). Two models get
    `paired`: the speedup of the first over the second, its interval and the pairs it took.
    `progress(done, total)` is told of the timing's progress. `after_timing[label]` is called
    with that model's session once it is timed, before it is released: other work on the same
    model and options uses it instead of a session of its own (a CUDA session's first run builds
    every convolution's cuDNN plan, seconds on a real model)."""
    if len(models) not in (1, 2):
        raise ValueError("profile_models times one model, or two against each other")
    feeds = random_inputs(inputs, seed=0) if feeds is None else feeds
    after_timing = after_timing or {}
    batch = next((int(v.shape[0]) for v in feeds.values() if v.ndim), 1)
    hint = dynamic_dims_note(inputs, f"made {DEFAULT_DYNAMIC_SIZE}")

    runs, target, budget_s, threads = settings.runs, settings.target, settings.budget_s, settings.threads

    def warmed(label: str, model: onnx.ModelProto) -> _Session:
        return _warmed_session(model, label, fed_as_declared(model, feeds), device, settings, hint)

    one_at_a_time = any(isinstance(m, onnx.ModelProto) and kept_from_serialisation(m) for m in models.values())
    sessions: dict[str, _Session] = {}
    paired = None
    if one_at_a_time or len(models) == 1:  # a large model: never two sessions, each holding a model's weights
        alone = {}
        for label, model in models.items():
            session = sessions[label] = warmed(label, model)
            alone[label] = time_one(session.run, session.settled_s, target, budget_s, fixed=runs)
            if progress is not None:
                progress(len(alone), len(models))
            _release(session, after_timing.get(label))
            heap.release()
        samples = {label: timing.runs_ms for label, timing in alone.items()}
        timed_s = sum(timing.timed_s for timing in alone.values())
        if len(models) == 2:
            paired = apart(*alone.values())
    else:
        sessions = {label: warmed(label, model) for label, model in models.items()}
        settled = max(session.settled_s for session in sessions.values())
        told = None if progress is None else lambda pairs: progress(pairs, 0)
        timing = time_pair(
            {label: session.run for label, session in sessions.items()}, settled, target, budget_s, told,
            pairs=None if runs is None else max(1, -(-runs // block_size(settled))),
        )  # fmt: skip
        samples, timed_s, paired = timing.runs_ms, timing.timed_s, timing.entry()
        for label, session in sessions.items():
            _release(session, after_timing.get(label))
    result = {
        "device": device,
        "provider": CUDA if device == "cuda" else CPU,
        "provider_options": provider_options(device),
        "threads": threads,
        "runs": min(len(times) for times in samples.values()),
        "warmup": max(session.warmup_runs for session in sessions.values()),
        "batch": batch,
        "timed_s": round(timed_s, 3),
        "interval_target": target,
    }
    if paired is not None:
        result["paired"] = paired
    if one_at_a_time:
        result["one_at_a_time"] = True  # timed one after the other, not taking turns (see the module doc)
    memories = {}
    if settings.memory and device != "cuda":
        memories = _peak_memories(models, feeds, MEMORY_RUNS, threads, together=not one_at_a_time)
    for label in models:
        latency = _latency(samples[label])
        entry = {
            "latency_ms": latency,
            "throughput_per_s": batch * 1e3 / latency["median"] if latency["median"] else None,
            "warmup_runs": sessions[label].warmup_runs,
            **sessions[label].measured,
        }
        if label in memories:
            measured = dict(memories[label])
            entry["phases_s"]["memory"] = measured.pop("seconds")
            entry.update(measured)
        entry["phases_s"] = {phase: round(seconds, 3) for phase, seconds in entry["phases_s"].items()}
        if "op_time_ms" in entry:
            entry.update(_op_time_check(entry["op_time_ms"], entry.get("profiled_run_ms"), device))
        result[label] = entry
    return result


def fed_as_declared(model: onnx.ModelProto, feeds: dict) -> dict:
    """`feeds` with each floating array in the type the model's input of that name declares
    (a model of float16 inputs beside its float32 original is fed the same values in float16)."""
    if not isinstance(model, onnx.ModelProto):  # a model file's path: fed as given
        return feeds
    declared = {
        value.name: onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        for value in model.graph.input
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type
    }
    fed = {}
    for name, array in feeds.items():
        wanted = declared.get(name)
        if wanted is not None and array.dtype != wanted and array.dtype.kind == "f" and np.dtype(wanted).kind == "f":
            array = array.astype(wanted)
        fed[name] = array
    return fed


def _release(session: _Session, then: Callable[[object], None] | None) -> None:
    """Hands the session to `then` (if any), then drops every reference to it."""
    if then is not None:
        then(session.session)
    session.session, session.run = None, _released


def _released() -> object:
    raise RuntimeError("a released session was run")


def time_models(
    models: dict[str, onnx.ModelProto], feeds: dict, device: str, budget_s: float, threads: int | None = None
) -> dict:
    """Two models' median milliseconds per label, timed against each other in pairs
    (profile/paired_timer.py) for at most about `budget_s` after each has settled; the speedup of the
    first over the second with its interval, and the pairs; at `threads` intra-op threads (None:
    timing_threads', else ONNX Runtime's default)."""
    threads = threads if threads is not None else _timing_threads.get()
    sessions = {
        label: _warmed_session(
            model, label, feeds, device, TimingSettings(memory=False, per_op=False, threads=threads), ""
        )
        for label, model in models.items()
    }
    settled = max(session.settled_s for session in sessions.values())
    paired = time_pair({label: session.run for label, session in sessions.items()}, settled, budget_s=budget_s)
    return {
        **paired.entry(),
        "runs": min(len(samples) for samples in paired.runs_ms.values()),
        **{label: float(np.median(samples)) for label, samples in paired.runs_ms.items()},
    }


def _warmed_session(model, label, feeds, device, settings: TimingSettings, hint: str) -> _Session:
    """The model's session after its first run, its memory, its per-op pass (as asked) and
    its warm-up, in that order (see the module doc). A model that cannot run on `feeds` fails
    in its first run, in one line."""
    memory, per_op, threads = settings.memory, settings.per_op, settings.threads
    what = f"the model profiled as {label!r}"
    device_before = device_memory_used() if memory and device == "cuda" else None
    with tempfile.TemporaryDirectory(prefix="convexport-profile-") as folder:
        profile_path = os.path.join(folder, "ort") if per_op else None
        began = time.perf_counter()
        session = create_session(model, device, profile_path=profile_path, what=what, threads=threads)
        run = session_runner(session, feeds, device)
        made = time.perf_counter()
        first_run = _timed(lambda: checked_run(run, feeds, what, hint))
        # where a profile's time goes besides its timed runs, for the report (phases_s)
        phases = {"session": made - began, "first_run": first_run}
        measured: dict = {"phases_s": phases}
        lead: list[float] = []
        if per_op:
            per_op_began = time.perf_counter()
            lead = [_timed(run) for _ in range(PER_OP_LEAD)]
            profiled_s = float(np.median(lead)) if lead else first_run
            for _ in range(int(min(PER_OP_RUNS, max(1, PER_OP_BUDGET_S / max(profiled_s, 1e-6))))):
                run()
            with open(session.end_profiling(), encoding="utf-8") as stream:
                events = json.load(stream)
            skip = 1 + len(lead)
            measured["op_time_ms"] = op_times(events, skip, model)
            measured["profiled_run_ms"] = profiled_run_ms(events, skip)
            phases["per_op"] = time.perf_counter() - per_op_began
        times = warm_up(run, settings.warmup)
        phases["warm_up"] = sum(times)
    if device_before is not None:
        measured["peak_memory_bytes"] = max(device_memory_used() - device_before, 0)
    return _Session(run, float(np.median(times[-WARM_WINDOW:])), 1 + len(lead) + len(times), measured, session)


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
    low, high = median_interval(values)
    return {
        "median": float(np.median(values)),
        "median_low": low,
        "median_high": high,
        "p10": float(np.percentile(values, 10)),
        "p25": float(np.percentile(values, 25)),
        "p75": float(np.percentile(values, 75)),
        "p90": float(np.percentile(values, 90)),
        "min": float(values.min()),
        "mean": float(values.mean()),
    }


def _run_windows(events: list[dict], skip_runs: int) -> list[tuple[float, float]]:
    """(start, end) of each profiled run after the first `skip_runs`, in microseconds."""
    return sorted(
        (event["ts"], event["ts"] + event["dur"])
        for event in events
        if event.get("cat") == "Session" and event.get("name") == "model_run"
    )[skip_runs:]


def op_times(events: list[dict], skip_runs: int, model: onnx.ModelProto) -> dict[str, float]:
    """Milliseconds per run spent in each op type (largest first), from ORT's profiler events
    of the runs after the first `skip_runs` (the warm-up's): each node's kernel time is its
    median over those runs, an op type's the sum of its nodes'."""
    windows = _run_windows(events, skip_runs)
    if not windows:
        return {}
    # A Scan, Loop or If node's time includes its body's nodes, which ORT reports as well: only
    # the main graph's nodes count (by name), else the body's time would be counted twice.
    main = {node.name for node in model.graph.node} if any(ir.proto_subgraphs(n) for n in model.graph.node) else None
    starts = np.asarray([start for start, _ in windows])
    ends = np.asarray([end for _, end in windows])
    per_node: dict[str, np.ndarray] = {}
    op_of: dict[str, str] = {}
    for event in events:
        name = event.get("name", "")
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        node = name[: -len("_kernel_time")]
        if main is not None and node not in main:
            continue
        index = int(np.searchsorted(starts, event["ts"], side="right")) - 1
        if index >= 0 and event["ts"] <= ends[index]:
            times = per_node.setdefault(node, np.zeros(len(windows)))
            times[index] += event["dur"] / 1e3
            op_of[node] = event["args"]["op_name"]
    totals: dict[str, float] = defaultdict(float)
    for node, times in per_node.items():
        totals[op_of[node]] += float(np.median(times))
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def profiled_run_ms(events: list[dict], skip_runs: int) -> float | None:
    """The median duration of the per-op runs as the profiler saw them (its own overhead in)."""
    durations = [(end - start) / 1e3 for start, end in _run_windows(events, skip_runs)]
    return float(np.median(durations)) if durations else None


def _op_time_check(op_time_ms: dict[str, float], run_ms: float | None, device: str = "cpu") -> dict:
    """The per-op times' sum per run against the profiled runs' own median (module doc)."""
    total = float(sum(op_time_ms.values()))
    coverage = total / run_ms if run_ms else None
    trusted = device != "cuda" and coverage is not None and abs(coverage - 1) <= OP_TIME_TOLERANCE
    return {"op_time_total_ms": total, "op_time_coverage": coverage, "op_times_trusted": trusted}


def _peak_memories(
    models: dict[str, onnx.ModelProto], feeds: dict, runs: int, threads: int | None, together: bool
) -> dict[str, dict]:
    """Each model's peak memory per label, measured in a fresh Python process of its own
    (profile/peak_memory.py), so that nothing of this one is counted; a process of its own rather than
    multiprocessing's spawn, which re-runs the caller's script (a script without an
    `if __name__ == "__main__":` guard would start over). `together`: the processes run at the
    same time (each reads only its own resident set, and the wait is one process's start, not
    one a model); else one after the other (large models: never two models' weights in memory
    at once). Each entry's `seconds` is its process's wall time."""
    with tempfile.TemporaryDirectory() as folder, contextlib.ExitStack() as large:
        commands = {}
        for index, (label, model) in enumerate(models.items()):
            model_path, feeds_path = os.path.join(folder, f"{index}.onnx"), os.path.join(folder, f"{index}.npz")
            if kept_from_serialisation(model):  # its weights mapped from their files, as validation's sessions
                model_path = large.enter_context(files_for_runtime(model))
            else:
                onnx.save(model, model_path)
            np.savez(feeds_path, **fed_as_declared(model, feeds))
            commands[label] = [
                sys.executable, "-m", "convexport.profile.peak_memory", model_path, feeds_path, str(runs),
                str(threads or 0),
                *registered_custom_op_libraries(),
            ]  # fmt: skip
        if together:
            return _measured(commands)
        return {label: _measured({label: command})[label] for label, command in commands.items()}


def _measured(commands: dict[str, list[str]]) -> dict[str, dict]:
    """Runs the peak-memory processes at once; each one's JSON, with its wall `seconds`."""
    began = time.perf_counter()
    running = {
        label: subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for label, command in commands.items()
    }
    results = {}
    try:
        for label, process in running.items():
            try:
                out, err = process.communicate(timeout=max(PEAK_MEMORY_TIMEOUT_S - (time.perf_counter() - began), 1))
            except subprocess.TimeoutExpired:
                raise ConvexportError(f"measuring peak memory took over {PEAK_MEMORY_TIMEOUT_S} s") from None
            if process.returncode != 0:
                reason = (err.strip().splitlines() or ["no message"])[-1]
                raise ConvexportError(f"measuring peak memory failed: {reason}")
            results[label] = {**json.loads(out), "seconds": time.perf_counter() - began}
    finally:
        for process in running.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    return results
