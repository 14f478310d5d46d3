"""The exceptions convexport raises on purpose; the CLI maps them to exit codes."""

import re
from collections.abc import Mapping


class ConvexportError(Exception):
    """A user error: unreadable model, bad rule file, bad option value (exit code 1).

    The message is one line meant for a person: it names the file (and, for rule files, the
    line) and says what to do.
    """


class ValidationError(ConvexportError):
    """The optimized graph does not compute what the original computes (exit code 3)."""

    def __init__(self, message: str, report: Mapping[str, object] | None = None):
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


def did_you_mean(given: str, names, otherwise: str = "") -> str:
    """ "; did you mean A, B?" for the names nearest `given` (at most three), or `otherwise`.
    Nearest first: names of which each hyphen-separated part of `given` abbreviates the part in
    its place (its letters in order, the first one first: conv-bn for conv-batchnorm), then
    difflib's close matches."""
    import difflib

    names = sorted(set(names))
    parts = given.lower().split("-")

    def abbreviates(name: str) -> bool:
        theirs = name.lower().split("-")
        return len(theirs) == len(parts) and all(_abbreviation(short, long) for short, long in zip(parts, theirs))

    close = [name for name in names if abbreviates(name) and name != given]
    close += [name for name in difflib.get_close_matches(given, names, n=3) if name not in close]
    return f"; did you mean {', '.join(close[:3])}?" if close else otherwise


def _abbreviation(short: str, long: str) -> bool:
    """`short`'s letters appear in `long` in order, beginning with its first letter."""
    if not short or not long or short[0] != long[0]:
        return False
    letters = iter(long)
    return all(letter in letters for letter in short)
