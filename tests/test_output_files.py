"""What a run leaves on disk when it is killed, raced or refused (issue 49, items 4, 6, 7 and 8):
a model and its weights file are replaced as a pair, nothing is written through a link the
program did not make, a destination that cannot be written is refused before any output is,
and a killed run's temporary files are removed by the next run in that folder.

A small model takes the path of one of 1 GiB of weights with the thresholds lowered (in this
process by monkeypatch, in a child by setting them before it runs)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import assert_user_error, invoke, make_model, tensor
from onnx import helper

import convexport
from convexport import ir
from convexport.util import temporaries
from convexport.util.files import write_atomically
from convexport.ir.saving import is_weights_file_of

LARGE_PATH = """
import convexport.ir.large as large
large.EXTERNAL_DATA_THRESHOLD = 100
large.EXTERNAL_TENSOR_MIN_BYTES = 10
"""


def conv_bn(seed: int, channels: int = 4) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    weights = {
        "w": rng.standard_normal((channels, 3, 3, 3)).astype(np.float32),
        "scale": rng.uniform(0.5, 2, channels).astype(np.float32),
        "shift": rng.standard_normal(channels).astype(np.float32),
        "mean": rng.standard_normal(channels).astype(np.float32),
        "var": rng.uniform(0.5, 2, channels).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["y"]),
    ]
    return make_model(nodes, [tensor("x", [1, 3, 8, 8])], [tensor("y", [1, channels, 8, 8])], weights)


X = {"x": np.random.default_rng(9).standard_normal((1, 3, 8, 8)).astype(np.float32)}


def result_of(path: Path) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, X)[0]


def weights_files(folder: Path, model_name: str = "out.onnx") -> list[str]:
    return sorted(path.name for path in folder.iterdir() if is_weights_file_of(path.name, model_name))


def run_child(script: str, args_after: list[str] = ()) -> subprocess.Popen:
    """A Python process running `script` on the large-model path, with `args_after` as sys.argv[1:]."""
    return subprocess.Popen([sys.executable, "-c", LARGE_PATH + textwrap.dedent(script), *args_after])


@pytest.fixture
def large_path(monkeypatch):
    monkeypatch.setattr("convexport.ir.large.EXTERNAL_DATA_THRESHOLD", 100)
    monkeypatch.setattr("convexport.ir.large.EXTERNAL_TENSOR_MIN_BYTES", 10)


# --- item 6: the model and its weights are replaced as a pair ------------------------------------


def test_a_kill_between_the_two_renames_leaves_the_old_pair_whole(tmp_path, large_path):
    first = convexport.optimize(conv_bn(0), output=tmp_path / "out.onnx", profile=False)
    expected = result_of(first.output)
    onnx.save(conv_bn(1), tmp_path / "b.onnx")
    child = run_child(f"""
        import os, signal
        import convexport
        real = os.replace
        def replace(source, target):  # the weights file goes first: killed right after it
            real(source, target)
            if str(target).endswith(".data"):
                os.kill(os.getpid(), signal.SIGKILL)
        os.replace = replace
        convexport.optimize({str(tmp_path / "b.onnx")!r}, output={str(tmp_path / "out.onnx")!r}, profile=False)
    """)
    assert child.wait(timeout=120) == -signal.SIGKILL
    np.testing.assert_array_equal(result_of(tmp_path / "out.onnx"), expected)  # the old pair, whole
    assert len(weights_files(tmp_path)) == 2  # and the killed run's orphan
    again = convexport.optimize(str(tmp_path / "b.onnx"), output=tmp_path / "out.onnx", profile=False)
    assert weights_files(tmp_path) == [again.output_weights.name]  # the orphan and the replaced one removed
    np.testing.assert_allclose(result_of(again.output), result_of(tmp_path / "b.onnx"), rtol=1e-5, atol=1e-5)


def test_two_runs_writing_the_same_output_leave_one_whole_pair(tmp_path):
    """The second run puts its pair in place while the first is between its two renames: the
    first must not end with its model over the second's weights (the folder's lock makes the
    second wait), and the pair left is the second's. The two models differ in shape, so that
    neither's model reads the other's weights file as its own."""
    for seed in (0, 1):
        onnx.save(conv_bn(seed, channels=4 + 2 * seed), tmp_path / f"m{seed}.onnx")
    between = tmp_path / "first-is-between-its-renames"
    script = """
        import os, sys, time
        from pathlib import Path
        import onnx
        import convexport
        model, output, role, between = sys.argv[1:]
        real_replace, real_save = os.replace, onnx.save
        def replace(source, target):
            real_replace(source, target)
            if role == "first" and str(target).endswith(".data"):
                Path(between).touch()
                time.sleep(3)
        def save(model, path, *args, **kwargs):  # the second writes its output once the first is between its renames
            while role == "second" and str(path).endswith(".tmp") and not Path(between).exists():
                time.sleep(0.05)
            real_save(model, path, *args, **kwargs)
        os.replace, onnx.save = replace, save
        convexport.optimize(model, output=output, profile=False)
    """
    children = [
        run_child(script, args_after=[str(tmp_path / f"m{seed}.onnx"), str(tmp_path / "out.onnx"), role, str(between)])
        for seed, role in ((0, "first"), (1, "second"))
    ]
    try:
        assert [child.wait(timeout=180) for child in children] == [0, 0]
    finally:  # a run that waits forever (a lock never released) must not outlive the test
        for child in children:
            child.kill()
    np.testing.assert_allclose(result_of(tmp_path / "out.onnx"), result_of(tmp_path / "m1.onnx"), rtol=1e-5, atol=1e-5)
    assert len(weights_files(tmp_path)) == 1


def test_a_model_that_no_longer_needs_a_weights_file_removes_the_one_it_replaces(tmp_path, monkeypatch):
    monkeypatch.setattr("convexport.ir.large.EXTERNAL_DATA_THRESHOLD", 100)
    monkeypatch.setattr("convexport.ir.large.EXTERNAL_TENSOR_MIN_BYTES", 10)
    convexport.optimize(conv_bn(0), output=tmp_path / "out.onnx", profile=False)
    assert len(weights_files(tmp_path)) == 1
    monkeypatch.undo()
    (tmp_path / "other.onnx.data").write_bytes(b"not ours")  # another model's: never touched
    result = convexport.optimize(conv_bn(1), output=tmp_path / "out.onnx", profile=False)
    assert result.output_weights is None and weights_files(tmp_path) == []
    assert (tmp_path / "other.onnx.data").read_bytes() == b"not ours"
    np.testing.assert_allclose(result_of(result.output), result_of_model(conv_bn(1)), rtol=1e-5, atol=1e-5)


def result_of_model(model: onnx.ModelProto) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, X)[0]


# --- item 4: nothing written through a link the program did not make -------------------------------


@pytest.mark.parametrize("old_output_names_it", [False, True])
@pytest.mark.parametrize("disabled", [[], ["conv-batchnorm"]], ids=["folded", "copied"])
def test_a_link_beside_the_output_is_never_written_through(tmp_path, large_path, old_output_names_it, disabled):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere / "target.bin"
    target.write_bytes(b"keep")
    out = tmp_path / "out"
    out.mkdir()
    if old_output_names_it:  # a previous OUT whose weights file is the link's name
        onnx.save(conv_bn(2), elsewhere / "out.onnx", save_as_external_data=True, location="out.onnx.data",
                  size_threshold=0)
        shutil.copy(elsewhere / "out.onnx", out / "out.onnx")
    (out / "out.onnx.data").symlink_to(target)
    onnx.save(conv_bn(0), tmp_path / "m.onnx", save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    result = convexport.optimize(str(tmp_path / "m.onnx"), output=out / "out.onnx", profile=False,
                                 disable_rules=disabled)
    assert target.read_bytes() == b"keep"
    assert (out / "out.onnx.data").is_symlink() != old_output_names_it  # removed as a link, with what named it
    assert result.output_weights.parent == out
    np.testing.assert_allclose(result_of(out / "out.onnx"), result_of(tmp_path / "m.onnx"), rtol=1e-5, atol=1e-5)


# --- item 7: every destination checked before any is written ---------------------------------------


def unwritable_folder(tmp_path: Path) -> Path:
    """A folder that takes no new file: read-only to a user; to root (whom permissions do not
    stop), a folder of /proc, read but never written here."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    return Path("/proc/self/fdinfo")


