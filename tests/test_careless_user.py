"""What a careless user types or gives (issue 49, items 3, 5 and 9): a model file name with a
typo never imports a Python module of the same stem, no output may be the weights file beside
-o, and a data file that is not the .npz it should be is one line, never a traceback or an
allocation its header asks for."""

from __future__ import annotations

import io
import os
import subprocess
import sys
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


@pytest.mark.parametrize("command", ["optimize", "validate"])
@pytest.mark.parametrize("shape", [(1, 5), (1, 4, 1), ()])
def test_an_array_of_the_wrong_shape_names_both_shapes(command, shape, tmp_path):
    """ONNX Runtime's own message is cut at its newline ("Got invalid dimensions for input: x
    for the following indices"); the file's shape and the input's are both said instead."""
    model = relu_model(tmp_path)
    np.savez(tmp_path / "d.npz", x=np.ones(shape, np.float32))
    args = [model, "--input-data", tmp_path / "d.npz", "--no-profile", "-o", tmp_path / "o.onnx"]
    if command == "validate":
        args = [model, model, "--inputs", tmp_path / "d.npz"]
    said = "x".join(map(str, shape)) or "a scalar"
    assert_user_error(invoke(command, *args), f"d.npz: array 'x' is {said}; the model's input x is 1x4")


def test_the_nonfinite_note_names_the_inputs_that_gave_them(tmp_path):
    """y = Log(x): NaN where x < 0. On made-up inputs the note says so and asks for real data;
    on the user's own NaN data (validate --inputs, no made-up sets) it says the given inputs."""
    import json

    model = make_model([helper.make_node("Log", ["x"], ["y"])], [tensor("x", [1, 64])], [tensor("y", [1, 64])])
    onnx.save(model, tmp_path / "m.onnx")
    made_up = invoke("optimize", tmp_path / "m.onnx", "--no-profile", "-o", tmp_path / "o.onnx")
    said = " ".join(made_up.stdout.split())
    assert made_up.exit_code == 0 and "note: on made-up inputs the original gives NaN" in said, made_up.output
    assert "--input-data DATA.npz" in said
    data = np.abs(np.random.default_rng(0).standard_normal((1, 64))).astype(np.float32)
    data[0, :3] = np.nan
    np.savez(tmp_path / "x_nan.npz", x=data)
    report = tmp_path / "v.json"
    given = invoke("validate", tmp_path / "m.onnx", tmp_path / "o.onnx", "--inputs", tmp_path / "x_nan.npz",
                   "--runs", "0", "--report", report)  # fmt: skip
    said = " ".join(given.stdout.split())
    assert given.exit_code == 0 and "note: on the given inputs the original gives NaN or infinity at 3 of 64" in said, given.output
    assert "made-up" not in said and json.loads(report.read_text())["nonfinite_on"] == "the given inputs"


