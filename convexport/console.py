"""The `convexport` command (and `python -m convexport`): the command line imported behind a
guard, so that Ctrl-C while its libraries load ends it as Ctrl-C later does (one line, exit
130), not with a traceback; and left as soon as the command is done. Importing this module
imports nothing else of convexport."""

import atexit
import contextlib
import os
import sys
import threading
import time


def main() -> None:
    """The command, then the process's end (_leave)."""
    try:
        run()
    except SystemExit as done:
        _leave(done.code)
    except KeyboardInterrupt:  # Ctrl-C before run()'s own guard
        sys.stderr.write("convexport: interrupted\n")
        _leave(130)
    _leave(0)


def run() -> None:
    """The command, ended by SystemExit with its exit code."""
    began = time.perf_counter()  # the command's clock: `done in` counts the imports too
    try:
        from .util import progress

        progress.COMMAND_BEGAN = began
        from .cli import main as command_line

        command_line()  # typer builds the command from the signatures first: Ctrl-C may land there too
    except KeyboardInterrupt:
        sys.stderr.write("convexport: interrupted\n")
        raise SystemExit(130) from None


def _leave(code) -> None:
    """Exit with `code` once the streams are flushed and the exit handlers have run, without the
    interpreter's finalisation: after a torch export, tearing torch's modules and libraries down
    takes over a second after the command's last line (`done in` would leave it out). Where
    another thread still runs, the interpreter exits as usual (it waits for that thread)."""
    if isinstance(code, str):  # SystemExit("message"): Python prints it and exits 1
        sys.stderr.write(f"{code}\n")
        code = 1
    code = 0 if code is None else code
    if any(thread is not threading.main_thread() and not thread.daemon for thread in threading.enumerate()):
        raise SystemExit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`| head`): nothing more to say there
            stream.flush()
    atexit._run_exitfuncs()
    os._exit(code if isinstance(code, int) else 1)
