"""Keep torch's and the exporters' own logging, printing and warnings off the terminal while
convexport calls them: a failure reaches the user once, as convexport's one-line error, not
after a logged traceback (torch logs one when fake-tensor tracing or archive loading fails) or
a graph dump (the TorchScript exporter's C++ prints its IR to the process's stdout when an
operator fails, past sys.stdout)."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
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
            _standard_descriptors_silenced(),
        ):  # torch.export prints graphs there on failure
            warnings.simplefilter("always")
            yield caught
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


@contextlib.contextmanager
def _standard_descriptors_silenced():
    """File descriptors 1 and 2 on the null device while the block runs, for what C++ code
    prints; back as they were after (one that is closed is left alone)."""
    for stream in (sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    saved = []
    with open(os.devnull, "w") as null:
        for descriptor in (1, 2):
            try:
                saved.append((descriptor, os.dup(descriptor)))
            except OSError:
                continue
            os.dup2(null.fileno(), descriptor)
        try:
            yield
        finally:
            for descriptor, copy in saved:
                os.dup2(copy, descriptor)
                os.close(copy)