def test_a_colour_terminal_gets_numbers_and_names_unmarked(tmp_path):
    """rich's highlighter coloured fragments of plain text ("1." of "1.11x" bold, "Intel("
    magenta); only convexport's own emphasis is marked now."""
    import re

    model = relu_model(tmp_path)
    shown = subprocess.run(
        [sys.executable, "-m", "convexport", "optimize", model, "--no-profile", "-o", tmp_path / "o.onnx"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "FORCE_COLOR": "1", "COLUMNS": "200"},
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "\x1b[" in shown.stdout  # a colour terminal indeed
    assert not re.search(r"\x1b\[[0-9;]*m[0-9(.]", shown.stdout), shown.stdout  # no code right before a number


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
    import convexport.load.input_data as input_data

    monkeypatch.setattr(input_data, "MAX_INPUT_BYTES", 1 << 10)
    model = relu_model(tmp_path)
    np.savez_compressed(tmp_path / "d.npz", x=np.zeros([1, 1 << 20], np.float32))  # a 4 MiB member, 4 KiB on disk
    assert_user_error(invoke("validate", model, model, "--inputs", tmp_path / "d.npz"), "array 'x' is", "GiB",
                      "at most")  # fmt: skip


def test_made_up_floats_are_drawn_a_block_at_a_time_with_the_same_values(monkeypatch):
    import tracemalloc

    import convexport.load.inputs as inputs
    from convexport.load.inputs import parse_input_spec, random_inputs

    spec = parse_input_spec("x:4x1000x1000")
    rng = np.random.default_rng(5)
    whole = {"x": rng.standard_normal((4, 1000, 1000)).astype(np.float32)}
    monkeypatch.setattr(inputs, "DRAWN_AT_ONCE", 1 << 18)
    tracemalloc.start()
    drawn = random_inputs([spec], seed=5)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert np.array_equal(drawn["x"], whole["x"])  # the same stream as one draw
    assert peak < 1.3 * drawn["x"].nbytes  # 16 MB of float32, not 48 MB of float64 first
    ranged = random_inputs([parse_input_spec("x:3x100000:0..1")], seed=2)["x"]
    assert np.array_equal(ranged, np.random.default_rng(2).uniform(0, 1, (3, 100000)).astype(np.float32))


@pytest.mark.parametrize("text, fragment", [
    ("x:1x3x4x\u00b2", "bad dimension"),
    ("x:1x4:-1e308..1e308", "wider than a float64"),
    ("x:1x4:float16:0..1e6", "a float16 holds values up to 65504"),
    ("x:1x4:bfloat16:0..1e39", "a bfloat16 holds values up to"),
])  # fmt: skip
def test_an_input_spec_that_cannot_be_made_is_one_line(text, fragment, tmp_path):
    model = relu_model(tmp_path)
    assert_user_error(invoke("validate", model, model, "--input", text), fragment)


def test_a_graph_input_of_terabytes_is_one_line(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    onnx.save(make_model(nodes, [tensor("x", [1 << 40])], [tensor("y", [1 << 40])], opset=17), tmp_path / "big.onnx")
    assert_user_error(invoke("validate", tmp_path / "big.onnx", tmp_path / "big.onnx"), "TiB of data", "at most")


@pytest.mark.parametrize("body, fragment", [
    ("class Boom(BaseException):\n    pass\n\ndef build():\n    raise Boom('no')\n", "raised Boom: no"),
    ("import os\n\ndef build():\n    os._exit(0)\n", "called os._exit(0)"),
])  # fmt: skip
def test_a_factory_that_escapes_is_one_line(body, fragment, tmp_path):
    """In a child process: were os._exit(0) to get through, it would end this test run with exit 0."""
    (tmp_path / "net.py").write_text(body)
    done = subprocess.run([sys.executable, "-m", "convexport", "optimize", f"{tmp_path / 'net.py'}:build", "--input",
                           "x:1x4"], capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1 and fragment in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "net.opt.onnx").exists()


def test_a_fifo_is_neither_a_custom_ops_library_nor_a_rule_file(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    model = relu_model(tmp_path)
    assert_user_error(invoke("optimize", model, "--custom-ops-library", fifo, "--no-profile"), "not a regular file")
    assert_user_error(invoke("rules", "check", fifo), "not a regular file")


def test_a_huge_rule_file_is_refused_by_its_size(tmp_path):
    rule_file = tmp_path / "big.yaml"
    rule_file.write_text("# " + "x" * (2 << 20) + "\n")
    assert_user_error(invoke("rules", "check", rule_file), "MiB; a rule file is at most")


def test_the_cycle_message_names_the_node(tmp_path):
    nodes = [helper.make_node("Relu", ["c"], ["b"], name="r1"), helper.make_node("Relu", ["b"], ["c"], name="r2"),
             helper.make_node("Add", ["x", "b"], ["y"], name="a")]  # fmt: skip
    onnx.save(make_model(nodes, [tensor("x", [2])], [tensor("y", [2])], opset=17), tmp_path / "cycle.onnx")
    assert_user_error(invoke("optimize", tmp_path / "cycle.onnx", "--no-profile"), "input 'c' of node: name: r1")


@pytest.mark.parametrize("damage, fragment", [("length", "external data length 'abc' is not a byte count"),
                                              ("dims", "too small for the declared shape")])  # fmt: skip
def test_damaged_external_data_is_one_line(damage, fragment, tmp_path):
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [tensor("x", [1, 4])], [tensor("y", [1, 4])],
                       {"w": np.ones((4, 4), np.float32)}, opset=17)  # fmt: skip
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0)
    damaged = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    if damage == "length":
        next(entry for entry in damaged.graph.initializer[0].external_data if entry.key == "length").value = "abc"
    else:
        damaged.graph.initializer[0].dims[:] = [400, 4]
    onnx.save(damaged, tmp_path / "damaged.onnx")
    assert_user_error(invoke("optimize", tmp_path / "damaged.onnx", "--no-profile"), "damaged.onnx", fragment)


# Small words (issue 72, item 10)


def test_a_misspelt_name_gets_the_nearest_names(tmp_path):
    """--explain conv-bn names conv-batchnorm (its abbreviation), rules show does too, and a
    factory name with a typo gets the file's callables."""
    model = relu_model(tmp_path)
    explained = invoke("optimize", model, "--explain", "conv-bn", "--no-profile", "-o", tmp_path / "o.onnx")
    assert_user_error(explained, "--explain conv-bn: no rule of that name; did you mean conv-batchnorm")
    assert_user_error(invoke("rules", "show", "conv-bn"), "no rule named 'conv-bn'; did you mean conv-batchnorm")
    (tmp_path / "net.py").write_text(
        "import torch\ndef build():\n    return torch.nn.Linear(3, 4), (torch.randn(2, 3),)\n"
    )
    assert_user_error(invoke("optimize", f"{tmp_path / 'net.py'}:buidl", "--no-profile"), "no callable 'buidl'",
                      "did you mean build?")  # fmt: skip


def test_advice_names_only_what_the_user_gave(tmp_path):
    """A TorchScript archive without example inputs is not told about a factory; a factory
    whose forward raises on its own example inputs is not told to check --input."""
    import torch

    torch.jit.script(torch.nn.Linear(3, 4)).save(str(tmp_path / "m.pt"))
    archive = invoke("optimize", tmp_path / "m.pt", "--no-profile")
    assert_user_error(archive, "m.pt", "--input NAME:DIMS")
    assert "factory" not in archive.stderr
    (tmp_path / "net.py").write_text(
        "import torch\ndef build():\n    return torch.nn.Linear(3, 4), (torch.randn(2, 5),)\n"
    )
    raising = invoke("optimize", tmp_path / "net.py", "--no-profile", "-o", tmp_path / "o.onnx")
    assert_user_error(raising, "does not run on the example inputs (2x5:float32)", "check the example inputs' count")
    assert "--input" not in raising.stderr


@pytest.mark.parametrize("command", ["optimize", "export"])
@pytest.mark.parametrize("model", ["nope.onnx", "nope.pt2", "net.py:build", "weights.pt:model"])
def test_a_missing_model_file_is_said_before_the_stages_are_imported(tmp_path, command, model):
    """A missing MODEL took the stages' imports (seconds) before its one line."""
    script = (
        "import sys\nfrom convexport.console import run\nsys.argv = ['convexport', *sys.argv[1:]]\n"
        "try:\n    run()\nexcept SystemExit as end:\n    print(end.code, 'convexport.pipeline' in sys.modules)\n"
    )
    arguments = [command, model, "-o", "o.onnx"]
    done = subprocess.run([sys.executable, "-c", script, *arguments], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)  # fmt: skip
    assert done.stderr.strip() == f"convexport: {model}: no such file", done.stderr
    assert done.stdout.split()[-2:] == ["1", "False"], done.stdout


def test_the_early_check_knows_every_routes_files():
    from convexport.cli import MODEL_SUFFIXES
    from convexport.load.routes import ROUTES

    assert set(MODEL_SUFFIXES) == {suffix for route in ROUTES for suffix in route.suffixes}


def test_inputs_beyond_the_free_memory_are_refused_before_any_is_drawn(tmp_path, monkeypatch):
    """An input drawn to 8 GiB on a 24 GB machine was widened and run until the kernel killed
    the process (exit -9, no message). Here the machine has 4 MiB free: a 0.75 MiB input set,
    held six times over, is refused in one line before anything is drawn; without validation
    and profile nothing holds it and the model is written."""
    import convexport.stages.inputs as stage_inputs

    monkeypatch.setattr(stage_inputs, "available_memory_bytes", lambda: 4 << 20)
    monkeypatch.setattr(stage_inputs.input_domains, "sized_by_running", lambda *a: pytest.fail("drawn"))
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    onnx.save(make_model(nodes, [tensor("x", [1, 3, 256, 256])], [tensor("y", [1, 3, 256, 256])]), tmp_path / "m.onnx")
    refused = invoke("optimize", tmp_path / "m.onnx", "-o", tmp_path / "o.onnx")
    assert_user_error(refused, "the inputs take 768 KiB a set (x 1x3x256x256 float32 the most)",
                      "hold about 4.5 MiB of them, more than the 4 MiB this machine has free", "--no-validate --no-profile")  # fmt: skip
    assert not (tmp_path / "o.onnx").exists()
    written = invoke("optimize", tmp_path / "m.onnx", "-o", tmp_path / "o.onnx", "--no-validate", "--no-profile")
    assert written.exit_code == 0, written.output
