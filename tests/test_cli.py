"""The command line: exit codes and one-line messages for bad input; never a traceback."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from helpers import assert_user_error, invoke
from small_net import example_inputs, make_module


def test_missing_file(tmp_path):
    assert_user_error(invoke("optimize", tmp_path / "nope.onnx"), "nope.onnx", "no such file")


def test_not_a_model(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("these are not the weights you are looking for")
    assert_user_error(invoke("optimize", path), "notes.onnx", "not a readable ONNX model")


def test_truncated_onnx(tmp_path, small_net_path):
    whole = tmp_path / "whole.onnx"
    assert invoke("export", f"{small_net_path}:build", "-o", whole).exit_code == 0
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    assert_user_error(invoke("optimize", cut), "cut.onnx", "copied whole")


def test_unknown_suffix(tmp_path):
    path = tmp_path / "model.h5"
    path.write_bytes(b"\x89HDF")
    assert_user_error(invoke("optimize", path), "model.h5", "unknown model type", ".onnx")


@pytest.mark.parametrize("spec, fragment", [
    ("x", "NAME:DIMS"), ("x:", "NAME:DIMS"), ("x:1x3xx4", "bad dimension"), ("x:-1x3", "bad dimension"),
    (":1x2", "NAME:DIMS"), ("x:1x3x4:complex7", "unknown dtype 'complex7'"),
])
def test_malformed_input_spec(small_net_path, spec, fragment):
    assert_user_error(invoke("optimize", f"{small_net_path}:build", "--input", spec), f"--input {spec!r}", fragment)


@pytest.mark.parametrize("given", [[], ["--input", "x:0x4"]])
def test_an_empty_dim_is_an_empty_dim(tmp_path, given):
    """A graph input declared [0, 4] was fed as if its 0 were dynamic (1x4), while --input x:0x4
    was refused "bad dimension '0'": both are the empty tensor the model declares."""
    import json

    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [0, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [0, 4])],
    )  # fmt: skip
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, tmp_path / "m.onnx")
    report = tmp_path / "r.json"
    done = invoke("optimize", tmp_path / "m.onnx", *given, "--no-profile", "-o", tmp_path / "o.onnx", "--report", report)
    assert done.exit_code == 0, done.output
    assert json.loads(report.read_text())["validation"]["inputs"] == ["x:0x4:float32"]


def test_an_input_given_twice(small_net_path, tmp_path):
    assert_user_error(invoke("optimize", f"{small_net_path}:build", "--input", "x:1x3x8x8", "--input", "x:1x3x9x9"),
                      "--input x: given more than once")
    model = _conv_model(tmp_path / "m.onnx", ["N", 3, "H", "W"])
    for command in ("validate", "profile"):
        args = [model, model] if command == "validate" else [model]
        assert_user_error(invoke(command, *args, "--input", "x:1x3x9x9", "--input", "x:1x3x9x9"), "given more than once")


def test_pickled_module_needs_trust(tmp_path):
    path = tmp_path / "pickled.pt"
    torch.save(make_module(), path)
    assert_user_error(invoke("optimize", path), "pickled.pt", "--trust-pickle")


def test_state_dict_is_not_a_model(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save(make_module().state_dict(), path)
    assert_user_error(invoke("optimize", path), "weights.pt", "state_dict")


def test_torchscript_without_input_asks_for_it(tmp_path):
    path = tmp_path / "net.pt"
    torch.jit.save(torch.jit.trace(make_module(), example_inputs()), path)
    assert_user_error(invoke("optimize", path), "net.pt", "--input")


class _ReturnsDict(torch.nn.Module):
    def forward(self, x):
        return {"doubled": x * 2, "summed": x.sum(dim=1)}


def test_torchscript_archive_returning_a_dict_says_how_to_save_it(tmp_path):
    # a module traced with strict=False keeps its dict of outputs, which the TorchScript
    # exporter has no translation for: a user error with the way out, not an internal one
    path = tmp_path / "dict.pt"
    torch.jit.save(torch.jit.trace(_ReturnsDict(), torch.randn(1, 3), strict=False), path)
    assert_user_error(invoke("optimize", path, "--input", "x:1x3"), "dict.pt", "ONNX export failed", "returns a dict",
                      "tuple")


@pytest.mark.parametrize("factory, fragment", [
    ("build_broken", "factory failed on purpose"), ("not_a_model", "expected an nn.Module"),
    ("no_such_factory", "no callable"),
])
def test_bad_factories(small_net_path, factory, fragment):
    assert_user_error(invoke("optimize", f"{small_net_path}:{factory}"), fragment)


def test_bad_option_values(small_net_path):
    assert_user_error(invoke("optimize", f"{small_net_path}:build", "--strategy", "fastest"), "expected one of all, cost, measure")
    assert_user_error(invoke("optimize", f"{small_net_path}:build", "--device", "tpu"), "--device")


def test_usage_error_exits_2():
    assert invoke("optimize").exit_code == 2
    assert invoke("optimize", "a.onnx", "--no-such-flag").exit_code == 2


def test_optimize_writes_output_and_report(small_net_path, tmp_path):
    out, report = tmp_path / "net.opt.onnx", tmp_path / "r.json"
    result = invoke("optimize", f"{small_net_path}:build", "-o", out, "--report", report, "--no-profile")
    assert result.exit_code == 0, result.output
    assert out.exists() and json.loads(report.read_text())["output"] == str(out)
    assert "validation: passed" in result.stdout
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_console_script_runs_as_a_module(tmp_path):
    completed = subprocess.run([sys.executable, "-m", "convexport", "optimize", str(tmp_path / "x.onnx")],
                               capture_output=True, text=True)
    assert completed.returncode == 1 and completed.stderr.count("\n") == 1 and "Traceback" not in completed.stderr


@pytest.fixture(scope="module")
def exported_pair(tmp_path_factory, small_net_path):
    folder = tmp_path_factory.mktemp("pair")
    assert invoke("optimize", f"{small_net_path}:build", "-o", folder / "opt.onnx", "--no-profile").exit_code == 0
    assert invoke("export", f"{small_net_path}:build", "-o", folder / "ref.onnx").exit_code == 0
    return folder


def test_validate_passes_on_the_optimized_model(exported_pair):
    report = exported_pair / "v.json"
    result = invoke("validate", exported_pair / "ref.onnx", exported_pair / "opt.onnx", "--report", report)
    assert result.exit_code == 0, result.output
    assert json.loads(report.read_text())["passed"] is True


def test_validate_fails_with_exit_3_on_a_perturbed_weight(exported_pair, tmp_path):
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(exported_pair / "opt.onnx"))
    weight = max(model.graph.initializer, key=lambda init: np.prod(init.dims))
    values = numpy_helper.to_array(weight).copy()
    values *= 1.01
    weight.CopyFrom(numpy_helper.from_array(values, weight.name))
    onnx.save(model, str(tmp_path / "nudged.onnx"))
    result = invoke("validate", exported_pair / "ref.onnx", tmp_path / "nudged.onnx")
    assert result.exit_code == 3, result.output
    assert "does not match" in result.stderr


def test_validate_with_inputs_npz(exported_pair, tmp_path):
    import numpy as np

    data = tmp_path / "data.npz"
    np.savez(data, input=np.ones((1, 3, 16, 16), np.float32))  # nn.Sequential's argument name
    result = invoke("validate", exported_pair / "ref.onnx", exported_pair / "opt.onnx", "--inputs", data, "--runs", 0)
    assert result.exit_code == 0 and "over 1 run" in result.stdout
    np.savez(data, y=np.ones((1, 3, 16, 16), np.float32))
    assert_user_error(invoke("validate", exported_pair / "ref.onnx", exported_pair / "opt.onnx", "--inputs", data),
                      "lacks arrays for input(s) input")


def test_profile_command(exported_pair, tmp_path):
    report = tmp_path / "p.json"
    result = invoke("profile", exported_pair / "opt.onnx", "--device", "cpu", "--runs", 5, "--report", report)
    assert result.exit_code == 0, result.output
    latency = json.loads(report.read_text())["model"]["latency_ms"]
    assert 0 < latency["min"] <= latency["median"] <= latency["p90"]
    # the op types in order of their time: which comes first is the machine's (a loaded one has
    # timed ReorderOutput over Conv)
    per_op = result.stdout.split("ms per op type: ", 1)[1]
    assert re.match(r"(\w+ [\d.]+, )*Conv [\d.]+", per_op), result.stdout


def test_latency_alone_skips_the_per_op_pass(exported_pair, tmp_path):
    report = tmp_path / "p.json"
    result = invoke("profile", exported_pair / "opt.onnx", "--device", "cpu", "--runs", 5, "--no-per-op",
                    "--report", report)
    assert result.exit_code == 0, result.output
    measured = json.loads(report.read_text())["model"]
    assert "op_time_ms" not in measured and "per_op" not in measured["phases_s"] and "per op" not in result.stdout
    optimized = invoke("optimize", exported_pair / "ref.onnx", "-o", tmp_path / "o.onnx", "--device", "cpu",
                       "--no-per-op", "--report", tmp_path / "o.json", "--html", tmp_path / "o.html")
    assert optimized.exit_code == 0, optimized.output
    profiled = json.loads((tmp_path / "o.json").read_text())["profile"]
    assert profiled["before"]["latency_ms"]["median"] > 0 and "op_time_ms" not in profiled["after"]


def test_rules_commands(tmp_path):
    listed = invoke("rules", "list")
    assert listed.exit_code == 0 and "conv-conv" in listed.stdout and "20_linear_chain.yaml" in listed.stdout
    # the columns line up, however long the longest name (concat-relu-linear-branches ran into its file)
    starts = {line.index("rules/") for line in listed.stdout.splitlines() if "rules/" in line}
    assert len(starts) == 1 and "concat-relu-linear-branches  rules/" in listed.stdout
    shown = invoke("rules", "show", "conv-conv")
    assert shown.exit_code == 0 and "y = Conv(h, w2, b2?)" in shown.stdout
    assert_user_error(invoke("rules", "show", "no-such-rule"), "no rule named")
    builtin = invoke("rules", "check", "--builtin")  # an installed user's way: no rules/ folder there
    assert builtin.exit_code == 0 and builtin.stdout.strip().endswith("rule(s) OK"), builtin.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - name: a\n    doc: d\n    match: [y = Nope(x)]\n    apply: forward_input\n")
    assert_user_error(invoke("rules", "check", bad), f"{bad}:4:", "unknown ONNX op")


def test_user_rules_folder_alone(small_net_path, tmp_path):
    folder = tmp_path / "my_rules"
    folder.mkdir()
    (folder / "only_chain.yaml").write_text(
        "rules:\n  - name: my-conv-conv\n    doc: mine\n    match:\n      - h = Conv(x, w1:const, b1:const?)\n"
        "      - y = Conv(h, w2:const, b2:const?)\n    require: {private: [h]}\n    apply: compose_linear\n")
    report = tmp_path / "r.json"
    result = invoke("optimize", f"{small_net_path}:build", "-o", tmp_path / "o.onnx", "--no-profile",
                    "--rules", folder, "--no-builtin-rules", "--report", report)
    assert result.exit_code == 0, result.output
    rewrites = json.loads(report.read_text())["rewrites"]
    assert [r["rule"] for r in rewrites] == ["my-conv-conv"] and rewrites[0]["file"].endswith("only_chain.yaml")


def test_bad_user_rule_file_exits_1_with_its_line(small_net_path, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - name: a\n    doc: d\n    match: [y = Conv(x, w)]\n    apply: nothing_like_it\n")
    assert_user_error(invoke("optimize", f"{small_net_path}:build", "--rules", bad), f"{bad}:5:", "unknown primitive")


def test_cuda_without_a_gpu_is_a_user_error(small_net_path, monkeypatch):
    monkeypatch.setattr("convexport.runtime.cuda_usable", lambda: False)
    assert_user_error(invoke("optimize", f"{small_net_path}:build", "--device", "cuda"), "--device cuda")


def test_missing_output_folder_and_overwriting_the_input(small_net_path, tmp_path, monkeypatch):
    assert_user_error(invoke("optimize", f"{small_net_path}:build", "-o", tmp_path / "no" / "o.onnx"), "does not exist")
    monkeypatch.chdir(tmp_path)  # the folder as written, relative (docs/commands.md shows it so)
    (tmp_path / "afile").write_text("not a folder")
    assert_user_error(invoke("optimize", f"{small_net_path}:build", "-o", "out/x.onnx"),
                      "out/x.onnx: folder out does not exist")  # fmt: skip
    assert_user_error(invoke("optimize", f"{small_net_path}:build", "-o", "afile/x.onnx"),
                      "afile/x.onnx: afile is a file, not a folder")  # fmt: skip
    model = tmp_path / "m.onnx"
    assert invoke("export", f"{small_net_path}:build", "-o", model).exit_code == 0
    before = model.read_bytes()
    assert_user_error(invoke("optimize", model, "-o", model), "is the input", "the input is never modified")
    assert model.read_bytes() == before


def test_internal_error_is_one_line_with_exit_70(small_net_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("something convexport did not expect")
    monkeypatch.setattr("convexport.pipeline.optimize", broken)
    result = invoke("optimize", f"{small_net_path}:build")
    assert result.exit_code == 70 and "internal error" in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


def _conv_model(path, input_dims, input_type=onnx.TensorProto.FLOAT, channels=3, external_weight=False):
    """x -> Conv(4 filters, 3x3, no padding) -> y, built by hand (weights for `channels` inputs)."""
    weight = onnx.numpy_helper.from_array(np.ones((4, channels, 3, 3), np.float32), "w")
    if external_weight:                 # points at a data file that is not there
        weight.ClearField("raw_data")
        weight.data_location = onnx.TensorProto.EXTERNAL
        entry = weight.external_data.add()
        entry.key, entry.value = "location", "missing.bin"
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Conv", ["x", "w"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", input_type, input_dims)],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 4, "h", "w"])], [weight])
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)], ir_version=9), path)
    return path


def test_missing_external_data_is_a_user_error(tmp_path):
    model = _conv_model(tmp_path / "m.onnx", [1, 3, 8, 8], external_weight=True)
    assert_user_error(invoke("optimize", model), "m.onnx", "not a readable ONNX model", "missing.bin")


def _pool_model(path, input_dims):
    """x -> MaxPool(3x3) -> y: no weights to read sizes from."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, input_dims)],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 3, "h", "w"])])
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)], ir_version=9), path)
    return path


