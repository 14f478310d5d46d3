"""convexport: export PyTorch models to ONNX, fold their linear structure exactly, prove it.

The names below are loaded when first used (PEP 562): `import convexport.algebra` or the
`convexport` command's start does not import the pipeline, torch or ONNX Runtime."""

__version__ = "0.1.0"

__all__ = [
    "ConvexportError",
    "ValidationError",
    "OptimizeOptions",
    "OptimizeResult",
    "optimize",
    "export_only",
    "__version__",
]

_WHERE = {
    "ConvexportError": "errors",
    "ValidationError": "errors",
    "OptimizeOptions": "options",
    "OptimizeResult": "pipeline",
    "optimize": "pipeline",
    "export_only": "pipeline",
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'convexport' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
