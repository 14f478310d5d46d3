"""A large model's weights left in their files (convexport/ir/weight_files.py, issue 34), taken
with the size threshold lowered: read tensor by tensor when a rule needs one, the optimized
model's written beside the output before validation and renamed into place after, ONNX Runtime
given files to map; the input's external data checked as ONNX Runtime checks it."""

from __future__ import annotations

import os
import weakref
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import make_model, tensor
from onnx import helper
from test_large_models import RNG, contents, lora_bn_block

import convexport
from convexport import ir
from convexport.ir import disk, weight_files
from convexport.load.routes import load_model
from convexport.stages import validate as check
from convexport.validate.results import ValidationResult

WIDTH = 32


@pytest.fixture
def large(monkeypatch):
    """Models of 1000 bytes of weights on are large; tensors of 100 bytes on go to data files."""
    monkeypatch.setattr("convexport.ir.large.SERIALISED_MAX_BYTES", 1000)
    monkeypatch.setattr("convexport.ir.large.EXTERNAL_TENSOR_MIN_BYTES", 100)


def saved(folder: Path) -> Path:
    """lora_bn_block, then a MatMul by a weight `keep` that no rule folds, saved in `folder`
    with its tensors of 100 bytes or more in model.onnx.data."""
    model = lora_bn_block(WIDTH)
    graph = model.graph
    graph.node.append(helper.make_node("MatMul", ["y", "keep"], ["z"]))
    keep = RNG.standard_normal((WIDTH, WIDTH)).astype(np.float32)
    graph.initializer.append(onnx.numpy_helper.from_array(keep, "keep"))
    del graph.output[:]
    graph.output.append(tensor("z", [4, WIDTH]))
    folder.mkdir(exist_ok=True)
    path = folder / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="model.onnx.data", size_threshold=100)
    return path


def test_a_large_models_weights_stay_in_their_files_and_only_folded_ones_are_read(tmp_path, large, monkeypatch):
    path = saved(tmp_path / "in")
    before = contents(path.parent)
    loaded = load_model(str(path)).onnx_model
    big = [init for init in loaded.graph.initializer if np.prod(init.dims) * 4 >= 100]
    assert big and all(ir.is_file_backed(init) and not init.raw_data for init in big)

    read = []
    real = ir.convert.tensor_array
    monkeypatch.setattr(ir.convert, "tensor_array", lambda t: read.append(t.name) or real(t))
    told = []
    result = convexport.optimize(str(path), output=tmp_path / "out.onnx", profile=False, progress=told.append)
    assert result.report["validation"]["passed"]
    assert any(line.startswith("rewriting (") and "GiB of weights read)" in line for line in told)
    assert any(line.startswith("writing weights (") and "GiB written)" in line for line in told)
    assert "keep" not in read and {"w", "a", "u"} <= set(read)  # the fold read its weights, not the others
    assert contents(path.parent) == before

    written = onnx.load(str(tmp_path / "out.onnx"))  # the kept weight copied into the output's data file
    keep = next(init for init in written.graph.initializer if init.name == "keep")
    original = onnx.load(str(path))
    expected = next(init for init in original.graph.initializer if init.name == "keep")
    assert np.array_equal(onnx.numpy_helper.to_array(keep), onnx.numpy_helper.to_array(expected))
    # the models returned name their files as onnx.load(load_external_data=False) gives them
    locations = {e.value for init in result.original.graph.initializer for e in init.external_data if e.key == "location"}
    assert locations == {"model.onnx.data"}
    locations = {e.value for init in result.model.graph.initializer for e in init.external_data if e.key == "location"}
    assert locations == {result.output_weights.name}


def test_the_optimized_weights_are_on_disk_beside_the_output_while_validated(tmp_path, large, monkeypatch):
    path = saved(tmp_path / "in")
    seen = []
    real = check.compare_models

    def spying(reference, candidate, *args, **kwargs):
        large_tensors = [init for init in candidate.graph.initializer if np.prod(init.dims) * 4 >= 100]
        seen.append([(ir.is_file_backed(init), weight_files.file_range(init)[0]) for init in large_tensors])
        return real(reference, candidate, *args, **kwargs)

    monkeypatch.setattr(check, "compare_models", spying)
    result = convexport.optimize(str(path), output=tmp_path / "out.onnx", profile=False)
    assert result.report["validation"]["passed"]
    ((*tensors,),) = seen
    assert tensors and all(backed for backed, _ in tensors)
    folders = {Path(file).parent for _, file in tensors}
    assert len(folders) == 1 and folders.pop().name.startswith(disk.SPILL_PREFIX)
    assert sorted(os.listdir(tmp_path)) == ["in", "out.onnx", result.output_weights.name]  # the folder gone, renamed


def test_a_failed_validation_leaves_nothing_beside_the_output(tmp_path, large, monkeypatch):
    path = saved(tmp_path / "in")
    (tmp_path / "out").mkdir()
    real = check.compare_models

    def failing(*args, **kwargs) -> ValidationResult:
        result = real(*args, **kwargs)
        result.passed = False
        return result

    monkeypatch.setattr(check, "compare_models", failing)
    with pytest.raises(convexport.ValidationError):
        convexport.optimize(str(path), output=tmp_path / "out" / "o.onnx", profile=False)
    assert os.listdir(tmp_path / "out") == []