def test_dynamic_dims_too_small_for_the_model_ask_for_input_sizes(tmp_path):
    """Made-up sizes (dynamic dims 1) that the model cannot run on: one line on stderr, ONNX
    Runtime's own log included, naming the shapes and --input; with --input it works."""
    model = _pool_model(tmp_path / "m.onnx", ["N", 3, "H", "W"])
    completed = subprocess.run([sys.executable, "-m", "convexport", "optimize", str(model), "--no-profile"],
                               capture_output=True, text=True)
    assert completed.returncode == 1, completed.stderr
    assert completed.stderr.count("\n") == 1 and "Traceback" not in completed.stderr, completed.stderr
    assert "cannot run" in completed.stderr and "x:1x3x1x1" in completed.stderr and "--input" in completed.stderr
    assert invoke("optimize", model, "--input", "x:1x3x9x9", "--no-profile").exit_code == 0
    assert_user_error(invoke("profile", model, "--runs", "1"), "the model profiled as 'model'", "--input")
    assert invoke("profile", model, "--runs", "1", "--input", "x:1x3x9x9").exit_code == 0
    assert_user_error(invoke("validate", model, model), "cannot run the reference model", "--input")
    assert invoke("validate", model, model, "--input", "x:2x3x9x9").exit_code == 0


