"""Error messages in the words of whoever called: the command line's flags, or the Python
API's keywords.

A message is written once, in the command line's words (`pass --input NAME:DIMS`); what the
Python API raises has each flag turned into its keyword (`pass inputs=['NAME:DIMS']`) by one
table, FLAG_KEYWORDS, made from the options' declarations (options.py), so that the two cannot
drift apart. The command line marks its calls
(`speaking_to_the_command_line`); everything else is a Python caller.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator

from ..errors import ConvexportError
from ..options import FLAGS

# flag -> (keyword, how its value is written: options.Flag.keyword_form), from options.py's
# declarations; --inputs (the command line's data besides made-up inputs) is the API's input_data
FLAG_KEYWORDS = {
    **{name: (option, flag.keyword_form) for option, flag in FLAGS.items() for name in flag.names},
    "--inputs": ("input_data", "value"),
}
# a flag, then the value when the message gives one: a token that is not itself a flag and looks
# like a value (a digit, a path or spec character, a placeholder's capital), without the
# clause's closing punctuation
_FLAG = re.compile(r"(?<![\w-])(" + "|".join(sorted(map(re.escape, FLAG_KEYWORDS), key=len, reverse=True)) + r")\b"
                   r"(?:('s)|[ =](?!-)(?=[^\s;,()]*[0-9:./_A-Z])([^\s;,()]*[^\s;,().:]))?")  # fmt: skip

_command_line: contextvars.ContextVar[bool] = contextvars.ContextVar("command_line", default=False)


@contextlib.contextmanager
def speaking_to_the_command_line() -> Iterator[None]:
    """Messages raised in the block keep the command line's flags."""
    token = _command_line.set(True)
    try:
        yield
    finally:
        _command_line.reset(token)


@contextlib.contextmanager
def in_callers_words() -> Iterator[None]:
    """A ConvexportError leaving the block is said in the API's keywords, unless the command
    line called (its type, cause and report kept)."""
    try:
        yield
    except ConvexportError as exc:
        if not _command_line.get() and exc.args and isinstance(exc.args[0], str):
            exc.args = (in_api_words(exc.args[0]), *exc.args[1:])
        raise


def in_api_words(message: str) -> str:
    """`message` with each flag (and its value, where it gives one) as the API's keyword."""
    return _FLAG.sub(_keyword, message)


def _keyword(found: re.Match) -> str:
    keyword, form = FLAG_KEYWORDS[found[1]]
    if found[2]:  # "--input's count": the argument's
        return f"the {keyword} argument's"
    value = found[3]
    if form in ("True", "False"):
        return f"{keyword}={form}" + (f" {value}" if value else "")
    if value is None:
        return f"{keyword}="
    return f"{keyword}=[{value!r}]" if form == "list" else f"{keyword}={_literal(value)}"


def _literal(value: str) -> str:
    return value if re.fullmatch(r"-?\d+(\.\d+)?", value) else repr(value)