@pytest.mark.parametrize("linked", [True, False])
def test_onnx_runtime_gets_a_file_of_the_model_whose_weights_are_elsewhere(tmp_path, large, monkeypatch, linked):
    """A session of a model whose weights are in the input's folder and in memory: the model
    file in a folder of its own, the input's data file linked there (or copied, where the
    system refuses the link), the held weights written there."""
    path = saved(tmp_path / "in")
    model = load_model(str(path)).onnx_model
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((8, 8), np.float32), "held"))
    if not linked:
        monkeypatch.setattr(os, "link", lambda *args: (_ for _ in ()).throw(OSError(18, "Invalid cross-device link")))
    with ir.files_for_runtime(model) as file:
        names = sorted(os.listdir(Path(file).parent))
        session = convexport.runtime.create_session(file)
        x = RNG.standard_normal((4, WIDTH)).astype(np.float32)
        (actual,) = session.run(None, {"x": x})
    (expected,) = convexport.runtime.create_session(str(path)).run(None, {"x": x})
    assert names == ["linked0.data", "model.onnx", disk.WEIGHTS_NAME]
    assert np.array_equal(actual, expected)
    assert not Path(file).parent.exists()
    assert (os.stat(tmp_path / "in" / "model.onnx.data").st_nlink == 1)  # the link gone with the folder


@pytest.mark.parametrize("location, message", [
    ("../elsewhere.data", "is not inside"),
    ("/tmp/absolute.data", "is not inside"),
    ("missing.data", "does not exist"),
])
def test_external_data_outside_the_models_folder_is_refused(tmp_path, large, location, message):
    path = saved(tmp_path / "in")
    (tmp_path / "elsewhere.data").write_bytes((tmp_path / "in" / "model.onnx.data").read_bytes())
    model = onnx.load(str(path), load_external_data=False)
    for init in model.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save(model, str(path))
    with pytest.raises(convexport.ConvexportError, match=f"not a readable ONNX model.*{message}"):
        convexport.optimize(str(path), output=tmp_path / "out.onnx", profile=False)
    assert not (tmp_path / "out.onnx").exists()


def test_a_range_beyond_the_end_of_its_file_is_refused(tmp_path, large):
    path = saved(tmp_path / "in")
    data = tmp_path / "in" / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:-8])
    with pytest.raises(convexport.ConvexportError, match="lie outside"):
        convexport.optimize(str(path), output=tmp_path / "out.onnx", profile=False)


def test_onnx_runtimes_folder_goes_on_the_outputs_disk_during_a_run(tmp_path, large):
    """A session's temporary folder is made beside the output (where the data files' disk is
    the output's: /tmp may be memory, and would take copies of them)."""
    path = saved(tmp_path / "in")
    model = load_model(str(path)).onnx_model
    (tmp_path / "out").mkdir()
    with ir.scratch_beside(tmp_path / "out"), ir.files_for_runtime(model) as file:
        assert Path(file).parent.parent == tmp_path / "out" and Path(file).parent.name.startswith(".convexport-")
    assert os.listdir(tmp_path / "out") == []


@pytest.mark.parametrize("threshold, at_once", [(1000, 1), (1 << 40, 2)])
def test_a_large_models_profile_holds_one_session_at_a_time(monkeypatch, threshold, at_once):
    """A large model's two sessions are made, timed and released one after the other (each
    holds a model's weights); smaller models take turns, both sessions alive."""
    from convexport.profile import profiler as profile

    monkeypatch.setattr("convexport.ir.large.SERIALISED_MAX_BYTES", threshold)
    alive, most = [], [0]
    real = profile.create_session

    def counted(*args, **kwargs):
        session = real(*args, **kwargs)
        alive[:] = [ref for ref in alive if ref() is not None] + [weakref.ref(session)]
        most[0] = max(most[0], len(alive))
        return session

    monkeypatch.setattr(profile, "create_session", counted)
    told = []
    result = convexport.optimize(lora_bn_block(WIDTH), write=False, validate=False, progress=told.append)
    measured = result.report["profile"]
    assert most[0] == at_once and measured["speedup"] > 0
    assert measured.get("one_at_a_time", False) == (at_once == 1)
    timed = [line for line in told if line.startswith("profiling") and ("timed)" in line or "pairs)" in line)]
    assert timed and timed[-1].endswith("(2/2 timed)" if at_once == 1 else f"({measured['paired']['pairs']} pairs)")


def test_a_large_model_no_rule_changes_is_written_from_its_files(tmp_path, large):
    """Nothing to fold: the model written is the input's, its weights copied file to file into
    OUT.data (never read into memory: a rewrite that reads nothing), the input left as it was."""
    weight = RNG.standard_normal((WIDTH, WIDTH)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [tensor("x", [4, WIDTH])],
                       [tensor("y", [4, WIDTH])], {"w": weight})
    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / "m.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="m.onnx.data", size_threshold=100)
    before = contents(path.parent)
    result = convexport.optimize(str(path), output=tmp_path / "out.onnx", profile=False)
    assert result.report["rewrites"] == [] and result.report["validation"]["passed"]
    written = onnx.load(str(tmp_path / "out.onnx"))
    assert np.array_equal(onnx.numpy_helper.to_array(written.graph.initializer[0]), weight)
    assert result.output_weights.stat().st_size == weight.nbytes and contents(path.parent) == before


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_a_range_is_copied_whole_with_or_without_the_kernels_copy(tmp_path, monkeypatch, kernel_copy):
    """os.copy_file_range where the system has it (Linux), chunks read and written elsewhere (macOS)."""
    source = tmp_path / "source"
    source.write_bytes(bytes(range(256)) * 40)
    monkeypatch.setattr(weight_files, "COPY_CHUNK_BYTES", 1000)
    if not kernel_copy:
        monkeypatch.delattr(os, "copy_file_range", raising=False)
    with open(tmp_path / "out", "wb") as out:
        out.write(b"head")
        weight_files.copy_range(str(source), 300, 5000, out)
        out.write(b"tail")
    assert (tmp_path / "out").read_bytes() == b"head" + source.read_bytes()[300:5300] + b"tail"
