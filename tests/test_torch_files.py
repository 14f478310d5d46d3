"""Models in torch's own files, saved the ways users save them, and loaded without running
code from the file unless it is trusted: crafted `.pt2` archives (pickled sample inputs and
weights, size expressions sympy would evaluate, compiled kernels) leave no trace and name
--trust-pickle; pickled modules and checkpoint dicts load with trust, from the folder their
class lives in; legacy (non-zip) torch.save files are told apart from junk."""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch
from helpers import assert_user_error, invoke
from small_net import make_module

from convexport.load.untrusted import is_size_expression, unsafe_guard


class LeavesATrace:
    """Unpickling it creates the file `marker`: the code a crafted archive would run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.register_buffer("scale", torch.full((4, 1, 1), 2.0))

    def forward(self, x):
        return self.conv(x) * self.scale


@pytest.fixture(scope="module")
def program_archive(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pt2") / "model.pt2"
    batch = torch.export.Dim("batch")
    program = torch.export.export(Scaled().eval(), (torch.randn(2, 3, 8, 8),), dynamic_shapes=({0: batch},))
    torch.export.save(program, path)
    return path


def rewritten(source: Path, destination: Path, edit) -> Path:
    """A copy of the zip `source` with edit(name, data) -> data applied to each member (None
    drops it), and edit(None, None) -> {name: data} members added."""
    with zipfile.ZipFile(source) as given, zipfile.ZipFile(destination, "w") as made:
        for info in given.infolist():
            data = edit(info.filename, given.read(info.filename))
            if data is not None:
                made.writestr(info, data)
        for name, data in (edit(None, None) or {}).items():
            made.writestr(name, data)
    return destination


def crafted_sample_inputs(marker):
    return lambda name, data: pickle.dumps(LeavesATrace(marker)) if name and name.endswith("sample_inputs/model.pt") else data


def crafted_size_expression(marker):
    def edit(name, data):
        if name and name.endswith("models/model.json"):
            text = data.decode()
            symbol = json.dumps("Symbol('s77', positive=True, integer=True)")
            assert symbol in text or "Symbol(" in text
            return text.replace("Symbol(", f"__import__('pathlib').Path({str(marker)!r}).touch() or Symbol(", 1).encode()
        return data

    return edit


def crafted_pickled_weight(marker):
    def edit(name, data):
        if name and name.endswith("model_weights_config.json"):
            config = json.loads(data)
            entry = next(iter(config["config"].values()))
            entry["use_pickle"] = True
            return json.dumps(config).encode()
        if name and name.endswith("data/weights/weight_0"):
            buffer = io.BytesIO()
            torch.save(LeavesATrace(marker), buffer)
            return buffer.getvalue()
        return data

    return edit


def crafted_program(change):
    """An edit of the archive's models/model.json by change(the parsed JSON, in place)."""
    def edit(name, data):
        if name and name.endswith("models/model.json"):
            program = json.loads(data)
            change(program)
            return json.dumps(program).encode()
        return data

    return edit


def crafted_guard(marker):
    """A guard torch compiles into the function program.module() runs on each call."""
    return crafted_program(lambda program: program.update(guards_code=[
        f"__import__('pathlib').Path({str(marker)!r}).touch() is None"]))


def crafted_guard_breaking_out(marker):
    """A guard that closes the torch._assert( it is pasted into and runs as a statement of its own."""
    return crafted_program(lambda program: program.update(guards_code=[
        f"True, '')\n  __import__('pathlib').Path({str(marker)!r}).touch()\n  torch._assert(True"]))


def crafted_target(_marker):
    """A node that calls a torch function which is not an operator (torch's verifier refuses it)."""
    return crafted_program(lambda program: program["graph_module"]["graph"]["nodes"][1].update(
        target="torch.manual_seed"))


def crafted_power_tower(_marker):
    """A size expression that is arithmetic and never ends (9**9**9**9 has 3.7e8 digits... as an exponent)."""
    def change(program):
        text = json.dumps(program)
        symbol = "Symbol('s77', positive=True, integer=True)"
        assert symbol in text
        program.update(json.loads(text.replace(symbol, f"{symbol} + 9**9**9**9", 1)))

    return crafted_program(change)


def crafted_compiled_kernel(_marker):
    def edit(name, data):
        if name is None:
            return {"model/data/aotinductor/model/model.so": b"\x7fELF"}
        return data

    return edit


