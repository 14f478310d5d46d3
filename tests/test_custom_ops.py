"""Models with custom operators: ONNX Runtime gets their kernels from --custom-ops-library in
every session (validation, profiling, the peak-memory child); without it, or for a torch
custom op the exporter cannot translate, one line says what to give."""

from __future__ import annotations

import functools
import textwrap

import numpy as np
import onnx
import onnx.parser
import pytest
from helpers import assert_user_error, invoke, op_counts
from onnx import numpy_helper

assert_quiet_error = functools.partial(assert_user_error, quiet_stdout=True)  # and nothing on stdout

extensions = pytest.importorskip("onnxruntime_extensions")
RNG = np.random.default_rng(5)




@pytest.fixture
def custom_model(tmp_path):
    """Conv -> BatchNormalization -> NegPos, an operator of onnxruntime-extensions' library."""
    model = onnx.parser.parse_model(textwrap.dedent("""
        <ir_version: 10, opset_import: ["" : 18, "ai.onnx.contrib" : 1]>
        g (float[1,3,8,8] x) => (float[1,4,8,8] neg, float[1,4,8,8] pos) {
            c = Conv <pads = [1, 1, 1, 1]> (x, w)
            b = BatchNormalization (c, s, t, m, v)
            neg, pos = ai.onnx.contrib.NegPos (b)
        }
    """))
    weights = {"w": RNG.standard_normal((4, 3, 3, 3)), **{name: RNG.uniform(0.5, 2, 4) for name in "stmv"}}
    model.graph.initializer.extend(numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items())
    path = tmp_path / "custom.onnx"
    onnx.save(model, path)
    return path


def test_the_library_serves_every_session(custom_model, tmp_path):
    out = tmp_path / "out.onnx"
    result = invoke("optimize", custom_model, "-o", out, "--custom-ops-library", extensions.get_library_path())
    assert result.exit_code == 0, result.output
    assert "validation: passed" in result.stdout and "latency ms" in result.stdout
    assert op_counts(onnx.load(out)) == {"Conv": 1, "NegPos": 1}
    again = invoke("validate", custom_model, out, "--custom-ops-library", extensions.get_library_path())
    assert again.exit_code == 0, again.output
    timed = invoke("profile", out, "--runs", "3", "--custom-ops-library", extensions.get_library_path())
    assert timed.exit_code == 0, timed.output


def test_without_it_the_operator_and_the_option_are_named(custom_model):
    assert_quiet_error(invoke("optimize", custom_model), "ai.onnx.contrib:NegPos", "--custom-ops-library")


def test_a_file_that_is_no_library_is_refused_before_any_work(custom_model, tmp_path):
    fake = tmp_path / "libfake.so"
    fake.write_text("not a shared library")
    assert_quiet_error(invoke("optimize", custom_model, "--custom-ops-library", fake), "libfake.so", "cannot load")


def test_a_torch_custom_operator_gets_the_exporters_way_out(tmp_path):
    factory = tmp_path / "custom_op.py"
    factory.write_text(textwrap.dedent("""
        import torch

        @torch.library.custom_op("convexport_test::double", mutates_args=())
        def double(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @double.register_fake
        def _(x):
            return torch.empty_like(x)

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = torch.nn.Conv2d(3, 4, 3)

            def forward(self, x):
                return double(self.conv(x))

        def build():
            return Net().eval(), (torch.randn(1, 3, 8, 8),)
    """))
    assert_quiet_error(
        invoke("optimize", factory, "--no-profile"), "custom operator convexport_test.double", "custom_translation_table"
    )
