"""How optimize tells its steps as they go: their names to a progress callable (the command
line's spinner, a notebook's lines), the seconds each took, a large model's bytes read or
written."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from ..options import Progress

# When the command line began (console.py), before its libraries were imported: optimize's
# first step and its total count from there. None under the Python API (from the call).
COMMAND_BEGAN: float | None = None


class Steps:
    """The optimize steps as they go: each one announced to `progress` (a callable taking the
    step's name, or the name and a note such as "12/40 runs"), and the seconds each took."""

    def __init__(self, progress: Progress | None):
        self.progress = progress
        self.seconds: dict[str, float] = {}
        global COMMAND_BEGAN
        self.began = self.current_start = COMMAND_BEGAN if COMMAND_BEGAN is not None else time.perf_counter()
        COMMAND_BEGAN = None  # once: a later call in the same process counts from its own start
        self.current: str | None = None

    def start(self, step: str, note: str | None = None) -> None:
        if step != self.current:
            self._close()
            # the first step from the start: a command's imports are its loading
            self.current, self.current_start = step, self.began if self.current is None else time.perf_counter()
        if self.progress is not None:
            self.progress(step if note is None else f"{step} ({note})")

    def elapsed(self) -> float:
        """Seconds since the first step began."""
        return time.perf_counter() - self.began

    def finish(self) -> dict[str, float]:
        """{step: seconds, ..., "total": seconds} (a step's key is its name's first word)."""
        self._close()
        return {**self.seconds, "total": round(time.perf_counter() - self.began, 3)}

    def _close(self) -> None:
        if self.current is not None:
            key = self.current.split()[0]
            self.seconds[key] = round(self.seconds.get(key, 0.0) + time.perf_counter() - self.current_start, 3)


class BytesShown:
    """A large model's step told in bytes as its weights are read or written (ir.counting_bytes):
    "rewriting (0.41 of 1.01 GiB of weights read)", each time the figure shown changes."""

    def __init__(self, say: Callable[[str, str], None], step: str, what: str, total: int):
        self.say, self.step, self.what, self.total = say, step, what, total
        self.done, self.shown = 0, ""

    def __call__(self, length: int) -> None:
        self.done += length
        text = f"{self.done / 2**30:.2f} of {self.total / 2**30:.2f} GiB {self.what}"
        if text != self.shown:
            self.shown = text
            self.say(self.step, text)


def notebook_progress() -> Progress | None:
    """In a Jupyter or IPython kernel, each step of optimize() as one line on stderr (a script
    run from a terminal is left quiet: the command line has its own display)."""
    shell = sys.modules.get("IPython")
    if shell is None or getattr(shell, "get_ipython", lambda: None)() is None:
        return None
    shown: list[str] = []

    def show(message: str) -> None:
        step = message.split(" (")[0]
        if not shown or shown[-1] != step:
            shown.append(step)
            print(f"convexport: {step}", file=sys.stderr, flush=True)

    return show