@pytest.mark.parametrize("craft, what", [
    (crafted_sample_inputs, "pickled object"),
    (crafted_size_expression, "size expression"),
    (crafted_pickled_weight, "pickled object"),
    (crafted_compiled_kernel, "compiled code"),
    (crafted_guard, "guard that is not a comparison of input sizes"),
    (crafted_guard_breaking_out, "guard that is not a comparison of input sizes"),
    (crafted_power_tower, "size expression that is not bounded arithmetic"),
])
def test_a_crafted_program_archive_runs_nothing_and_names_trust(program_archive, tmp_path, craft, what):
    marker = tmp_path / "ran"
    archive = rewritten(program_archive, tmp_path / "crafted.pt2", craft(marker))
    before = archive.read_bytes()
    result = invoke("optimize", archive, "--no-profile", "-o", tmp_path / "out.onnx")
    assert_user_error(result, "crafted.pt2", what, "--trust-pickle")
    assert not marker.exists()
    assert archive.read_bytes() == before and not (tmp_path / "out.onnx").exists()


def test_a_program_calling_what_is_not_an_operator_is_refused_in_one_line(program_archive, tmp_path):
    archive = rewritten(program_archive, tmp_path / "crafted.pt2", crafted_target(None))
    result = invoke("optimize", archive, "--no-profile", "-o", tmp_path / "out.onnx")
    assert_user_error(result, "crafted.pt2", "manual_seed", "not an allowed operator")


def crafted_range_constraint(marker):
    """Range constraints name a symbol and its bounds: code in either."""
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    return crafted_program(lambda program: program["range_constraints"].update(
        {code: {"min_val": code, "max_val": code}}))


def crafted_custom_op(marker):
    """A node whose target names an operator namespace that could be imported, and one that names
    an extension handler: torch looks both up by name and never imports or evaluates them."""
    def change(program):
        nodes = program["graph_module"]["graph"]["nodes"]
        nodes[0]["target"] = f"torch.ops.__import__('pathlib').Path({str(marker)!r}).touch"
        nodes[1]["target"] = f"#{marker}:op"

    return crafted_program(change)


@pytest.mark.parametrize("craft", [crafted_range_constraint, crafted_custom_op, crafted_target])
def test_archive_text_read_by_name_runs_nothing(program_archive, tmp_path, craft):
    """The doors torch reads by lookup, not by eval: each crafted archive is refused in one line
    (or, for unused range constraints, read) without running anything."""
    marker = tmp_path / "ran"
    archive = rewritten(program_archive, tmp_path / "crafted.pt2", craft(marker))
    result = invoke("optimize", archive, "--no-profile", "-o", tmp_path / "out.onnx")
    assert result.exit_code in (0, 1) and "Traceback" not in result.output and not marker.exists()
    if result.exit_code:
        assert_user_error(result, "crafted.pt2")


def test_the_crafted_guard_is_what_torch_would_run(program_archive, tmp_path):
    """The craft is real: the program torch loads runs the guard on each call of its module."""
    marker = tmp_path / "ran"
    archive = rewritten(program_archive, tmp_path / "crafted.pt2", crafted_guard(marker))
    torch.export.load(archive).module()(torch.randn(2, 3, 8, 8))
    assert marker.exists()


