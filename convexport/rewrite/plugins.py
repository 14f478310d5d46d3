"""User primitives: a rule file's `apply: module:function` or `apply: file.py:function`.

Loaded only from rule files the user passes (a .py path is relative to the rule file). The
function has the built-in primitives' signature, `f(match, context) -> Rewrite`, raising
convexport.algebra.Refusal to say no (convexport.primitive has both).

Loading one imports and so runs Python code: each load is announced as a RuleFileRunsCode
warning (the command line prints it as a note on stderr), so that a rule file taken from
elsewhere cannot run code unseen.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings
from pathlib import Path

from ..errors import first_line


class RuleFileRunsCode(UserWarning):
    """A rule file's `apply:` or `samplers:` named Python code, which was imported and run."""


def is_plugin_name(apply: str) -> bool:
    return ":" in apply


def load_plugin(apply: str, rule_file: Path, why: str):
    """The callable that `apply` names, its module imported (announced: `why` says which key of
    which rule named it); raises ValueError with a one-line reason."""
    module_text, _, function = apply.rpartition(":")
    if not module_text or not function.isidentifier():
        raise ValueError(f"expected module:function or file.py:function, got {apply!r}")
    if module_text.endswith(".py"):
        path = (rule_file.parent / module_text).resolve()
        if not path.is_file():
            raise ValueError(f"no such file {path}")
        _announce(rule_file, path.name, why)
        name = f"convexport_plugin_{abs(hash(str(path)))}"
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
            except Exception as exc:
                raise ValueError(f"importing {path} raised {type(exc).__name__}: {first_line(exc)}") from None
            sys.modules[name] = module
    else:
        _announce(rule_file, f"module {module_text}", why)
        try:
            module = importlib.import_module(module_text)
        except Exception as exc:
            raise ValueError(f"cannot import {module_text!r}: {first_line(exc)}") from None
    found = getattr(module, function, None)
    if not callable(found):
        raise ValueError(f"{module_text} has no function {function!r}")
    return found


def _announce(rule_file: Path, code: str, why: str) -> None:
    message = f"{rule_file}: runs the Python code of {code} ({why}); give only rule files you trust"
    warnings.warn(RuleFileRunsCode(message), stacklevel=3)
