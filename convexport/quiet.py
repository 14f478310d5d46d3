"""Keep torch's and the exporters' own logging and warnings off the terminal while convexport
calls them: a failure reaches the user once, as convexport's one-line error, not after a
logged traceback (torch logs one when fake-tensor tracing or archive loading fails)."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings

_LIBRARIES = ("torch", "onnxscript")


@contextlib.contextmanager
def quiet_libraries():
    """Every logger of torch and onnxscript held at CRITICAL (those torch._logging set a level
    on too, which would not inherit one from "torch"), what is printed to stdout and stderr
    swallowed, and the warnings kept in the list it yields instead of shown."""
    manager = logging.Logger.manager
    loggers = [logging.getLogger(name) for name in _LIBRARIES] + [
        logger
        for name, logger in list(manager.loggerDict.items())
        if isinstance(logger, logging.Logger) and name.startswith(tuple(f"{lib}." for lib in _LIBRARIES))
    ]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        with (
            warnings.catch_warnings(record=True) as caught,
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):  # torch.export prints graphs there on failure
            warnings.simplefilter("always")
            yield caught
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
