import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SAMPLES = ROOT / "sample_models"
sys.path.insert(0, str(FIXTURES))


@pytest.fixture(scope="session")
def small_net_path() -> Path:
    return FIXTURES / "small_net.py"


def model_interface(model) -> list:
    """A model's inputs (not its weights) and outputs: name, element type, dims (value or name)."""
    graph = model.graph
    weights = {init.name for init in graph.initializer}

    def described(value):
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in tensor.shape.dim]
        return value.name, tensor.elem_type, dims if tensor.HasField("shape") else None

    return [[described(v) for v in graph.input if v.name not in weights], [described(v) for v in graph.output]]


@pytest.fixture(autouse=True)
def interface_is_the_contract(monkeypatch):
    """Every model the suite optimizes in this process keeps the interface of the graph it was
    validated against: input and output names, element types, every dim and dim name (issue 50;
    what --input fixes is in that graph already), but for float element types made float16 by
    --io-dtype fp16, which asks for it."""
    from convexport import pipeline

    optimize_once = pipeline._optimize

    def checked(model, options):
        result = optimize_once(model, options)
        if result.original is not None and result.model is not result.original:
            expected = model_interface(result.original)
            if options.io_dtype in ("fp16", "float16"):
                expected = [[(name, 10 if kind == 1 else kind, dims) for name, kind, dims in side] for side in expected]
            assert model_interface(result.model) == expected, "the interface changed"
        return result

    monkeypatch.setattr(pipeline, "_optimize", checked)
