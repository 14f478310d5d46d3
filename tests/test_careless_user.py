"""What a careless user types or gives (issue 49, items 3, 5 and 9): a model file name with a
typo never imports a Python module of the same stem, no output may be the weights file beside
-o, and a data file that is not the .npz it should be is one line, never a traceback or an
allocation its header asks for."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import onnx
import pytest
from helpers import assert_user_error, invoke, make_model, tensor
from onnx import helper


@pytest.mark.parametrize("typed", ["weights.pt:model", "ckpt.pth:ema", "net.onnx:x", "program.pt2:f"])
def test_a_model_file_that_is_not_there_runs_no_python_file_of_its_stem(typed, tmp_path, monkeypatch):
    """Each case its own stem: a module imported once stays in sys.modules and would not run again."""
    marker = tmp_path / "ran"
    stem = typed.split(".")[0]
    (tmp_path / f"{stem}.py").write_text(f"open({str(marker)!r}, 'w').close()\ndef model(): pass\n")
    monkeypatch.chdir(tmp_path)
    result = invoke("optimize", typed, "--no-profile")
    assert result.exit_code == 1, result.output
    assert not marker.exists()  # weights.py was not imported
    assert "Traceback" not in result.output and typed.split(":")[0] in result.stderr


def test_an_error_line_shows_a_colon_name_as_typed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("optimize", "weights.onnx:x")
    assert result.exit_code == 1 and ":x" in result.stderr and "\u274c" not in result.stderr


def small_model(path):
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    onnx.save(make_model(nodes, [tensor("x", [1, 4])], [tensor("y", [1, 4])], opset=17), path)


@pytest.mark.parametrize("option", ["--report", "--html"])
def test_no_output_may_be_the_weights_file_beside_the_model(option, tmp_path):
    small_model(tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    result = invoke("optimize", tmp_path / "m.onnx", "-o", out, option, f"{out}.data", "--no-profile")
    assert_user_error(result, f"{option} {out}.data", "weights")
    assert not out.exists() and not (tmp_path / "out.onnx.data").exists()


# ---------------------------------------------------------------------------------------------
# --input-data / validate --inputs files that are not what they say (issue 49, item 9)


def npz_with_header(path, name: str, shape: tuple, dtype=np.float32, data: bytes = b"\0" * 64):
    """An .npz whose member `name` has a .npy header declaring `shape` over `data`."""
    buffer = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_2_0(buffer, header)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}.npy", buffer.getvalue() + data)


def relu_model(folder):
    small_model(folder / "m.onnx")
    return folder / "m.onnx"


@pytest.mark.parametrize("command", ["optimize", "validate"])
def test_a_plain_npy_is_one_line_that_says_npz(command, tmp_path):
    model = relu_model(tmp_path)
    np.save(tmp_path / "x.npy", np.ones([1, 4], np.float32))
    args = [model, "--input-data", tmp_path / "x.npy", "--no-profile", "-o", tmp_path / "o.onnx"]
    if command == "validate":
        args = [model, model, "--inputs", tmp_path / "x.npy"]
    assert_user_error(invoke(command, *args), "x.npy", "a .npy file holds one array", ".npz")


def test_a_truncated_npz_is_one_line(tmp_path):
    model = relu_model(tmp_path)
    np.savez(tmp_path / "d.npz", x=np.ones([1, 4], np.float32))
    whole = (tmp_path / "d.npz").read_bytes()
    (tmp_path / "d.npz").write_bytes(whole[: len(whole) // 2])
    assert_user_error(invoke("validate", model, model, "--inputs", tmp_path / "d.npz"), "d.npz", "not a readable .npz")


def test_a_header_that_claims_terabytes_is_refused_before_any_allocation(tmp_path):
    model = relu_model(tmp_path)
    npz_with_header(tmp_path / "d.npz", "x", (1 << 40, 7))
    assert_user_error(invoke("validate", model, model, "--inputs", tmp_path / "d.npz"), "array 'x' declares",
                      "damaged")  # fmt: skip


def test_an_unused_member_is_never_read(tmp_path):
    model = relu_model(tmp_path)
    npz_with_header(tmp_path / "d.npz", "unused", (1 << 40, 7))
    with zipfile.ZipFile(tmp_path / "d.npz", "a") as archive:
        buffer = io.BytesIO()
        np.save(buffer, np.ones([1, 4], np.float32))
        archive.writestr("x.npy", buffer.getvalue())
    result = invoke("validate", model, model, "--inputs", tmp_path / "d.npz", "--runs", "0")
    assert result.exit_code == 0, result.output


def test_a_member_over_the_input_cap_is_refused_unread(tmp_path, monkeypatch):
    import convexport.input_data as input_data

    monkeypatch.setattr(input_data, "MAX_INPUT_BYTES", 1 << 10)
    model = relu_model(tmp_path)
    np.savez_compressed(tmp_path / "d.npz", x=np.zeros([1, 1 << 20], np.float32))  # a 4 MiB member, 4 KiB on disk
    assert_user_error(invoke("validate", model, model, "--inputs", tmp_path / "d.npz"), "array 'x' is", "GiB",
                      "at most")  # fmt: skip
