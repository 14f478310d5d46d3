"""Memory a large model's stage freed, given back to the operating system before the next one.

Python frees an object when its last reference goes, but an object in a reference cycle (a
graph's nodes and tensors point at each other) waits for the cyclic collector, which large
arrays do not make run; and glibc keeps freed blocks of up to 32 MiB in its heap for reuse,
so a process that held many weights of a few MiB each stays as large as it was at its peak.
On a 1 GiB RepVGG-style conv model (10 MiB weights) the rewrite stage left 0.93 GiB so held,
beside the next stage's sessions (bench/RESULTS.md, "Large models").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc

# A model with this much weight is worth a release after a stage (a full collection takes tens
# of milliseconds where torch is loaded: after every small rewrite and validation, the test
# suite's thousands of them took minutes longer)
LARGE_BYTES = 64 << 20


def release_after(model) -> None:
    """release() where `model` (an onnx.ModelProto) holds LARGE_BYTES of weights or more."""
    from . import weight_bytes

    if weight_bytes(model) >= LARGE_BYTES:
        release()


def release() -> None:
    """Collect cyclic garbage, then return the heap's free memory to the system (glibc only:
    elsewhere the collection alone)."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (macOS, musl): no malloc_trim
        return None
