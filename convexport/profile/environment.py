"""What the numbers were measured with: versions, the provider, threads, the processor (the
report's `environment`)."""

from __future__ import annotations

import os
import platform
import subprocess
from typing import Literal

from ..report.types import Environment


def measured_environment(device: Literal["cpu", "cuda"]) -> Environment:
    from ..runtime import CPU, CUDA, ort

    return {
        "onnxruntime": ort.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
        "provider": CUDA if device == "cuda" else CPU,
        "cpu": _cpu_name(),
        "cpu_threads": os.cpu_count(),
        "gpu": _gpu_name() if device == "cuda" else None,
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu_name() -> str | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
        return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def available_memory_bytes() -> int | None:
    """The memory a new allocation can take here without swapping (Linux's MemAvailable), or
    the machine's physical memory where the system says only that; None where it says neither."""
    try:
        with open("/proc/meminfo", encoding="ascii") as stream:
            for line in stream:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
