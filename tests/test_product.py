"""What a new user meets first: the install's requirements on every platform, MODEL routes, the
Python API from a plain script, progress and timings, honest summaries, the conventions."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import helper
from packaging.requirements import Requirement
from typer.testing import CliRunner

import convexport
from convexport.cli import app
from convexport.errors import InternalError
from helpers import make_model, tensor
from test_hostile import conv_bn

runner = CliRunner()
CONVEXPORT = [sys.executable, "-m", "convexport"]

PLATFORMS = {
    "macOS arm64": {"platform_system": "Darwin", "platform_machine": "arm64", "sys_platform": "darwin"},
    "Linux aarch64": {"platform_system": "Linux", "platform_machine": "aarch64", "sys_platform": "linux"},
    "Linux x86-64": {"platform_system": "Linux", "platform_machine": "x86_64", "sys_platform": "linux"},
    "Windows x86-64": {"platform_system": "Windows", "platform_machine": "AMD64", "sys_platform": "win32"},
}


def runtime_requirements(platform: dict) -> set[str]:
    """The ONNX Runtime distributions the installed package's metadata asks for on `platform`
    (the metadata a wheel built from pyproject.toml carries)."""
    names = set()
    for text in importlib.metadata.requires("convexport"):
        requirement = Requirement(text)
        environment = {"extra": "", "python_version": "3.11", "os_name": "posix", **platform}
        if requirement.name.startswith("onnxruntime") and (
            requirement.marker is None or requirement.marker.evaluate(environment)
        ):
            names.add(requirement.name)
    return names


@pytest.mark.parametrize("platform, expected", [
    ("macOS arm64", {"onnxruntime"}), ("Linux aarch64", {"onnxruntime"}),
    ("Linux x86-64", {"onnxruntime-gpu"}), ("Windows x86-64", {"onnxruntime-gpu"}),
])
def test_each_platform_gets_exactly_one_onnx_runtime_that_exists_there(platform, expected):
    assert runtime_requirements(PLATFORMS[platform]) == expected


def test_a_dotted_factory_from_the_current_folder(tmp_path):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(textwrap.dedent("""
        import torch

        def build():
            return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4)).eval()
    """))
    result = subprocess.run([*CONVEXPORT, "optimize", "mypkg.nets:build", "--input", "x:1x3x8x8", "--no-profile"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert onnx.load(tmp_path / "nets.opt.onnx").graph.node[0].op_type == "Conv"


def test_a_factory_file_optimized_twice_writes_the_same_bytes(tmp_path):
    """The factory's module is named by its path, not by Python's per-process string hash: the
    name is in the exported graph's metadata, so the same file gave a different model each run."""
    (tmp_path / "net.py").write_text(textwrap.dedent("""
        import torch

        class Net(torch.nn.Module):  # its class is named in each node's metadata: net's module's name
            def __init__(self):
                super().__init__()
                self.conv, self.bn = torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4)

            def forward(self, x):
                return torch.relu(self.bn(self.conv(x)))

        def build():
            torch.manual_seed(0)
            return Net().eval()
    """))
    options = ["--input", "x:1x3x8x8", "--no-profile", "--no-validate", "-o"]
    # one run here, one in a process of another string hash seed (this one's is random)
    here = runner.invoke(app, ["optimize", f"{tmp_path / 'net.py'}:build", *options, str(tmp_path / "here.onnx")])
    assert here.exit_code == 0, here.output
    there = subprocess.run([*CONVEXPORT, "optimize", "net.py:build", *options, "there.onnx"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONHASHSEED": "1"})
    assert there.returncode == 0, there.stderr
    assert (tmp_path / "here.onnx").read_bytes() == (tmp_path / "there.onnx").read_bytes()


def test_the_api_from_a_script_without_a_main_guard(tmp_path):
    """Profiling measures peak memory in a process of its own: the script is not run again."""
    script = tmp_path / "plain.py"
    marker = tmp_path / "runs.txt"
    onnx.save(conv_bn(), tmp_path / "m.onnx")
    script.write_text(textwrap.dedent(f"""
        import convexport
        with open({str(marker)!r}, "a") as runs:
            runs.write("run\\n")
        result = convexport.optimize({str(tmp_path / "m.onnx")!r})
        profile = result.report["profile"]
        print(profile["verdict"] if profile else result.report["profile_skipped"])
    """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    # which one is the machine's: ONNX Runtime fuses the BatchNormalization itself, so the fold
    # can read slower by noise, and then the model as given is written, unprofiled
    verdicts = ("faster", "slower", "no measurable change",
                "every candidate was slower than the model as given, which is written")  # fmt: skip
    assert marker.read_text() == "run\n" and result.stdout.strip() in verdicts


def test_rules_and_inputs_may_be_one_string(tmp_path, small_net_path):
    rule_file = tmp_path / "mine.yaml"
    rule_file.write_text("rules:\n  - name: mine\n    doc: d\n    match: [y = Identity(x)]\n    apply: forward_input\n")
    result = convexport.optimize(f"{small_net_path}:build_module_only", inputs="x:1x3x16x16", rules=str(rule_file),
                                 builtin_rules=False, write=False, validate=False, profile=False)
    assert {entry["rule"] for entry in result.report["rewrites"]} <= {"mine"}
    assert result.report["inputs"] == ["x:1x3x16x16:float32"]


def test_the_api_raises_only_convexport_errors(tmp_path, monkeypatch):
    factory = tmp_path / "bye.py"
    factory.write_text("import sys\n\ndef build():\n    sys.exit(0)\n")
    with pytest.raises(convexport.ConvexportError, match="sys.exit"):
        convexport.optimize(f"{factory}:build")
    with pytest.raises(convexport.ConvexportError):
        convexport.optimize(conv_bn(), output=tmp_path / ("o" * 300 + ".onnx"))
    monkeypatch.setattr("convexport.stages.load.export_model", lambda *args: {}["a bug"])
    with pytest.raises(InternalError, match="KeyError") as raised:
        convexport.optimize(conv_bn(), write=False)
    assert isinstance(raised.value.__cause__, KeyError)


def test_progress_names_each_step_and_the_profiles_runs_and_the_report_times_them():
    seen = []
    result = convexport.optimize(conv_bn(), write=False, progress=seen.append)
    steps = list(dict.fromkeys(message.split(" (")[0] for message in seen))
    assert steps == ["loading", "exporting", "rewriting", "validating", "profiling on cpu"]
    pairs = [int(message.split("(")[1].split()[0]) for message in seen if message.endswith(" pairs)")]
    assert pairs and pairs == sorted(pairs) and pairs[-1] == result.report["profile"]["paired"]["pairs"]
    timings = result.report["timings_s"]
    assert set(timings) == {"loading", "exporting", "rewriting", "validating", "profiling", "total"}
    assert timings["total"] >= sum(seconds for step, seconds in timings.items() if step != "total") - 0.01


def test_an_unchanged_graph_is_not_timed_and_the_verdict_is_the_intervals():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [1, 64])], [tensor("y", [1, 64])])
    report = convexport.optimize(model, write=False).report
    assert report["profile"] is None and "nothing to time" in report["profile_skipped"]
    from convexport.stages.profile import judged_profile

    def verdict(speedup, low, high):
        side = {"latency_ms": {"median": 1.0}}
        paired = {"speedup": speedup, "low": low, "high": high, "pairs": 20, "stopped": "budget"}
        return judged_profile({"before": side, "after": side, "paired": paired})["verdict"]

    assert verdict(0.95, 0.9, 1.01) == "no measurable change"  # an interval holding 1 is no change
    assert verdict(0.95, 0.94, 0.96) == "slower"  # the same speedup, known better
    assert verdict(1.5, 1.2, 1.7) == "faster"
    assert verdict(0.5, 0.49, 0.51) == "slower"


def test_the_report_says_what_a_reader_needs(tmp_path):
    result = convexport.optimize(conv_bn(), output=tmp_path / "o.onnx")
    report = result.report
    assert report["outputs"] == ["y:1x4x8x8:float32"] and report["inputs"] == ["x:1x3x8x8:float32"]
    assert report["before"]["model_bytes"] > 0 and report["after"]["model_bytes"] > 0
    assert report["size_regression"] is False
    environment = report["environment"]
    assert environment["provider"] == "CPUExecutionProvider" and environment["onnxruntime"] and environment["cpu"]
    assert all(entry["file"] == "rules/20_linear_chain.yaml" for entry in report["rewrites"])
    assert "memory_regression" in report["profile"]


def test_a_larger_model_file_is_flagged(tmp_path):
    """seed 003's FFT form: its transformed kernel is larger than the kernel it replaces."""
    from convexport.report.sections import print_optimize_summary
    from rich.console import Console

    report = {"model": "m", "output": None, "before": {"nodes": 1, "ops": {}, "flops": 1, "params": 1, "model_bytes": 1000},
              "after": {"nodes": 1, "ops": {}, "flops": 1, "params": 1, "model_bytes": 9000}, "rewrites": [],
              "skipped": [{"rule": "r", "nodes": ["n"], "reason": f"why {i}"} for i in range(6)],
              "size_regression": True, "inputs": ["x:1x3x8x8:float32"], "outputs": ["y:1x4x8x8:float32"]}
    console = Console(record=True, width=200)
    print_optimize_summary(report, console)
    text = console.export_text()
    assert "model file larger: 1.0 KB -> 9.0 KB" in text and "skipped: 6" in text and "first 5" in text
    assert "inputs x:1x3x8x8:float32; outputs y:1x4x8x8:float32" in text
    from convexport.report.sections import render

    page = render({**report, "convexport_version": "0", "validation": None, "profile": None})
    assert "x:1x3x8x8:float32" in page and "class=bad>model file" in page


def test_version_short_help_and_quiet(tmp_path):
    assert runner.invoke(app, ["--version"]).stdout.strip() == f"convexport {convexport.__version__}"
    assert "Usage" in runner.invoke(app, ["-h"]).stdout
    onnx.save(conv_bn(), tmp_path / "m.onnx")
    quiet = runner.invoke(app, ["optimize", str(tmp_path / "m.onnx"), "-q", "--no-profile"])
    assert quiet.exit_code == 0 and quiet.stdout == "" and (tmp_path / "m.opt.onnx").exists()


def test_optimize_validates_on_real_data_too(tmp_path):
    onnx.save(conv_bn(), tmp_path / "m.onnx")
    np.savez(tmp_path / "data.npz", x=np.full([1, 3, 8, 8], 3.0, np.float32))
    result = runner.invoke(app, ["optimize", str(tmp_path / "m.onnx"), "--inputs", str(tmp_path / "data.npz"),
                                 "--no-profile", "--report", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "r.json").read_text())["validation"]["runs"] == 4


def test_a_scan_bodys_op_time_stays_out_of_the_top_level_chart():
    """The Scan node's time includes its body's; the body's Relu is not counted again."""
    from convexport.load.inputs import InputSpec
    from convexport.profile.profiler import TimingSettings, profile_models

    body = helper.make_graph(
        [helper.make_node("Relu", ["row"], ["out"], name="body_relu")], "body",
        [helper.make_tensor_value_info("row", onnx.TensorProto.FLOAT, [64])],
        [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [64])],
    )
    nodes = [helper.make_node("Scan", ["x"], ["y"], name="scan", body=body, num_scan_inputs=1)]
    model = make_model(nodes, [tensor("x", [8, 64])], [tensor("y", [8, 64])])
    measured = profile_models({"m": model}, [InputSpec("x", (8, 64))], "cpu", TimingSettings(runs=5, warmup=1, memory=False))
    assert set(measured["m"]["op_time_ms"]) == {"Scan"}
