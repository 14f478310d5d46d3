"""ONNX Runtime sessions: provider choice and session creation from in-memory models (or
from a file, for a model too large to serialise)."""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import os
import re
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import onnx

from .errors import ConvexportError

try:
    import onnxruntime as ort
except ImportError as missing:  # an install that skipped it, or one of the two builds uninstalled over the other
    raise ConvexportError(
        "ONNX Runtime is not importable: pip install onnxruntime-gpu (Linux x86-64, Windows) or onnxruntime "
        f"(macOS, Linux aarch64), only one of the two ({missing})"
    ) from missing

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"

# The kernel libraries of custom operators (--custom-ops-library) that every session created
# meanwhile registers: validation, profiling and `--strategy measure` all create sessions, deep
# in their own code, and each needs them.
_custom_op_libraries: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "custom_op_libraries", default=()
)


@contextlib.contextmanager
def custom_op_libraries(paths: Sequence[str | Path]) -> Iterator[None]:
    """Every session created in the block registers these ONNX Runtime custom-op libraries
    (SessionOptions.register_custom_ops_library); each is loaded once first, so that one ONNX
    Runtime cannot load is a ConvexportError naming it before any work."""
    libraries = tuple(os.path.abspath(path) for path in paths)
    for library in libraries:
        try:
            regular = stat.S_ISREG(os.stat(library).st_mode)
        except OSError as exc:  # missing, a link loop, a name too long
            raise ConvexportError(f"--custom-ops-library {library}: {exc.strerror or exc}") from None
        if not regular:  # a FIFO would block the loader's read
            raise ConvexportError(f"--custom-ops-library {library}: not a regular file")
        try:
            ort.SessionOptions().register_custom_ops_library(library)
        except Exception as exc:
            raise ConvexportError(
                f"--custom-ops-library {library}: ONNX Runtime cannot load it ({ort_reason(exc)})"
            ) from None
    token = _custom_op_libraries.set(libraries)
    try:
        yield
    finally:
        _custom_op_libraries.reset(token)


def registered_custom_op_libraries() -> tuple[str, ...]:
    """The libraries custom_op_libraries set for sessions made now (for a child process)."""
    return _custom_op_libraries.get()


@functools.cache
def cuda_usable() -> bool:
    """True when onnxruntime-gpu really runs a session on CUDA (GPU, driver and CUDA libraries).

    ORT lists CUDAExecutionProvider whenever onnxruntime-gpu is installed and silently falls
    back to the CPU when the libraries are missing, so the only reliable test is a session.
    """
    if CUDA not in ort.get_available_providers():
        return False
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    probe = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Identity", ["x"], ["y"])],
            "probe",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        ),
        opset_imports=[onnx.helper.make_opsetid("", 13)],
        ir_version=8,
    )
    try:
        session = ort.InferenceSession(probe.SerializeToString(), providers=[CUDA, CPU])
    except Exception:
        return False
    return CUDA in session.get_providers()


def resolve_device(device: str) -> Literal["cpu", "cuda"]:
    """auto -> cuda when usable, else cpu; cuda without a usable GPU is a user error."""
    if device not in ("auto", "cpu", "cuda"):
        raise ConvexportError(f"--device {device!r}: expected auto, cpu or cuda")
    if device == "cpu":
        return "cpu"
    if device == "auto":
        return "cuda" if cuda_usable() else "cpu"
    if not cuda_usable():
        raise ConvexportError("--device cuda: no usable CUDA GPU for onnxruntime-gpu here; use --device cpu")
    return "cuda"


# The CUDA provider's options convexport sets, reported with every number it measures there:
# ORT's defaults, so that the times are what a deployment gets. ORT's CUDA Conv builds a cuDNN
# frontend graph per convolution in a session's first run and takes the plan of cuDNN's
# heuristic mode B for EXHAUSTIVE, of mode A for HEURISTIC (neither times algorithms); TF32 is
# on unless a check asks for plain fp32. A session that only checks values takes HEURISTIC, the
# cheaper pick: every plan computes the same convolution. The first run's plan building is
# paid per session and does not overlap across sessions (bench/RESULTS.md, "sessions' first runs").
CUDA_OPTIONS = {"cudnn_conv_algo_search": "EXHAUSTIVE", "use_tf32": "1"}


def provider_options(device: str, tf32: bool = True, search: bool = True) -> dict[str, str]:
    """The provider options a session on `device` is made with (none on the CPU)."""
    if device != "cuda":
        return {}
    return {
        **CUDA_OPTIONS,
        "use_tf32": "1" if tf32 else "0",
        "cudnn_conv_algo_search": CUDA_OPTIONS["cudnn_conv_algo_search"] if search else "HEURISTIC",
    }


# ONNX Runtime's CPU provider packs each MatMul's and Gemm's constant weight into its kernel's
# layout when a session is made (a Conv's are not): about what packing it in every run costs,
# and worth it over many runs (a deployment, the profile). A session that checks values runs a
# few times (validation, the half stage's measurements) and is made without (the times: bench/
# RESULTS.md, "Checking sessions without prepacking"). Packed or not, the kernel does the same
# float32 arithmetic in another summation order (outputs a few float32 ulps apart), and the
# models compared in a check are all run alike.
DISABLE_PREPACKING = "session.disable_prepacking"