@pytest.mark.parametrize("option", ["--report", "--html"])
def test_an_unwritable_report_folder_is_refused_before_the_model_is_written(tmp_path, option):
    onnx.save(conv_bn(0), tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    out.write_bytes(b"previous")
    report = unwritable_folder(tmp_path) / "r.json"
    result = invoke("optimize", tmp_path / "m.onnx", "-o", out, option, report, "--no-profile")
    assert_user_error(result, f"{option} {report}", "cannot write in", "nothing was written")
    assert out.read_bytes() == b"previous" and not report.exists()


def test_an_unwritable_output_folder_is_refused_before_any_work(tmp_path):
    onnx.save(conv_bn(0), tmp_path / "m.onnx")
    out = unwritable_folder(tmp_path) / "out.onnx"
    report = tmp_path / "r.json"
    result = invoke("optimize", tmp_path / "m.onnx", "-o", out, "--report", report, "--no-profile")
    assert_user_error(result, f"-o {out}", "cannot write in")
    assert not report.exists()


# --- item 8: a killed run's temporary files are removed by the next ----------------------------------


def aged(path: Path) -> None:
    """Older than the moment between making a temporary and holding it."""
    past = time.time() - 10 * temporaries.STALE_AFTER_S
    os.utime(path, (past, past))


def own_temporaries(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if temporaries.is_own_temporary(name))


def test_a_killed_writers_temporary_file_is_removed_and_a_live_ones_kept(tmp_path):
    started = {name: tmp_path / f"{name}.started" for name in ("killed", "live")}
    script = """
        import sys, time
        from pathlib import Path
        from convexport.util.files import write_atomically

        def slow(path):
            Path(path).write_bytes(b"half")
            Path(sys.argv[2]).touch()
            time.sleep(60)

        write_atomically(sys.argv[1], slow)
    """
    children = {
        name: subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), str(tmp_path / f"{name}.bin"),
                                str(started[name])])
        for name in started
    }
    try:
        deadline = time.time() + 60
        while not all(path.exists() for path in started.values()) and time.time() < deadline:
            time.sleep(0.05)
        children["killed"].kill()
        children["killed"].wait(timeout=30)
        left = own_temporaries(tmp_path)
        assert len(left) == 2
        for name in left:
            aged(tmp_path / name)
        write_atomically(tmp_path / "next.bin", lambda path: Path(path).write_bytes(b"next"))
        assert [name for name in own_temporaries(tmp_path)] == [name for name in left if name.startswith(".live.bin")]
    finally:
        children["live"].kill()
        children["live"].wait(timeout=30)


def test_a_killed_runs_weights_folder_is_removed_by_the_next_run(tmp_path):
    onnx.save(conv_bn(0), tmp_path / "m.onnx")
    child = run_child(f"""
        import os, signal
        import convexport, convexport.stages.validate as check
        def killed(*args, **kwargs):  # while validating, its weights written beside the output
            os.kill(os.getpid(), signal.SIGKILL)
        check.compare_models = killed
        convexport.optimize({str(tmp_path / "m.onnx")!r}, output={str(tmp_path / "out.onnx")!r}, profile=False)
    """)
    assert child.wait(timeout=120) == -signal.SIGKILL
    (left,) = own_temporaries(tmp_path)
    assert left.startswith(ir.SPILL_PREFIX) and (tmp_path / left / "weights.data").stat().st_size > 0
    aged(tmp_path / left)
    result = convexport.optimize(str(tmp_path / "m.onnx"), output=tmp_path / "out.onnx", profile=False)
    assert result.report["validation"]["passed"] and own_temporaries(tmp_path) == []
