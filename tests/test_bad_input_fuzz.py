"""Every flag that takes a path or a shape, given what a careless user or an attacker gives
(issue 49, item 9): drawn by hypothesis from hostile paths (a FIFO, a folder, a link loop, a
dangling link, an empty, truncated or foreign file, a .npy, names too long or with odd
characters) and hostile shapes (huge, negative and non-ASCII dims, bad types and ranges).

Whatever is drawn: no internal error (exit 70), no traceback, a refusal is one line on
stderr, and no input file changes. A FIFO is given only where a file is read (written
through, a FIFO output waits for its reader: tests/test_hostile.py covers that)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import invoke, make_model, tensor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

EXAMPLES = settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.fixture(scope="module")
def given_files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("given")
    weight = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        [tensor("x", ["N", 3, 8, 8])], [tensor("y", ["N", 4, 8, 8])], {"w": weight},
    )
    onnx.save(model, folder / "m.onnx")
    data = (folder / "m.onnx").read_bytes()
    (folder / "truncated.onnx").write_bytes(data[: len(data) // 2])
    (folder / "empty.onnx").write_bytes(b"")
    (folder / "garbage.bin").write_bytes(os.urandom(4096))
    np.save(folder / "plain.npy", np.zeros((1, 3, 8, 8), np.float32))
    np.savez(folder / "wrong.npz", z=np.zeros(3))
    np.savez(folder / "good.npz", x=np.zeros((1, 3, 8, 8), np.float32))
    (folder / "rules.yaml").write_text("rules:\n  - name: [unclosed\n")
    (folder / "notes.txt").write_text("x:1x3x8x8\n")
    os.mkfifo(folder / "fifo.onnx")
    os.mkfifo(folder / "fifo.npz")
    (folder / "a folder").mkdir()
    (folder / "loop").symlink_to(folder / "loop")
    (folder / "dangling.onnx").symlink_to(folder / "nowhere.onnx")
    (folder / "link.onnx").symlink_to(folder / "m.onnx")
    return folder


def fingerprint(folder: Path) -> dict[str, str]:
    """What each regular file in `folder` holds (links and FIFOs by what they are)."""
    seen = {}
    for path in sorted(folder.iterdir()):
        if path.is_symlink():
            seen[path.name] = f"-> {os.readlink(path)}"
        elif path.is_file():
            seen[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            seen[path.name] = "folder" if path.is_dir() else "special"
    return seen


READ_NAMES = ["m.onnx", "truncated.onnx", "empty.onnx", "garbage.bin", "plain.npy", "wrong.npz", "good.npz",
              "rules.yaml", "notes.txt", "fifo.onnx", "fifo.npz", "a folder", "loop", "dangling.onnx", "link.onnx",
              "missing.onnx", "x" * 300 + ".onnx", "we\nird.onnx", "ünï cødé.pt2", "net.pt:model", "net.py:build",
              "json.decoder:JSONDecoder", "os:system", "-", "../", ""]
WRITE_NAMES = ["out.onnx", "a folder", "loop", "dangling.onnx", "link.onnx", "m.onnx", "no/such/folder/o.onnx",
               "x" * 300 + ".onnx", "we\nird.onnx", "out.onnx.data", "-"]


def read_paths(folder: Path):
    return st.sampled_from(READ_NAMES).map(lambda name: str(folder / name) if name not in ("-", "") else name)


INPUT_NAMES = ("m.onnx", "link.onnx")  # outputs that are inputs, or lead to one


def write_paths(folder: Path, work: Path):
    """In the inputs' folder for the names of inputs, else in the work folder (where a dangling
    link is written through, creating its target, as the user who made it asked)."""
    return st.sampled_from(WRITE_NAMES).map(
        lambda name: name if name == "-" else str((folder if name in INPUT_NAMES else work) / name)
    )


NAMES = st.sampled_from(["x", "y", "", "x y", "é", "x:x", "N"])
DIMS = st.lists(
    st.sampled_from(["1", "0", "-1", "3", "8", "N", "batch", "?", "²", "10" * 20, str(2**40), "30000", "1.5", "", "x"]),
    min_size=0, max_size=6,
).map("x".join)
TYPES = st.sampled_from(["", ":float32", ":int64", ":float16", ":bogus", ":float32:0..1", ":float32:-1e308..1e308",
                         ":int64:0..1e30", ":float32:1..0", ":float32:nan..1", ":float32:a..b", ":bool:0..1"])
SHAPES = st.builds(lambda name, dims, rest: f"{name}:{dims}{rest}", NAMES, DIMS, TYPES) | st.text(max_size=30)


def check(result, folder: Path, before: dict) -> None:
    assert result.exit_code != 70, result.output
    assert "Traceback" not in result.output, result.output
    if result.exit_code in (1, 3):
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
    assert fingerprint(folder) == before


@pytest.fixture
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("work")


def run_case(folder: Path, work: Path, *args) -> None:
    (work / "loop").symlink_to(work / "loop")
    (work / "dangling.onnx").symlink_to(work / "nowhere.onnx")
    (work / "a folder").mkdir()
    before = fingerprint(folder)
    cwd = os.getcwd()
    os.chdir(work)  # a package.module:f or a default output lands here, not among the inputs
    try:
        check(invoke(*args), folder, before)
    finally:
        os.chdir(cwd)
        for path in work.iterdir():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()


# --- paths that are read -------------------------------------------------------------------------


@pytest.mark.parametrize("command", [
    ["optimize", "{path}", "--no-profile", "-o", "{work}/o.onnx"],
    ["optimize", "{m}", "--no-profile", "-o", "{work}/o.onnx", "--rules", "{path}"],
    ["optimize", "{m}", "--no-profile", "-o", "{work}/o.onnx", "--inputs", "{path}"],
    ["optimize", "{m}", "--no-profile", "-o", "{work}/o.onnx", "--input-data", "{path}"],
    ["optimize", "{m}", "--no-profile", "-o", "{work}/o.onnx", "--custom-ops-library", "{path}"],
    ["export", "{path}", "-o", "{work}/o.onnx"],
    ["validate", "{path}", "{m}", "--runs", "1"],
    ["validate", "{m}", "{path}", "--runs", "1"],
    ["validate", "{m}", "{m}", "--runs", "1", "--inputs", "{path}"],
    ["validate", "{m}", "{m}", "--runs", "1", "--custom-ops-library", "{path}"],
    ["profile", "{path}", "--runs", "1", "--warmup", "0", "--no-per-op"],
    ["rules", "check", "{path}"],
    ["rules", "list", "--rules", "{path}"],
    ["rules", "show", "drop-identity", "--rules", "{path}"],
    ["rules", "test", "{path}", "--examples", "1", "--out", "{work}/ce"],
], ids=lambda command: " ".join(part for part in command[:2] if "{" not in part) + " " + next(
    (command[index - 1] for index, part in enumerate(command) if part == "{path}" and command[index - 1].startswith("-")),
    "PATH"))
def test_a_hostile_path_where_a_file_is_read(given_files, work, command):
    @EXAMPLES
    @given(read_paths(given_files))
    def case(path):
        paths = {"path": path, "m": str(given_files / "m.onnx"), "work": str(work)}
        run_case(given_files, work, *(part.format(**paths) for part in command))

    case()


# --- paths that are written ----------------------------------------------------------------------


@pytest.mark.parametrize("command", [
    ["optimize", "{m}", "--no-profile", "-o", "{path}"],
    ["optimize", "{m}", "--no-profile", "-o", "{work}/o.onnx", "--report", "{path}"],
    ["optimize", "{m}", "--no-profile", "-o", "{work}/o.onnx", "--html", "{path}"],
    ["export", "{m}", "-o", "{path}"],
    ["validate", "{m}", "{m}", "--runs", "1", "--report", "{path}"],
    ["profile", "{m}", "--runs", "1", "--warmup", "0", "--no-per-op", "--report", "{path}"],
], ids=lambda command: f"{command[0]} {command[command.index('{path}') - 1]}")
def test_a_hostile_path_where_a_file_is_written(given_files, work, command):
    @EXAMPLES
    @given(write_paths(given_files, work))
    def case(path):
        paths = {"path": path, "m": str(given_files / "m.onnx"), "work": str(work)}
        run_case(given_files, work, *(part.format(**paths) for part in command))

    case()


# --- shapes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [
    ["optimize", "{m}", "--no-profile", "-o", "{work}/o.onnx", "--input", "{shape}"],
    ["export", "{m}", "-o", "{work}/o.onnx", "--input", "{shape}"],
    ["validate", "{m}", "{m}", "--runs", "1", "--input", "{shape}"],
    ["profile", "{m}", "--runs", "1", "--warmup", "0", "--no-per-op", "--input", "{shape}"],
], ids=lambda command: command[0])
def test_a_hostile_shape(given_files, work, command):
    @EXAMPLES
    @given(SHAPES)
    def case(shape):
        paths = {"shape": shape, "m": str(given_files / "m.onnx"), "work": str(work)}
        run_case(given_files, work, *(part.format(**paths) for part in command))

    case()