def test_an_images_dynamic_dims_are_sized_by_the_conv_that_reads_it(tmp_path):
    """Dynamic channels and spatial dims a 3x3 Conv reads: made-up data takes its channels and
    the smallest size it runs at; the written model keeps every dim's name."""
    model = _conv_model(tmp_path / "m.onnx", ["N", "C", "H", "W"])
    out = tmp_path / "out.onnx"
    result = invoke("optimize", model, "-o", out, "--no-profile", "--report", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    validated = json.loads((tmp_path / "r.json").read_text())["validation"]["inputs"]
    assert validated == ["x:Nx3x3x3:float32"]
    dims = [d.dim_param for d in onnx.load(out).graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["N", "C", "H", "W"]
    assert invoke("profile", model, "--runs", "1").exit_code == 0
    assert invoke("validate", model, model).exit_code == 0


def test_a_model_that_cannot_run_is_a_user_error(tmp_path):
    model = _conv_model(tmp_path / "m.onnx", [1, 5, 8, 8])      # 5 input channels, weights for 3
    assert_user_error(invoke("optimize", model), "m.onnx (as exported)", "cannot run", "x:1x5x8x8")


def test_an_input_convexport_makes_no_data_for(tmp_path):
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.STRING, [2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.STRING, [2])])
    model = tmp_path / "s.onnx"
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)], ir_version=9), model)
    assert_user_error(invoke("optimize", model), "input 'x' is string", "--no-validate --no-profile")
    assert_user_error(invoke("profile", model), "input 'x' is string")
    assert invoke("optimize", model, "--no-validate", "--no-profile").exit_code == 0