def device_memory_used() -> int:
    """Bytes in use on GPU 0, from NVML (the driver's library, present wherever CUDA runs)."""

    class Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    nvml.nvmlInit_v2()
    handle = ctypes.c_void_p()
    nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle))
    memory = Memory()
    nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory))
    return int(memory.used)


def create_session(
    model: onnx.ModelProto | str | bytes,
    device: str = "cpu",
    optimize: bool = True,
    profile_path: str | None = None,
    what: str = "the model",
    tf32: bool = True,
    search: bool = True,
    prepack: bool = True,
    threads: int | None = None,
) -> ort.InferenceSession:
    """A session on `device` (with provider_options(device, tf32, search)) of a model, its file
    or its bytes; a model ONNX Runtime cannot load is a ConvexportError naming `what`, one it has
    no kernel for a MissingKernel. `prepack=False` for a session that checks values in a few runs
    (DISABLE_PREPACKING above). `threads`: its intra-op threads (None: ONNX Runtime's default)."""
    options = ort.SessionOptions()
    options.log_severity_level = 4  # fatal only: a failure reaches the user once, as checked_run's one line
    if not prepack:
        options.add_session_config_entry(DISABLE_PREPACKING, "1")
    if threads:
        options.intra_op_num_threads = threads
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    for library in _custom_op_libraries.get():
        options.register_custom_ops_library(library)
    if profile_path:
        options.enable_profiling = True
        options.profile_file_prefix = profile_path
    providers = [(CUDA, provider_options(device, tf32, search)), CPU] if device == "cuda" else [CPU]
    try:
        if isinstance(model, str | bytes):
            return ort.InferenceSession(model, options, providers=providers)
        from .ir import kept_from_serialisation  # here: a session of a file (peak_memory's child) needs no graph code

        if kept_from_serialisation(model):
            return _session_from_files(model, options, providers)
        return ort.InferenceSession(model.SerializeToString(), options, providers=providers)
    except Exception as exc:
        custom = _UNREGISTERED_OPERATOR.search(str(exc))
        if custom:
            raise ConvexportError(
                f"ONNX Runtime cannot load {what}: it has no kernel for the custom operator {custom[1]}; give the "
                "library that implements it with --custom-ops-library PATH"
            ) from exc
        if "NOT_IMPLEMENTED" in str(exc):
            raise MissingKernel(
                f"ONNX Runtime's {CUDA if device == 'cuda' else CPU} has no kernel for this model ({ort_reason(exc)})"
            ) from exc
        raise Unloadable(f"ONNX Runtime cannot load {what}: {ort_reason(exc)}") from exc


class Unloadable(ConvexportError):
    """ONNX Runtime refuses the model itself (a shape or type it cannot reconcile): for an
    optimized graph, a rewrite made it invalid, and the pipeline finds which."""


# ONNX Runtime's words for an operator of a domain no registered library implements
_UNREGISTERED_OPERATOR = re.compile(r"Fatal error: ([\w.]+:\w+)\(-?\d+\) is not a registered function/op")

# "[ONNXRuntimeError] : 1 : FAIL : /onnxruntime_src/.../model.cc:256 onnxruntime::Model::Model(...) Reason..."
_ORT_NOISE = re.compile(
    r"^(?:\[ONNXRuntimeError\] : \d+ : \w+ : )?(?:\S+\.(?:cc|cpp|h):\d+ )?(?:[^()]*\(.*?\) (?=[A-Z]))?"
)


def ort_reason(exc: BaseException) -> str:
    """The reason in an ONNX Runtime error, whole: its status code, source location and C++
    signature (which fill the first 300 characters of a load error) left out."""
    text = (str(exc).strip() or type(exc).__name__).splitlines()[0]
    return _ORT_NOISE.sub("", text, count=1) or text


class MissingKernel(ConvexportError):
    """A valid model that ONNX Runtime's provider cannot run (bfloat16 on the CPU provider)."""


class RunFailure(ConvexportError):
    """ONNX Runtime loaded a model but failed to run it on the inputs given (a Conv whose
    kernel is larger than an input whose dynamic dims were made 1, a model that is wrong)."""


def checked_run(call, feeds: dict, what: str, hint: str = ""):
    """call() (a session run on `feeds`), with a failure as one RunFailure line naming `what`
    and the inputs' shapes."""
    try:
        return call()
    except Exception as exc:  # ORT's Fail, InvalidArgument, ... derive from Exception alone
        shapes = ", ".join(
            f"{name}:{'x'.join(map(str, value.shape)) or 'scalar'}:{value.dtype}" for name, value in feeds.items()
        )
        raise RunFailure(f"ONNX Runtime cannot run {what} on {shapes}: {ort_reason(exc)}{hint}") from exc


def _session_from_files(model: onnx.ModelProto, options, providers) -> ort.InferenceSession:
    """A large model's session from a file (ir.files_for_runtime: ONNX Runtime maps the
    weights of a model it opens from a file, and copies those of one given as bytes), which
    lives as long as the session: its generator's clean-up runs when the session is collected."""
    from .ir import files_for_runtime

    files = files_for_runtime(model)
    path = files.__enter__()
    try:
        session = ort.InferenceSession(path, options, providers=providers)
    except BaseException:
        files.__exit__(None, None, None)
        raise
    session.convexport_files = files
    return session
