"""What a newcomer trips on (issue 51): an --input that contradicts an ONNX model's fixed dims,
the Python API's errors in the API's words, a state_dict given as a model."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from helpers import assert_user_error, invoke, make_model, tensor
from onnx import helper

import convexport
from convexport.util.api_words import FLAG_KEYWORDS, in_api_words


@pytest.fixture
def static_model(tmp_path):
    weight = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                       [tensor("x", [1, 3, 64, 64])], [tensor("y", [1, 4, 64, 64])], {"w": weight})
    onnx.save(model, tmp_path / "m.onnx")
    return tmp_path / "m.onnx"


def test_an_input_that_changes_a_fixed_dim_of_an_onnx_model_says_so(static_model, tmp_path):
    """It wrote a model that refused the 64x64 inputs it was made for, and said it only on the
    inputs line: now the summary and the report say what changed."""
    report = tmp_path / "r.json"
    result = invoke("optimize", static_model, "--input", "x:1x3x32x32", "-o", tmp_path / "o.onnx", "--no-profile",
                    "--report", report)
    assert result.exit_code == 0, result.output
    said = (f"input 'x' was 1x3x64x64, fixed by {static_model}; --input makes it 1x3x32x32, the only size the "
            "written model takes")
    assert f"changed: {said}" in result.stdout
    assert json.loads(report.read_text())["input_changes"] == [said]
    from convexport.report.sections import render

    assert "changed: input &#x27;x&#x27; was 1x3x64x64" in render(json.loads(report.read_text()))


def test_an_input_that_agrees_with_the_fixed_dims_or_names_them_is_taken(static_model, tmp_path):
    for given in ("x:1x3x64x64", "x:Nx3x64x64"):
        result = invoke("optimize", static_model, "--input", given, "-o", tmp_path / "o.onnx", "--no-profile")
        assert result.exit_code == 0, result.output


def test_the_python_api_speaks_its_own_words(tmp_path):
    (tmp_path / "net.py").write_text("import torch\ndef build():\n    return torch.nn.Linear(3, 4).eval()\n")
    with pytest.raises(convexport.ConvexportError) as raised:
        convexport.optimize(str(tmp_path / "net.py:build"), write=False)
    message = str(raised.value)
    assert "inputs=['NAME:DIMS']" in message and "--input" not in message


def test_the_command_line_keeps_its_flags(tmp_path):
    (tmp_path / "net.py").write_text("import torch\ndef build():\n    return torch.nn.Linear(3, 4).eval()\n")
    result = invoke("optimize", tmp_path / "net.py:build", "--no-profile")
    assert_user_error(result, "--input NAME:DIMS")


def test_every_flag_in_the_table_is_an_option_of_optimize():
    fields = set(convexport.OptimizeOptions.__dataclass_fields__)
    assert {keyword for keyword, _ in FLAG_KEYWORDS.values()} <= fields


@pytest.mark.parametrize("message, said", [
    ("give --input with smaller dims", "give inputs= with smaller dims"),
    ("fix them with --input NAME:DIMS); or --inputs DATA.npz", "fix them with inputs=['NAME:DIMS']); or input_data='DATA.npz'"),
    ("pass --trust-pickle if you trust the file", "pass trust_pickle=True if you trust the file"),
    ("--opset 99: convexport exports at", "opset=99: convexport exports at"),
    ("a--input-like word, pre--opset", "a--input-like word, pre--opset"),
    ("check --input's count, dims and dtypes", "check the inputs argument's count, dims and dtypes"),  # not inputs='s
])
def test_flags_become_keywords(message, said):
    assert in_api_words(message) == said


def test_a_state_dict_given_as_a_model_is_named_as_one():
    with pytest.raises(convexport.ConvexportError, match="is a state_dict: weights without the module"):
        convexport.optimize(torch.nn.Linear(3, 4).state_dict(), write=False)


def test_a_default_output_another_model_of_the_folder_writes_too_is_said(tmp_path, monkeypatch):
    """net.pt and net.pt2 both write net.opt.onnx: the second run says it replaced the first's."""
    module = torch.nn.Conv2d(3, 4, 3).eval()
    x = torch.randn(1, 3, 8, 8)
    torch.jit.save(torch.jit.trace(module, x), tmp_path / "net.pt")
    torch.export.save(torch.export.export(module, (x,)), tmp_path / "net.pt2")
    monkeypatch.chdir(tmp_path)
    first = invoke("optimize", "net.pt", "--input", "x:1x3x8x8", "--no-profile")
    assert first.exit_code == 0 and "note:" not in first.stdout, first.output
    second = invoke("optimize", "net.pt2", "--no-profile")
    assert second.exit_code == 0, second.output
    assert "note: net.opt.onnx was replaced; net.pt in the same folder writes it too (give -o to keep both)" in (
        " ".join(second.stdout.split()))


def test_a_factory_that_gives_a_module_in_train_mode_is_noted(tmp_path):
    (tmp_path / "net.py").write_text(
        "import torch\ndef build():\n    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Dropout(0.5)), "
        "(torch.randn(2, 3),)\n"
    )
    result = invoke("optimize", tmp_path / "net.py", "--no-profile", "-o", tmp_path / "o.onnx")
    assert result.exit_code == 0, result.output
    assert "gave the module in train mode; it was exported in eval mode" in " ".join(result.stdout.split())


@pytest.mark.parametrize("fails", [False, True])
def test_the_api_gives_the_callers_module_back_in_its_own_modes(tmp_path, fails):
    """optimize() and export_only() export in eval mode and leave the caller's module (and each
    submodule, one of them in eval mode on purpose) in the modes it was given in, also when the
    run fails."""
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Dropout(0.5), torch.nn.BatchNorm1d(4)).train()
    module[2].eval()
    modes = [m.training for m in module.modules()]
    if fails:
        with pytest.raises(convexport.ConvexportError):
            convexport.optimize(module, inputs=["x:2x3"], output=tmp_path / "missing" / "o.onnx", profile=False)
    else:
        convexport.optimize(module, inputs=["x:2x3"], write=False, profile=False)
        convexport.export_only(module, tmp_path / "e.onnx", inputs=["x:2x3"])
    assert [m.training for m in module.modules()] == modes == [True, True, True, False]


@pytest.mark.parametrize("command", [["optimize"], ["validate"], ["profile"], ["export"], ["rules", "test"]])
def test_help_shows_placeholders_not_python_types(command):
    """typer shows `<bool>` for a switch, `<list[str]>` for a repeatable option: the command
    line's help shows nothing for a switch and PATH, TEXT, N or F for a value."""
    import subprocess
    import sys

    shown = subprocess.run([sys.executable, "-m", "convexport", *command, "--help"], capture_output=True, text=True,
                           env={**__import__("os").environ, "COLUMNS": "200"}, timeout=120).stdout
    option_lines = [line for line in shown.splitlines() if line.lstrip("│ ").startswith("--") and "--help" not in line]
    assert option_lines
    assert not [line for line in option_lines if "<bool>" in line or "<list[" in line or "<str>" in line]
