"""The `convexport` command (and `python -m convexport`): the command line imported behind a
guard, so that Ctrl-C while its libraries load ends it as Ctrl-C later does (one line, exit
130), not with a traceback. Importing this module imports nothing else of convexport."""

import sys
import time


def main() -> None:
    began = time.perf_counter()  # the command's clock: `done in` counts the imports too
    try:
        from . import progress

        progress.COMMAND_BEGAN = began
        from .cli import main as command_line

        command_line()  # typer builds the command from the signatures first: Ctrl-C may land there too
    except KeyboardInterrupt:
        sys.stderr.write("convexport: interrupted\n")
        raise SystemExit(130) from None
