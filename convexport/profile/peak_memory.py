"""Peak memory of one ONNX Runtime session on the CPU, measured in a process of its own:

    python -m convexport.profile.peak_memory MODEL.onnx FEEDS.npz RUNS THREADS [CUSTOM_OP_LIBRARY...]

prints {"peak_memory_bytes": ..., "peak_rss_bytes": ...} as JSON: the growth of the process's
peak resident set over what it had before the session was created (weights, arena,
activations). Linux resets the peak before the session (/proc/self/clear_refs); elsewhere
(macOS) the peak is the process's getrusage high-water mark. (On CUDA the device memory is
measured in the profiling process itself: profile/profiler.py.)
"""

from __future__ import annotations

import json
import sys

import numpy as np


def measure(model_path: str, feeds_path: str, runs: int, threads: int = 0) -> dict:
    from ..runtime import create_session

    with np.load(feeds_path) as data:
        feeds = {name: data[name] for name in data.files}
    _reset_peak_rss()
    before_rss = _current_rss()
    session = create_session(model_path, "cpu", threads=threads or None)
    for _ in range(runs):
        session.run(None, feeds)
    peak_rss = _peak_rss()
    return {"peak_rss_bytes": int(peak_rss), "peak_memory_bytes": int(max(peak_rss - before_rss, 0))}


def _current_rss() -> int:
    """The resident set now (Linux), or the peak so far where the system tells only that."""
    try:
        return _status_bytes("VmRSS")
    except OSError:
        return _peak_rss()


def _peak_rss() -> int:
    try:
        return _status_bytes("VmHWM")
    except OSError:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


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


if __name__ == "__main__":
    from ..runtime import custom_op_libraries

    model, feeds, runs, threads = sys.argv[1:5]
    with custom_op_libraries(sys.argv[5:]):
        print(json.dumps(measure(model, feeds, int(runs), int(threads))))