@pytest.mark.parametrize("name, text, fragment", [
    ("wrong_shapes.py", "import torch\ndef build():\n    return torch.nn.Linear(3, 4), (torch.randn(2, 5),)\n",
     "does not run on the example inputs"),
    ("garbage.pt2", "not an archive", "not a torch.export archive"),
])
def test_torch_failures_print_one_line_and_no_log_of_torchs_own(tmp_path, name, text, fragment):
    """torch logs a traceback (fake tensors, archive loading) and prints graphs to stderr when
    an export or a load fails: none of it may reach the terminal beside convexport's line."""
    path = tmp_path / name
    path.write_text(text)
    completed = subprocess.run([sys.executable, "-m", "convexport", "optimize", str(path)], capture_output=True, text=True)
    assert completed.returncode == 1 and completed.stderr.count("\n") == 1, completed.stderr
    assert fragment in completed.stderr and "Traceback" not in completed.stderr


def test_outputs_that_cannot_be_written_are_user_errors(small_net_path, tmp_path, monkeypatch):
    """A folder given as the output, a report whose folder is missing (found before the model
    is written), and a folder no file can be made in (read-only, /proc): one line each, and
    nothing left behind."""
    assert_user_error(invoke("optimize", f"{small_net_path}:build", "-o", tmp_path, "--no-profile"),
                      "is a folder; give a file name")
    for option in ("--report", "--html"):
        assert_user_error(invoke("optimize", f"{small_net_path}:build", "-o", tmp_path / "m.onnx", "--no-profile",
                                 option, tmp_path / "no" / "r"), "folder", "does not exist")
    assert list(tmp_path.iterdir()) == []

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr("convexport.util.temporaries.tempfile.mkstemp", refused)
    assert_user_error(invoke("optimize", f"{small_net_path}:build", "-o", tmp_path / "m.onnx", "--no-profile"),
                      f"-o {tmp_path / 'm.onnx'}: cannot write in {tmp_path} (Permission denied); nothing was written")
    assert list(tmp_path.iterdir()) == []


