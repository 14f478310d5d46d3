"""The documentation runs (issue 51): every fenced block of README.md and docs/*.md says what it
is, and every `console` and `python` block is run, its output checked, unless the line above it
says why not.

A console block is what a terminal shows: `$ command` lines (a trailing `# exit N` says the exit
code it ends with; 0 otherwise), each followed by its output, stdout and stderr as the terminal
interleaves them. In the output shown, `...` stands for what varies from run to run or machine
to machine (times, speeds, rounding errors), within a line, or, alone on a line, for any
number of lines. Everything else must be what the command prints. The blocks of one file run
in order in one folder holding copies of sample_models/, rules/ and docs/examples/, so a block
may read what an earlier one wrote; `$ cd FOLDER` moves the commands after it there.

A python block runs as a script in that folder, with the installed convexport, and must exit 0.
A line `print(EXPRESSION)  # SHOWN` says what it prints: the printed lines, in order, must be the
SHOWN texts (`...` again standing for what varies). A block that only defines functions (a
primitive's shape) still runs: its imports and decorators are the API it documents.

Own runner rather than sybil or pytest-examples: both are built around Python code blocks
and doctest output; the blocks here are shell sessions whose output has terminal tables,
stderr lines and exit codes, and a 120-line runner says exactly how they are judged.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
KINDS = {"console", "python", "yaml", "text", "json", "diff"}
NOT_RUN = re.compile(r"<!-- not run: (.+) -->")
EXIT = re.compile(r"\s+# exit (\d+)$")
COMMAND_SECONDS = 300


@dataclass
class Block:
    document: Path
    line: int  # of the opening fence
    kind: str
    text: str
    not_run: str | None  # the reason, when the line above says it is not run

    @property
    def name(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


def blocks(document: Path) -> list[Block]:
    found, lines = [], document.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        fence = re.match(r"^(\s*)```(\S*)\s*$", lines[index])
        if not fence:
            index += 1
            continue
        indent, kind, start = len(fence[1]), fence[2], index
        index += 1
        body = []
        while index < len(lines) and lines[index].strip() != "```":
            body.append(lines[index][indent:])
            index += 1
        above = next((line for line in reversed(lines[:start]) if line.strip()), "")
        reason = NOT_RUN.search(above)
        found.append(Block(document, start + 1, kind, "\n".join(body), reason[1] if reason else None))
        index += 1
    return found


ALL = [block for document in DOCUMENTS for block in blocks(document)]
RUN = {"console", "python"}
RUNNABLE = {document: [b for b in blocks(document) if b.kind in RUN and not b.not_run] for document in DOCUMENTS}
SHOWN_PRINT = re.compile(r"^print\((.*)\)\s+# (.*)$")


@pytest.mark.parametrize("block", ALL, ids=lambda block: block.name)
def test_every_block_says_what_it_is(block):
    assert block.kind in KINDS, f"{block.name}: a fence says what it holds ({', '.join(sorted(KINDS))})"
    if block.kind == "console" and block.not_run is None:
        assert block.text.lstrip().startswith("$ "), f"{block.name}: a console block starts with a $ command"


def sessions(block: Block) -> list[tuple[str, int, str]]:
    """(command, expected exit code, expected output) for each $ line of a console block."""
    found = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            command = line[2:]
            code = EXIT.search(command)
            found.append([EXIT.sub("", command), int(code[1]) if code else 0, []])
        else:
            found[-1][2].append(line)
    return [(command, code, "\n".join(output)) for command, code, output in found]


def _spaced(line: str) -> str:
    """A line with its runs of spaces (and of a table's rule) as one: a table's column widths
    follow the widest value, which may be one that varies."""
    return re.sub("━+", "━", re.sub(r"\s+", " ", line.strip()))


def matches(expected: str, actual: str) -> bool:
    """Whether `actual` is `expected` with each `...` standing for anything (module doc), runs
    of spaces counting as one."""
    if not expected.strip():
        return not actual.strip()
    pattern = []
    for line in expected.rstrip().splitlines():
        if line.strip() == "...":
            pattern.append(r"(?:[^\n]*\n)*?")
        else:
            pattern.append(".*?".join(map(re.escape, _spaced(line).split("..."))) + r"\n")
    text = "\n".join(_spaced(line) for line in actual.rstrip().splitlines()) + "\n"
    return re.fullmatch("".join(pattern), text) is not None


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory):
    made = {}

    def workspace(document: Path) -> Path:
        if document not in made:
            folder = tmp_path_factory.mktemp(document.stem)
            for source in ("sample_models", "rules", "docs/examples"):
                shutil.copytree(ROOT / source, folder / source, ignore=shutil.ignore_patterns("__pycache__"))
            made[document] = folder
        return made[document]

    return workspace


def environment() -> dict[str, str]:
    """The installed `convexport` first on PATH; a wide terminal, so that no line wraps."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "200",
            "TERM": "dumb", "NO_COLOR": "1"}


def shown_prints(block: Block) -> list[str]:
    """What a python block says its `print(...)  # SHOWN` lines print, in order."""
    return [shown[2] for line in block.text.splitlines() if (shown := SHOWN_PRINT.match(line))]


def run_python(block: Block, folder: Path) -> None:
    done = subprocess.run([sys.executable, "-"], input=block.text, cwd=folder, env=environment(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=COMMAND_SECONDS)
    assert done.returncode == 0, f"{block.name}: exit {done.returncode}\n{done.stderr}"
    expected = "\n".join(shown_prints(block))
    assert matches(expected, done.stdout), f"{block.name}:\nshown:\n{expected}\nprinted:\n{done.stdout}"


@pytest.mark.long
@pytest.mark.parametrize("document", [d for d in DOCUMENTS if RUNNABLE[d]], ids=lambda d: str(d.relative_to(ROOT)))
def test_the_documents_commands_print_what_they_show(document, workspaces):
    folder = workspaces(document)
    for block in RUNNABLE[document]:
        if block.kind == "python":
            run_python(block, folder)
            continue
        for command, code, expected in sessions(block):
            moved = re.fullmatch(r"cd (\S+)", command)
            if moved:  # the folder of the commands after it, as in a terminal
                folder = folder / moved[1]
                continue
            done = subprocess.run(["bash", "-c", command], cwd=folder, env=environment(), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=COMMAND_SECONDS)
            assert done.returncode == code, f"{block.name}: $ {command}\nexit {done.returncode}\n{done.stdout}"
            assert matches(expected, done.stdout), f"{block.name}: $ {command}\nshown:\n{expected}\nprinted:\n{done.stdout}"


@pytest.mark.parametrize("expected, actual, result", [
    ("a 1.5 ms\nb", "a 1.5 ms\nb\n", True),
    ("a ... ms\nb", "a 0.25 ms\nb", True),
    ("a\n...\nz", "a\nb\nc\nz", True),
    ("a\n...\nz", "a\nz", True),
    ("a 1.5 ms", "a 1.6 ms", False),
    ("a\nb", "a\nb\nc", False),
    ("", "", True),
    ("", "something", False),
])
def test_the_matcher(expected, actual, result):
    assert matches(expected, actual) is result
