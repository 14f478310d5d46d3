"""The route table (issue 53): each kind of model one module with one interface, registered in
one list; a new route is a module and a line (tests/fixtures/toy_route.py, not shipped)."""

from __future__ import annotations

import numpy as np
import pytest
import toy_route
from helpers import assert_user_error, invoke

import convexport
from convexport.load import routes
from convexport.errors import ConvexportError
from convexport.load.model import ModelArgument


@pytest.fixture
def with_toy_route(monkeypatch):
    monkeypatch.setattr(routes, "ROUTES", [*routes.ROUTES, toy_route.ROUTE])  # the one line


def test_a_new_route_is_a_module_and_a_line_in_the_table(tmp_path, with_toy_route):
    rng = np.random.default_rng(0)
    path = toy_route.save_toy(tmp_path / "net.toy", rng.standard_normal((64, 64)), rng.standard_normal((64, 8)))
    result = convexport.optimize(str(path), profile=False)
    assert result.output == tmp_path / "net.opt.onnx" and result.output.exists()
    assert result.report["exporter"] == "onnx" and result.report["validation"]["passed"]
    assert result.report["before"]["ops"] == {"MatMul": 2} and result.report["after"]["ops"] == {"MatMul": 1}
    assert path.read_bytes()[:2] == b"PK"  # the input is never written over


def test_a_new_route_joins_what_the_messages_and_the_file_checks_know(tmp_path, with_toy_route):
    assert ".toy" in routes.model_suffixes()
    with pytest.raises(ConvexportError, match=r"expected \.onnx, \.pt, \.pth, \.pt2, .*\.toy$"):
        routes.load_model(str(tmp_path / "model.h5"))
    broken = tmp_path / "broken.toy"
    broken.write_bytes(b"not a zip")
    with pytest.raises(ConvexportError, match="broken.toy: not a toy model"):
        routes.load_model(str(broken))


def test_without_its_line_the_route_is_unknown(tmp_path):
    path = toy_route.save_toy(tmp_path / "net.toy", np.eye(4), np.eye(4))
    assert_user_error(invoke("optimize", path), "net.toy", "unknown model type '.toy'")


def test_the_shipped_table():
    kinds = [route.kind for route in routes.ROUTES]
    assert kinds == ["onnx", "torchscript", "module", "exported_program", "module", "module"]
    assert all(route.trusts for route in routes.ROUTES)
    assert routes.model_suffixes() == (".onnx", ".pt", ".pth", ".pt2", ".py")
    with pytest.raises(ConvexportError) as unknown:
        routes.load_model("model.h5")
    assert str(unknown.value).endswith("expected .onnx, .pt, .pth, .pt2, file.py[:callable] or package.module:callable")


@pytest.mark.parametrize(
    ("given", "route"),
    [("m.onnx", "onnx_file"), ("m.pt2", "exported_program"), ("m.pt", "pickled"), ("net.py", "factory"),
     ("net.py:small", "factory"), ("torchvision.models:resnet18", "factory")],
)  # fmt: skip
def test_each_model_string_goes_to_its_route(given, route):
    assert routes.route_for(ModelArgument.of(given)) is getattr(routes, route).ROUTE


def test_a_torchscript_archive_goes_to_its_route_and_a_fifo_is_never_opened(tmp_path):
    import os

    import torch

    archive = tmp_path / "script.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(archive))
    assert routes.route_for(ModelArgument.of(str(archive))) is routes.torchscript.ROUTE
    fifo = tmp_path / "pipe.pt"
    os.mkfifo(fifo)
    assert routes.route_for(ModelArgument.of(str(fifo))) is routes.pickled.ROUTE  # whose load refuses it
    with pytest.raises(ConvexportError, match="not a regular file"):
        routes.load_model(str(fifo))