def test_validate_with_arrays_the_model_cannot_take(tmp_path):
    """The user's own arrays: the line names their shapes and does not suggest --input."""
    model = _conv_model(tmp_path / "m.onnx", ["N", 3, "H", "W"])
    data = tmp_path / "d.npz"
    np.savez(data, x=np.zeros((2, 2), np.float32))
    result = invoke("validate", model, model, "--inputs", data, "--runs", "0")
    assert_user_error(result, "d.npz: array 'x' is 2x2; the model's input x is Nx3xHxW")
    assert "--input" not in result.stderr


def test_a_model_onnx_runtime_cannot_load_is_named(tmp_path):
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Foo", ["x"], ["y"], domain="my.ops")], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 3])])
    model = tmp_path / "custom.onnx"
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18),
                                                           onnx.helper.make_opsetid("my.ops", 1)], ir_version=9), model)
    assert_user_error(invoke("optimize", model), "ONNX Runtime cannot load", "custom.onnx (as exported)", "my.ops:Foo")
    assert_user_error(invoke("profile", model), "ONNX Runtime cannot load the model profiled as 'model'")
    assert invoke("optimize", model, "--no-validate", "--no-profile", "-o", tmp_path / "o.onnx").exit_code == 0


def test_freeze_input_defaults_flag(tmp_path):
    model_path = _conv_model(tmp_path / "m.onnx", [1, 3, 8, 8])
    model = onnx.load(model_path)
    model.graph.input.append(onnx.helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [4, 3, 3, 3]))
    onnx.save(model, model_path)
    for flags, inputs in (([], ["x", "w"]), (["--freeze-input-defaults"], ["x"])):
        out = tmp_path / f"o{len(flags)}.onnx"
        assert invoke("optimize", model_path, "-o", out, "--no-profile", *flags).exit_code == 0
        assert [value.name for value in onnx.load(out).graph.input] == inputs
