"""The bundled sample models: each factory returns (eval module, example inputs), runs, and is deterministic."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

SAMPLES = Path(__file__).resolve().parent.parent / "sample_models"

# (file stem, factory, expected input shapes, expected output shape or None for "do not run")
CASES = [
    ("seed000_subtracted_conv", "build", [(1, 16, 56, 56)], (1, 32, 28, 28)),
    ("seed001_bottleneck3d", "build", [(1, 16, 16, 24, 24)], (1, 32, 16, 24, 24)),
    ("seed002_group_attention", "build", [(2, 256, 14, 14)], (2, 17)),
    ("seed003_large_kernel", "build_small", [(1, 1, 160, 200)], (1, 3, 26, 66)),
    # the full-size forward (2x1x321x481 through 135x135 kernels) is too slow for the suite
    ("seed003_large_kernel", "build", [(2, 1, 321, 481)], None),
    ("seed004_full_padding", "build", [(1, 1, 32, 32)], (1, 2, 38, 38)),
    ("seed004_full_padding", "build_nobias", [(1, 1, 32, 32)], (1, 2, 38, 38)),
]
STEMS = sorted({stem for stem, *_ in CASES})


def _load(stem: str):
    """Import a sample file by path, as `convexport optimize sample_models/<stem>.py` does."""
    name = f"sample_model_{stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SAMPLES / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _check_factory_result(result, input_shapes):
    assert isinstance(result, tuple) and len(result) == 2
    module, inputs = result
    assert isinstance(module, torch.nn.Module)
    assert not any(m.training for m in module.modules()), "module (and every submodule) must be in eval mode"
    assert isinstance(inputs, tuple) and all(isinstance(t, torch.Tensor) for t in inputs)
    assert [tuple(t.shape) for t in inputs] == input_shapes
    assert all(t.dtype == torch.float32 for t in inputs)
    return module, inputs


@pytest.mark.parametrize("stem,factory,input_shapes,output_shape", CASES,
                         ids=[f"{stem}:{factory}" for stem, factory, *_ in CASES])
def test_factory_builds_and_runs(stem, factory, input_shapes, output_shape):
    module, inputs = _check_factory_result(getattr(_load(stem), factory)(), input_shapes)
    if output_shape is None:
        return
    with torch.no_grad():
        output = module(*inputs)
    outputs = output if isinstance(output, tuple) else (output,)
    assert tuple(outputs[0].shape) == output_shape
    assert all(torch.isfinite(o).all() for o in outputs)


@pytest.mark.parametrize("stem", STEMS)
def test_module_docstring_and_example_inputs(stem):
    sample = _load(stem)
    assert sample.__doc__ and f"Seed {stem[4:7]}" in sample.__doc__
    assert callable(sample.example_inputs)
    _, built = sample.build()
    first, second = sample.example_inputs(), sample.example_inputs()
    assert isinstance(first, tuple)
    assert [(t.shape, t.dtype) for t in first] == [(t.shape, t.dtype) for t in built]
    assert all(torch.equal(a, b) for a, b in zip(first, built))
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("stem", STEMS)
def test_build_is_deterministic(stem):
    sample = _load(stem)
    torch.manual_seed(12345)
    first, _ = sample.build()
    torch.manual_seed(54321)
    second, _ = sample.build()
    state1, state2 = first.state_dict(), second.state_dict()
    assert state1.keys() == state2.keys()
    assert all(torch.equal(state1[k], state2[k]) for k in state1)


@pytest.mark.parametrize("stem", ["seed001_bottleneck3d", "seed002_group_attention"])
def test_batchnorm_is_not_the_identity(stem):
    module, _ = _load(stem).build()
    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert norms
    for norm in norms:
        assert not torch.allclose(norm.running_mean, torch.zeros_like(norm.running_mean))
        assert not torch.allclose(norm.running_var, torch.ones_like(norm.running_var))
        assert not torch.allclose(norm.weight, torch.ones_like(norm.weight))
        assert not torch.allclose(norm.bias, torch.zeros_like(norm.bias))


def test_seed004_nobias_matches_seed():
    module, _ = _load("seed004_full_padding").build_nobias()
    assert all(m.bias is None for m in module.modules() if isinstance(m, torch.nn.Conv2d))
    module, _ = _load("seed004_full_padding").build()
    assert all(m.bias is not None for m in module.modules() if isinstance(m, torch.nn.Conv2d))
