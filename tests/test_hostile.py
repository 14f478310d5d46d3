"""Hostile but fair input: paths that collide, special files, signals, user code that exits,
names the system refuses, non-finite weights, options that would be silently ignored. Every
case ends in exit 0 with what was asked, or one line on stderr and exit 1 (3 for an invalid
result), the inputs as they were and no temporary file left behind. Special files are made
here in a temporary folder; no test touches the machine's own /dev nodes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import assert_user_error, invoke, make_model, op_counts, tensor, verdict
from onnx import helper

import convexport
from convexport import ir
from convexport.errors import ValidationError
from convexport.util.files import is_stream, write_atomically

RNG = np.random.default_rng(3)
CONVEXPORT = [sys.executable, "-m", "convexport"]




def conv_bn(weight=None) -> onnx.ModelProto:
    """x -> Conv 3x3 -> BatchNormalization -> y: one fold for the default rules."""
    weights = {
        "w": RNG.standard_normal([4, 3, 3, 3]).astype(np.float32) if weight is None else weight,
        **{k: RNG.uniform(0.5, 2, 4).astype(np.float32) for k in ("s", "t", "m", "v")},
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "t", "m", "v"], ["y"]),
    ]
    return make_model(nodes, [tensor("x", [1, 3, 8, 8])], [tensor("y", [1, 4, 8, 8])], weights)


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn(), path)
    return path


def unchanged(path: Path, before: bytes) -> bool:
    return path.read_bytes() == before


def no_temporary_files(folder: Path) -> bool:
    return not list(folder.glob(".*.tmp"))


# --- 1. data loss -----------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--report", "--html"])
def test_a_report_on_the_input_model_is_refused_before_any_work(model, option):
    before = model.read_bytes()
    assert_user_error(invoke("optimize", model, option, model, "--no-profile"), option, "is the input")
    assert unchanged(model, before)


def test_a_report_on_the_factory_file_is_refused(tmp_path, small_net_path):
    factory = tmp_path / "net.py"
    factory.write_text(small_net_path.read_text())
    before = factory.read_bytes()
    result = invoke("optimize", f"{factory}:build", "-o", tmp_path / "o.onnx", "--report", factory)
    assert_user_error(result, "--report", "is the input")
    assert unchanged(factory, before) and not (tmp_path / "o.onnx").exists()


def test_validate_and_profile_reports_on_their_models_are_refused(model, tmp_path):
    other = tmp_path / "other.onnx"
    other.write_bytes(model.read_bytes())
    before = model.read_bytes()
    assert_user_error(invoke("validate", model, other, "--report", model), "is the input")
    assert_user_error(invoke("validate", model, other, "--report", other), "is the input")
    assert_user_error(invoke("profile", model, "--report", model), "is the input")
    assert unchanged(model, before) and unchanged(other, before)


@pytest.mark.parametrize("pair", [("-o", "--report"), ("--report", "--html"), ("-o", "--html")])
def test_two_outputs_on_one_file_are_refused(model, tmp_path, pair):
    same = tmp_path / "same.out"
    args = [arg for option in pair for arg in (option, same)]
    assert_user_error(invoke("optimize", model, *args, "--no-profile"), "is also", "give each output its own file")
    assert not same.exists()


def test_an_output_reached_through_a_hard_link_or_symlink_to_the_input_is_refused(model, tmp_path):
    before = model.read_bytes()
    os.link(model, tmp_path / "hard.onnx")
    (tmp_path / "soft.onnx").symlink_to(model)
    for alias in ("hard.onnx", "soft.onnx"):
        assert_user_error(invoke("optimize", model, "-o", tmp_path / alias, "--no-profile"), "is the input")
    assert unchanged(model, before)


@pytest.mark.parametrize("large", [False, True], ids=["weights-inside", "weights-beside"])
def test_the_inputs_weights_file_is_never_the_outputs(tmp_path, monkeypatch, large):
    """A model whose external data file has the name earlier versions gave <OUT>.data: the
    output's weights go to a name of their own, and the input's file is neither written nor
    removed, also when a previous OUT named it."""
    if large:
        monkeypatch.setattr("convexport.ir.large.EXTERNAL_DATA_THRESHOLD", 100)
        monkeypatch.setattr("convexport.ir.large.EXTERNAL_TENSOR_MIN_BYTES", 10)
    onnx.save(conv_bn(), tmp_path / "in.onnx", save_as_external_data=True, location="out.onnx.data", size_threshold=0)
    shutil.copy(tmp_path / "in.onnx", tmp_path / "out.onnx")  # a previous OUT that names it
    data = tmp_path / "out.onnx.data"
    before = data.read_bytes()
    result = convexport.optimize(str(tmp_path / "in.onnx"), output=tmp_path / "out.onnx", profile=False)
    assert result.report["validation"]["passed"] and unchanged(data, before)
    x = {"x": np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    run = lambda name: ort.InferenceSession(str(tmp_path / name), providers=["CPUExecutionProvider"]).run(None, x)[0]
    np.testing.assert_allclose(run("out.onnx"), run("in.onnx"), rtol=1e-5, atol=1e-5)
    assert ir.external_data_files(onnx.load(tmp_path / "out.onnx", load_external_data=False)) == (
        [Path(result.report["output_weights"]).name] if large else []
    )


def test_large_outputs_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """With the thresholds lowered, the model takes the path of one over 2 GiB: a failure while
    its weights are written leaves the previous OUT and its weights file as they were, no temporary file."""
    monkeypatch.setattr("convexport.ir.large.EXTERNAL_DATA_THRESHOLD", 100)
    monkeypatch.setattr("convexport.ir.large.EXTERNAL_TENSOR_MIN_BYTES", 10)
    first = convexport.optimize(conv_bn(), output=tmp_path / "out.onnx", profile=False)
    data = first.output_weights
    assert data.parent == tmp_path and onnx.load(first.output) is not None
    model_before, data_before = first.output.read_bytes(), data.read_bytes()

    def broken(large, out, location):
        out.write(b"partial")
        raise OSError(28, "No space left on device")

    # the weights are written before validation (ir.spill), or as the model is saved
    monkeypatch.setattr("convexport.ir.disk.write_weights", broken)
    monkeypatch.setattr("convexport.ir.large.write_weights", broken)
    with pytest.raises(convexport.ConvexportError, match="No space left"):
        convexport.optimize(conv_bn(), output=tmp_path / "out.onnx", profile=False)
    assert unchanged(first.output, model_before) and unchanged(data, data_before)
    assert no_temporary_files(tmp_path)


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGHUP"])
def test_a_signal_while_an_output_is_written_leaves_no_temporary_file(tmp_path, signal_name):
    destination, started = tmp_path / "out.bin", tmp_path / "started"
    destination.write_bytes(b"previous")
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from convexport.util.files import write_atomically

        def slow(path):
            Path(path).write_bytes(b"half")
            Path({str(started)!r}).touch()
            time.sleep(30)

        write_atomically({str(destination)!r}, slow)
    """)
    process = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.time() + 60
    while not started.exists() and time.time() < deadline:
        time.sleep(0.05)
    process.send_signal(getattr(signal, signal_name))
    assert process.wait(timeout=30) != 0
    assert destination.read_bytes() == b"previous" and no_temporary_files(tmp_path)


