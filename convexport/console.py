"""The `convexport` command (and `python -m convexport`): the command line imported behind a
guard, so that Ctrl-C while its libraries load ends it as Ctrl-C later does (one line, exit
130), not with a traceback. Importing this module imports nothing else of convexport."""

import sys


def main() -> None:
    try:
        from .cli import main as command_line

        command_line()  # typer builds the command from the signatures first: Ctrl-C may land there too
    except KeyboardInterrupt:
        sys.stderr.write("convexport: interrupted\n")
        raise SystemExit(130) from None