def test_a_program_with_the_guards_torch_writes_loads_untrusted(tmp_path):
    class Halves(torch.nn.Module):
        def forward(self, x):
            return x.view(x.shape[0] // 2, -1) * 2

    program = torch.export.export(Halves(), (torch.randn(6, 4),), dynamic_shapes=({0: torch.export.Dim.AUTO},))
    assert program._guards_code  # (L['x'].size()[0] // 2) != 1, ...
    torch.export.save(program, tmp_path / "halves.pt2")
    result = invoke("optimize", tmp_path / "halves.pt2", "--input", "x:6x4", "--no-profile", "-o", tmp_path / "out.onnx")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("guard", [
    "L['y'].size()[0] == L['x'].size()[0]", "L['flat_args'][1].size()[0] == L['flat_args'][0].size()[0]",
    "((4*L['x'].size()[0]) % (L['x'].size()[0] // 2)) == 0", "5 <= L['x'].size()[0] and L['x'].size()[0] <= 64",
    "L['x'].stride()[0] == L['x'].size()[1]", "L['x'].storage_offset() == 0", "math.floor(L['x'].size()[0] / 3) >= 1",
    "L['x'].size()[0]**2 <= 4096", "max(1, 4*(L['x'].size()[0] // (L['x'].size()[0] // 2))) == (4*L['x'].size()[0])",
    "abs(L['x'].size()[0] - 3) < inf",
])
def test_guards_torch_writes_are_accepted(guard):
    assert unsafe_guard([guard]) is None


@pytest.mark.parametrize("guard", [
    "__import__('os').system('x') == 0", "L['x'].size()[0].__class__", "open('f') is None", "L['x'].size()[0] == len('a')",
    "L['x'].numpy().tofile('f')", "L['x'].size()[0] == 2\nimport os", "L['x'].size()[0] == 2\rimport os",
    "L['x'].size()[0] == 9**9**9", "2**L['x'].size()[0] > 0", "L['a b'].size()[0] == 1", "(lambda: 1)() == 1",
    "L['x'].size()[0] == 'a\"b'", "[1][0] == 1", "L[L['x']].size()[0] == 1", "L['x'].size(dim=0) == 1",
    "math.pi > 3", "max.__class__ is None", "getattr(L, 'x') == 1", "eval('1') == 1", "L['x'].size()[0] == " + "9" * 50, "True, '')\n  x = 1\n  torch._assert(True",
])
def test_anything_else_in_a_guard_is_not(guard):
    assert unsafe_guard([guard]) == guard


@pytest.mark.parametrize("text", ["Symbol('s0') + 9**9**9**9", "10**10**8", "2**(9**9)", "s0**100000",
                                  "s0 + " + "9" * 41, "s0**2**2", "s0**2 * s1**2 * s2**2 * s3**2 * s4**2"])
def test_size_expressions_that_would_not_end_are_not(text):
    assert not is_size_expression(text)


@pytest.mark.parametrize("text", ["s0**2", "2**s0", "PowByNatural(s0, 2) + s1**3", "9223372036854775807 - s0"])
def test_bounded_powers_and_literals_of_sizes_are(text):
    assert is_size_expression(text)


def test_the_crafted_archives_are_what_torch_would_run(program_archive, tmp_path):
    """The craft is real: torch.export.load itself runs the crafted sample inputs' code."""
    marker = tmp_path / "ran"
    archive = rewritten(program_archive, tmp_path / "crafted.pt2", crafted_sample_inputs(marker))
    with pytest.raises(Exception):  # noqa: B017 (torch fails after running it; what it raises is its own)
        torch.export.load(archive)
    assert marker.exists()


def test_a_plain_program_archive_still_loads_untrusted(program_archive, tmp_path):
    result = invoke("optimize", program_archive, "--no-profile", "-o", tmp_path / "out.onnx")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("text", [
    "Symbol('s77', positive=True, integer=True)", "2*s77", "FloorDiv(s0, 2) + 1", "Max(1, s0*s1) - 3",
    "Symbol(\"u0\", integer=True)", "s12 // 4 <= 7",
])
def test_size_expressions_torch_writes_are_parsed(text):
    assert is_size_expression(text)


@pytest.mark.parametrize("text", [
    "__import__('os').system('x')", "exec('1')", "open('f')", "s0.__class__", "Symbol('a').func",
    "(lambda: 1)()", "[s0][0]", "Symbol('a; b')", "getattr(s0, 'x')", "eval", "Symbol('a')\nexec('1')",
])
def test_anything_else_is_not(text):
    assert not is_size_expression(text)


# --- torch.save files ------------------------------------------------------------------------


NET = textwrap.dedent("""
    import torch

    class Net(torch.nn.Module):
        def __init__(self, scale=1.0):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(4).eval()
            self.scale = scale

        def forward(self, x):
            return self.bn(self.conv(x)) * self.scale
""")


@pytest.fixture
def net_folder(tmp_path, monkeypatch):
    """A folder holding net.py (the class a training script imported) and the files saved from
    it; the test runs in it, as a user who trained there would, and the class is not imported."""
    (tmp_path / "net.py").write_text(NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    import net

    saved = {
        "module.pt": net.Net(),
        "checkpoint.pt": {"model": net.Net(), "epoch": 3},
        "two.pt": {"model": net.Net(1.0), "ema": net.Net(2.0), "epoch": 3},
        "weights.pt": {"state_dict": net.Net().state_dict(), "epoch": 3},
        "state_dict.pt": net.Net().state_dict(),
    }
    for name, value in saved.items():
        torch.save(value, tmp_path / name)
    torch.save(net.Net(), tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    torch.save(net.Net().state_dict(), tmp_path / "legacy_weights.pt", _use_new_zipfile_serialization=False)
    del sys.modules["net"]
    sys.path.remove(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def optimized(*args):
    result = invoke("optimize", *args, "--input", "x:1x3x8x8", "--no-profile")
    assert result.exit_code == 0, result.output
    return result


def test_a_pickled_module_whose_class_is_in_the_current_folder_loads_with_trust(net_folder):
    optimized("module.pt", "--trust-pickle")
    assert (net_folder / "module.opt.onnx").exists()


def test_a_pickled_module_saved_from_a_script_gets_a_hint(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(NET + "\ntorch.save(Net(), 'main.pt')\n")
    assert os.system(f"cd {tmp_path} && {sys.executable} {script}") == 0
    assert_user_error(invoke("optimize", tmp_path / "main.pt", "--trust-pickle"), "__main__", "state_dict", "factory")


def test_a_checkpoint_with_one_module_loads_it(net_folder):
    optimized("checkpoint.pt", "--trust-pickle")


def test_a_checkpoint_with_two_modules_names_them_and_takes_one_by_key(net_folder):
    result = invoke("optimize", "two.pt", "--trust-pickle", "--input", "x:1x3x8x8", "--no-profile")
    assert_user_error(result, "'model', 'ema'", "two.pt:model")
    optimized("two.pt:ema", "--trust-pickle")
    assert (net_folder / "two.ema.opt.onnx").exists()


@pytest.mark.parametrize("key, fragment", [("epoch", "a int, not an nn.Module"), ("nope", "no such entry")])
def test_a_key_that_holds_no_module_is_refused(net_folder, key, fragment):
    assert_user_error(invoke("optimize", f"two.pt:{key}", "--trust-pickle"), fragment, "'ema'")


def test_a_checkpoint_of_weights_names_its_entries(net_folder):
    assert_user_error(invoke("optimize", "weights.pt"), "'state_dict', 'epoch'", "no nn.Module", "factory")
    assert_user_error(invoke("optimize", "state_dict.pt"), "a state_dict", "factory")


def test_an_untrusted_pickle_names_trust_and_runs_nothing(net_folder):
    marker = net_folder / "ran"
    torch.save({"model": LeavesATrace(marker)}, net_folder / "crafted.pt")
    assert_user_error(invoke("optimize", "crafted.pt"), "--trust-pickle")
    assert not marker.exists()


def test_legacy_torch_save_files_are_told_apart_from_junk(net_folder):
    assert_user_error(invoke("optimize", "legacy.pt"), "legacy.pt", "pickled nn.Module", "--trust-pickle")
    optimized("legacy.pt", "--trust-pickle")
    assert_user_error(invoke("optimize", "legacy_weights.pt"), "a state_dict")
    (net_folder / "junk.pt").write_bytes(b"\x80\x04 not a torch file at all")
    assert_user_error(invoke("optimize", "junk.pt"), "neither a TorchScript archive nor a torch.save file")


def test_a_key_on_a_model_without_entries_is_refused(net_folder, program_archive, tmp_path):
    scripted = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(make_module()), scripted)
    assert_user_error(invoke("optimize", f"{scripted}:model"), "no entries")
    assert_user_error(invoke("optimize", f"{program_archive}:model"), "only a checkpoint")


def test_two_factories_of_one_file_write_two_outputs(tmp_path, monkeypatch):
    (tmp_path / "net.py").write_text(NET + textwrap.dedent("""
        def example_inputs():
            return (torch.randn(1, 3, 8, 8),)

        def small():
            return Net(1.0).eval()

        def large():
            return Net(2.0).eval()
    """))
    monkeypatch.chdir(tmp_path)
    for factory in ("small", "large"):
        assert invoke("optimize", f"net.py:{factory}", "--no-profile").exit_code == 0
    assert (tmp_path / "net.small.opt.onnx").exists() and (tmp_path / "net.large.opt.onnx").exists()


def test_a_torchscript_custom_class_names_its_library(tmp_path):
    """An archive whose module holds an object of a C++ custom class that is not registered."""
    scripted = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(make_module()), scripted)

    def edit(name, data):  # every class of the archive's code (scripting names them per process) gets the field
        if name and "/code/" in name and name.endswith(".py"):
            return data.replace(b"  training : bool\n", b"  training : bool\n  helper : __torch__.torch.classes.mylib.Helper\n")
        return data

    archive = rewritten(scripted, tmp_path / "custom_class.pt", edit)
    assert_user_error(invoke("optimize", archive, "--input", "x:1x3x16x16"), "custom class mylib.Helper",
                      "torch.ops.load_library")


def test_a_traced_archive_that_does_not_export_gives_the_reason_whole_and_the_way_out(tmp_path):
    """A torch.jit.trace of nn.MultiheadAttention: the TorchScript exporter fails with a first
    line of torch's some 300 characters long, which was cut mid-word; the message keeps it whole
    and says what to give instead."""

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = torch.nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x):
            return self.attention(x, x, x)[0]

    torch.jit.trace(Attention().eval(), torch.randn(2, 5, 16), check_trace=False).save(str(tmp_path / "tfm.pt"))
    result = invoke("optimize", tmp_path / "tfm.pt", "--input", "x:2x5x16", "--no-profile")
    assert_user_error(result, "ONNX export failed", "unknown rank", "torch.export", "file.py:factory")
    assert re.search(r"functional\.py:\d+:\d+;", result.stderr), result.stderr  # torch's line, to its end


def test_a_long_reason_is_cut_at_a_word():
    from convexport.errors import first_line

    line = first_line(RuntimeError("word " * 200 + "\nsecond line"))
    assert len(line) <= 404 and line.endswith("word ...") and "second" not in line
    assert first_line(RuntimeError("short reason\nmore")) == "short reason"
