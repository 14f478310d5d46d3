"""The exceptions convexport raises on purpose; the CLI maps them to exit codes."""

import re


class ConvexportError(Exception):
    """A user error: unreadable model, bad rule file, bad option value (exit code 1).

    The message is one line meant for a person: it names the file (and, for rule files, the
    line) and says what to do.
    """


class ValidationError(ConvexportError):
    """The optimized graph does not compute what the original computes (exit code 3)."""

    def __init__(self, message: str, report: dict | None = None):
        super().__init__(message)
        self.report = report


class InternalError(ConvexportError):
    """A bug in convexport, met through the Python API (exit code 70 on the command line): the
    API raises only ConvexportError and its subclasses; the original exception is its cause."""


# a terminal's colour and cursor codes, which torch's exporters put in their messages
_ANSI_CODE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def first_line(exc: BaseException, limit: int = 400) -> str:
    """The first line of an exception's message, without terminal codes, for one-line error
    reports; a first line that ends in a colon goes on with the lines after it, on one line.
    Over `limit` characters it ends at the last whole word before it, with "..." after."""
    text = _ANSI_CODE.sub("", str(exc)).strip() or type(exc).__name__
    lines = text.splitlines()
    if lines[0].rstrip().endswith(":") and len(lines) > 1:  # "... input 'c' of node:" then the node
        return _whole_words(" ".join(text.split()), limit)
    return _whole_words(lines[0].rstrip(), limit)


def _whole_words(line: str, limit: int) -> str:
    if len(line) <= limit:
        return line
    cut = line.rfind(" ", 0, limit)
    return line[: cut if cut > limit // 2 else limit].rstrip(" ,;:") + " ..."