# --- 2. special files ---------------------------------------------------------------------------


def read_fifo_in_background(fifo: Path) -> tuple[threading.Thread, list[bytes]]:
    received: list[bytes] = []

    def read():
        with open(fifo, "rb") as stream:
            received.append(stream.read())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, received


def test_a_fifo_output_is_written_through_not_replaced(model, tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    thread, received = read_fifo_in_background(fifo)
    result = subprocess.run([*CONVEXPORT, "optimize", str(model), "-o", str(fifo), "--no-profile"],
                            capture_output=True, text=True, timeout=300)
    thread.join(timeout=60)
    assert result.returncode == 0, result.stderr
    assert fifo.is_fifo() and op_counts(onnx.load_from_string(received[0])) == {"Conv": 1}


def test_a_fifo_report_is_written_through(model, tmp_path):
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    thread, received = read_fifo_in_background(fifo)
    result = invoke("optimize", model, "-o", tmp_path / "o.onnx", "--report", fifo, "--no-profile")
    thread.join(timeout=60)
    assert result.exit_code == 0, result.output
    assert fifo.is_fifo() and json.loads(received[0])["after"]["ops"] == {"Conv": 1}


def test_a_symlinked_output_keeps_its_link_and_replaces_its_target(model, tmp_path):
    target = tmp_path / "real.onnx"
    target.write_bytes(b"old")
    link = tmp_path / "link.onnx"
    link.symlink_to(target)
    assert invoke("optimize", model, "-o", link, "--no-profile").exit_code == 0
    assert link.is_symlink() and op_counts(onnx.load(target)) == {"Conv": 1}
    assert no_temporary_files(tmp_path)


def test_report_dash_is_the_json_on_stdout_and_nothing_else(model, tmp_path):
    result = invoke("optimize", model, "-o", tmp_path / "o.onnx", "--report", "-", "--no-profile")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["after"]["ops"] == {"Conv": 1}
    assert not (tmp_path / "-").exists()


def test_streams_are_told_by_kind_and_by_name(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    (tmp_path / "plain").write_text("x")
    assert is_stream(fifo) and not is_stream(tmp_path / "plain") and not is_stream(tmp_path / "new")
    assert is_stream("/dev/stdout") and is_stream("/dev/fd/1") and is_stream("/proc/self/fd/1")  # by name


def test_write_atomically_through_a_stream_opens_it(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    thread, received = read_fifo_in_background(fifo)
    write_atomically(fifo, lambda path: Path(path).write_bytes(b"streamed"))
    thread.join(timeout=30)
    assert received == [b"streamed"] and fifo.is_fifo()


# --- 3. hang ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_weights_are_never_folded_or_factored(bad):
    weight = RNG.standard_normal([4, 3, 3, 3]).astype(np.float32)
    weight[1, 2, 1, 1] = bad
    model = conv_bn(weight)
    outcome = convexport.optimize(model, strategy="all", validate=False, profile=False, write=False)
    assert op_counts(outcome.model) == {"Conv": 1, "BatchNormalization": 1}
    assert any("inf or NaN" in entry["reason"] for entry in outcome.report["skipped"])


def test_the_low_rank_screen_and_split_refuse_non_finite_kernels_at_once():
    from convexport.algebra import ConvSpec
    from convexport.algebra.separable import rank_at_least, split_separable

    kernel = np.ones([64, 64, 5, 5])
    kernel[0, 0, 0, 0] = np.inf
    assert rank_at_least(kernel, 10)
    spec = ConvSpec(kernel, np.zeros(64), False, (1, 1), (1, 1), (0, 0), (0, 0))
    assert "inf or NaN" in verdict(split_separable, spec).reason


# --- 4. invalid model ---------------------------------------------------------------------------


def test_an_if_branch_of_one_identity_of_an_outer_tensor_stays_valid(tmp_path):
    branch = helper.make_graph(
        [helper.make_node("Identity", ["h"], ["o"])], "branch", [], [helper.make_tensor_value_info("o", 1, [1, 4])]
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["h"]),
        helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch),
    ]
    model = make_model(nodes, [tensor("x", [1, 4]), tensor("c", [], onnx.TensorProto.BOOL)], [tensor("y", [1, 4])])
    path = tmp_path / "if.onnx"
    onnx.save(model, path)
    result = invoke("optimize", path, "-o", tmp_path / "o.onnx", "--no-validate", "--no-profile")
    assert result.exit_code == 0, result.output
    onnx.checker.check_model(onnx.load(tmp_path / "o.onnx"), full_check=True)


def test_a_rewritten_model_the_checker_rejects_is_found_but_not_one_that_came_so():
    from convexport.stages.validate import checker_problem

    good = conv_bn()
    bad = onnx.ModelProto()
    bad.CopyFrom(good)
    bad.graph.node[0].input[1] = "missing"  # reads a tensor nothing makes
    assert "missing" in checker_problem(good, bad)
    assert checker_problem(bad, bad) is None  # invalid as given: not the rewrite's doing


# --- 5. false success ---------------------------------------------------------------------------


@pytest.mark.parametrize("where, code", [("factory", 0), ("factory", 1), ("module", 0), ("example_inputs", None)])
def test_user_code_that_exits_or_raises_is_a_user_error(tmp_path, where, code):
    exits = f"sys.exit({code})" if code is not None else "raise RuntimeError('no inputs today')"
    body = textwrap.dedent(f"""
        import sys
        import torch
        {exits if where == "module" else ""}

        def build():
            {exits if where == "factory" else "return torch.nn.Conv2d(3, 4, 1)"}

        def example_inputs():
            {exits if where == "example_inputs" else "return (torch.zeros(1, 3, 4, 4),)"}
    """)
    factory = tmp_path / "net.py"
    factory.write_text(body)
    result = subprocess.run([*CONVEXPORT, "optimize", f"{factory}:build", "-o", str(tmp_path / "o.onnx")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert ("sys.exit" in result.stderr) if code is not None else ("no inputs today" in result.stderr)
    assert not (tmp_path / "o.onnx").exists()


def test_a_factory_that_closes_stdout_still_gets_its_summary(tmp_path):
    factory = tmp_path / "net.py"
    factory.write_text(textwrap.dedent("""
        import sys
        import torch

        def build():
            sys.stdout.close()
            return torch.nn.Conv2d(3, 4, 1), (torch.zeros(1, 3, 4, 4),)
    """))
    result = subprocess.run([*CONVEXPORT, "optimize", f"{factory}:build", "-o", str(tmp_path / "o.onnx"),
                             "--no-profile"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "nodes" in result.stdout and (tmp_path / "o.onnx").exists()


def test_a_closed_pipe_on_stdout_is_not_an_error(model, tmp_path):
    """`convexport ... | head -0`: the reader went away; the work is done, exit 0, no message."""
    process = subprocess.Popen([*CONVEXPORT, "optimize", str(model), "-o", str(tmp_path / "o.onnx"), "--no-profile",
                                "--report", "-"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    assert process.wait(timeout=300) == 0
    assert process.stderr.read() == b""


# --- 6. names and sizes the system refuses ------------------------------------------------------


def test_an_output_name_of_255_bytes_is_written(model, tmp_path):
    name = "o" * 250 + ".onnx"
    result = invoke("optimize", model, "-o", tmp_path / name, "--no-profile")
    assert result.exit_code == 0, result.output
    assert (tmp_path / name).exists() and no_temporary_files(tmp_path)


@pytest.mark.parametrize("make", [
    lambda tmp: tmp / ("o" * 300 + ".onnx"),                    # a name over 255 bytes
    lambda tmp: tmp / "/".join(["d" * 200] * 25) / "o.onnx",    # a path over 4096 bytes
])
def test_names_the_system_refuses_are_user_errors(model, tmp_path, make):
    """One line and exit 1 (it was an internal error, exit 70), as an output and as the model."""
    assert_user_error(invoke("optimize", model, "-o", make(tmp_path), "--no-profile"), "convexport: ")
    assert_user_error(invoke("optimize", make(tmp_path)), "convexport: ")


def test_a_model_name_that_is_not_utf8_works(model, tmp_path):
    odd = os.fsencode(str(tmp_path)) + b"/caf\xe9.onnx"
    os.link(model, odd)
    result = subprocess.run([*[os.fsencode(a) for a in CONVEXPORT], b"optimize", odd, b"--no-profile"],
                            capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert os.path.exists(os.fsencode(str(tmp_path)) + b"/caf\xe9.opt.onnx")


@pytest.mark.parametrize("spec", ["x:99999999999999999999x3", "x:1x3x100000x100000x100"])
def test_oversized_input_dims_are_user_errors(small_net_path, spec):
    assert_user_error(invoke("optimize", f"{small_net_path}:build", "--input", spec), "--input", "at most")


@pytest.mark.parametrize("text", ["rules: " + "[" * 50000 + "]" * 50000,
                                  "rules:\n" + "".join(" " * i + "- \n" for i in range(1000))])  # under 1 MiB
def test_deeply_nested_yaml_is_a_user_error_not_a_crash(tmp_path, text):
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    result = subprocess.run([*CONVEXPORT, "rules", "check", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "nested deeper than" in result.stderr, result.stderr


# --- 7. nothing silently ignored or cut ---------------------------------------------------------


def test_onnx_runtimes_reason_reaches_the_user_whole(tmp_path):
    model = conv_bn()
    model.ir_version = onnx.IR_VERSION  # what onnx.helper.make_model writes: newer than ONNX Runtime reads
    path = tmp_path / "new_ir.onnx"
    onnx.save(model, path)
    result = invoke("optimize", path, "-o", tmp_path / "o.onnx", "--no-profile")
    assert result.exit_code == 1 and "IR version" in result.stderr, result.stderr
    assert "onnxruntime_src" not in result.stderr


@pytest.mark.parametrize("opset", [12, 99])
def test_an_opset_that_cannot_be_had_is_refused(small_net_path, tmp_path, opset):
    assert_user_error(invoke("export", f"{small_net_path}:build", "-o", tmp_path / "x.onnx", "--opset", opset),
                      f"--opset {opset}")


def test_an_input_type_that_contradicts_the_onnx_model_is_refused(model, tmp_path):
    assert_user_error(invoke("optimize", model, "--input", "x:1x3x8x8:float16", "-o", tmp_path / "o.onnx"),
                      "is float32")
    assert invoke("optimize", model, "--input", "x:1x3x8x8:float32", "-o", tmp_path / "o.onnx",
                  "--no-profile").exit_code == 0


def test_a_tolerance_for_an_output_that_does_not_exist_is_refused(model, tmp_path):
    result = invoke("optimize", model, "-o", tmp_path / "o.onnx", "--rtol", "nope:1e-3", "--no-profile")
    assert_user_error(result, "--rtol nope", "no such output", "outputs: y")


@pytest.mark.parametrize("value", ["inf", "nan", "-1"])
def test_a_tolerance_that_is_not_a_finite_number_is_refused(model, value):
    assert_user_error(invoke("optimize", model, "--rtol", value), "finite number")


def test_a_rules_folder_without_rule_files_is_refused(model, tmp_path):
    (tmp_path / "empty").mkdir()
    assert_user_error(invoke("optimize", model, "--rules", tmp_path / "empty"), "without rule files")


def test_validate_inputs_of_the_wrong_kind_are_refused(model, tmp_path):
    np.savez(tmp_path / "data.npz", x=np.ones([1, 3, 8, 8], np.int64))
    assert_user_error(invoke("validate", model, model, "--inputs", tmp_path / "data.npz"), "is int64", "float32")


def test_a_fifo_or_folder_as_model_says_what_it_is(tmp_path):
    fifo = tmp_path / "m.onnx"
    os.mkfifo(fifo)
    assert_user_error(invoke("optimize", fifo), "not a regular file")
    folder = tmp_path / "d.onnx"
    folder.mkdir()
    assert_user_error(invoke("optimize", folder), "is a folder")


def test_stderr_stays_one_line_when_numpy_would_warn(tmp_path):
    """x / 0 per channel after a Conv: numpy warns while the fold is weighed (and refused)."""
    weights = {"w": RNG.standard_normal([2, 3, 1, 1]).astype(np.float32), "k": np.array([[[[0.0]], [[2.0]]]], np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Div", ["c", "k"], ["y"])]
    path = tmp_path / "div0.onnx"
    onnx.save(make_model(nodes, [tensor("x", [1, 3, 4, 4])], [tensor("y", [1, 2, 4, 4])], weights), path)
    result = subprocess.run([*CONVEXPORT, "optimize", str(path), "-o", str(tmp_path / "o.onnx"), "--no-profile",
                             "--report", str(tmp_path / "r.json")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert any("inf or NaN" in entry["reason"] for entry in report["skipped"])


def test_reports_are_standard_json_whatever_the_numbers():
    from convexport.report.words import as_json_text  # what write_json writes (a report's schema aside)

    text = as_json_text({"a": float("inf"), "b": [float("nan"), 1.5], "c": np.float32(2.0)})
    assert json.loads(text) == {"a": None, "b": [None, 1.5], "c": 2.0}
