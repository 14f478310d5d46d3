"""convexport: export PyTorch models to ONNX, fold their linear structure exactly, prove it."""

__version__ = "0.1.0"

from .errors import ConvexportError, ValidationError  # noqa: E402
from .pipeline import OptimizeResult, export_only, optimize  # noqa: E402

__all__ = ["ConvexportError", "ValidationError", "OptimizeResult", "optimize", "export_only", "__version__"]
