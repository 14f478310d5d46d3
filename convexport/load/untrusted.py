"""Reading torch archives without running code from them.

torch.export.load reads a `.pt2` through several doors that run code the archive supplies:
pickled sample inputs, weights and constants (torch.load, which falls back to
weights_only=False when the safe load fails), opaque constants (pickle.loads), TorchScript
custom objects (torch._C._pickle_load_obj), compiled AOTInductor kernels (a shared library
loaded from data/aotinductor/) and symbolic sizes, which it parses with sympy.sympify, an
eval. `no_code_from_archive` closes each door while a load runs, unless the user trusts the
file: torch.load may only take its safe path, the pickle loaders are refused, sympify gets
only arithmetic over sizes, and that bounded (no tower of powers, no literal of more than
MAX_LITERAL_DIGITS digits: `9**9**9**9` is arithmetic that never ends). A refusal is an
ArchiveRunsCode naming what would have run.

One door opens after the load: the program's guards (`guards_code`, Python text from the
archive) are compiled with exec into a function that runs on every call of `program.module()`,
as the ONNX export makes. `unsafe_guard` says which guard is not a comparison of input sizes;
torch's own verifier already refuses a graph node whose target is not an operator.

The doors are closed by replacing module attributes (torch.load, pickle.loads, ...) for the
duration of the block, so the block is not thread-safe: convexport loads one model at a time.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import keyword
import pickle
import tokenize
import zipfile
from pathlib import Path


class ArchiveRunsCode(Exception):
    """Loading the archive would have run code from it (what, in the message). Not a
    RuntimeError, which torch.export.load catches to try its older format."""


# Names an exported program's size expressions use (torch's serializer writes
# Symbol('s77', positive=True, integer=True), 2*s77, FloorDiv(s0, 2), ...): sympy's
# arithmetic and torch.utils._sympy.functions. Any other bare name in an expression is a
# symbol (s77, u0), anything else is refused.
# fmt: off
_SYMPY_NAMES = frozenset({
    "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Mod", "Max", "Min", "Abs", "floor", "ceiling",
    "sqrt", "Piecewise", "And", "Or", "Not", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "StrictLessThan",
    "StrictGreaterThan", "LessThan", "GreaterThan", "Equality", "Unequality", "True", "False", "oo", "zoo", "nan",
    "Identity", "FloorDiv", "ModularIndexing", "Where", "PythonMod", "CleanDiv", "CeilToInt", "FloorToInt",
    "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal", "ToFloat",
    "BitwiseFn_bitwise_and", "BitwiseFn_bitwise_or", "OpaqueUnaryFn_sqrt",
})
_SAFE_OPERATORS = frozenset({"(", ")", ",", "+", "-", "*", "/", "%", "=", "**", "//", "<", ">", "<=", ">=", "==", "!=",
                             "&", "|", "~"})
# fmt: on


# A literal longer than any size (2**63 has 19 digits), and the powers of literals an
# expression may hold: each may raise a number to at most MAX_EXPONENT, so that no expression
# makes a number of more than a few thousand digits.
MAX_LITERAL_DIGITS = 40
MAX_EXPONENT = 64
MAX_POWERS = 4


def is_size_expression(text: str) -> bool:
    """Whether `text` is arithmetic over sizes that sympify can parse without running
    anything: numbers, operators, the names above, symbol names, a quoted symbol name and
    keyword arguments (Symbol('s0', positive=True)). No attribute access, no subscript, no
    other name: sympify evaluates its string with Python's eval, builtins included."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return False
    if not _powers_bounded(tokens):
        return False
    for index, token in enumerate(tokens):
        kind, value = token.type, token.string
        if kind == tokenize.NUMBER and len(value) > MAX_LITERAL_DIGITS:
            return False
        if kind in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.NUMBER):
            continue
        if kind == tokenize.OP and value in _SAFE_OPERATORS:
            continue
        if kind == tokenize.STRING and value[:1] in "'\"" and value[1:-1].isidentifier() and value[0] == value[-1]:
            continue
        if kind == tokenize.NAME and _is_safe_name(value, tokens[index + 1 :]):
            continue
        return False
    return True


def _powers_bounded(tokens: list) -> bool:
    """Whether every `**` raises to a symbol or to a literal of at most MAX_EXPONENT that no
    other power follows (2**s0, s0**2; not 9**9**9, 2**(9**9) nor 10**100000), at most
    MAX_POWERS times."""
    powers = [index for index, token in enumerate(tokens) if token.type == tokenize.OP and token.string == "**"]
    if len(powers) > MAX_POWERS:
        return False
    for index in powers:
        exponent, after = tokens[index + 1], tokens[index + 2] if index + 2 < len(tokens) else None
        if after is not None and after.type == tokenize.OP and after.string == "**":
            return False
        if exponent.type == tokenize.NAME and exponent.string not in _SYMPY_NAMES:
            continue
        if exponent.type != tokenize.NUMBER:
            return False
        try:
            if abs(float(exponent.string)) > MAX_EXPONENT:
                return False
        except ValueError:
            return False
    return True


def _is_safe_name(name: str, rest: list) -> bool:
    if name in _SYMPY_NAMES:
        return True
    if keyword.iskeyword(name) or name.startswith("_") or hasattr(builtins, name):
        return False
    follows = next((token.string for token in rest if token.type != tokenize.NL), "")
    is_keyword_argument = follows == "=" and name.isidentifier()
    is_symbol = name.rstrip("0123456789") != name and name.rstrip("0123456789").isalpha()  # s77, u0, q12
    return is_keyword_argument or is_symbol


# What a guard may be made of: torch writes each as a comparison of the inputs' sizes,
# `L['x'].size()[0] >= 2`, `(L['x'].size()[0]) % 2 == 0`, `L['x'].stride()[0] == L['x'].size()[1]`,
# `max(1, 4*(L['x'].size()[0] // 2)) == ...`, and math's rounding of them.
_GUARD_NODES = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd, ast.BinOp, ast.Add,
    ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.Compare, ast.Eq, ast.NotEq, ast.Lt, ast.LtE,
    ast.Gt, ast.GtE, ast.Constant, ast.Subscript, ast.Call, ast.Attribute, ast.Name, ast.Load,
)  # fmt: skip
_TENSOR_METHODS = frozenset({"size", "stride", "storage_offset", "dim", "numel"})
_MATH_FUNCTIONS = frozenset({"floor", "ceil", "trunc", "sqrt", "log2"})
# what torch's ShapeGuardPythonPrinter prints for Max, Min, Abs, ToFloat, TruncToInt, RoundToInt
# and the two functions of the namespace torch runs guards in
_GUARD_FUNCTIONS = frozenset({
    "max", "min", "abs", "float", "int", "round", "IsNonOverlappingAndDenseIndicator",
    "cast_symbool_to_symint_guardless",
})  # fmt: skip
_GUARD_NAMES = frozenset({"L", "math", "inf"}) | _GUARD_FUNCTIONS
MAX_GUARD_CHARACTERS = 2_000


def unsafe_guard(guards: list[str]) -> str | None:
    """The first of a program's guards that is not a comparison of its inputs' sizes (see
    _GUARD_NODES), or None when all are."""
    for guard in guards:
        if not isinstance(guard, str) or not _is_size_guard(guard):
            return str(guard)
    return None


def _is_size_guard(text: str) -> bool:
    if len(text) > MAX_GUARD_CHARACTERS or "\n" in text or "\r" in text:
        return False  # (the guard is pasted into a line of generated code)
    try:
        nodes = list(ast.walk(ast.parse(text, mode="eval")))
    except (SyntaxError, ValueError):
        return False
    powers = [node for node in nodes if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow)]
    return len(powers) <= MAX_POWERS and all(map(_allowed_in_guard, nodes))


def _allowed_in_guard(node: ast.AST) -> bool:
    if not isinstance(node, _GUARD_NODES):
        return False
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str):
            return node.value.isidentifier()  # L['x']
        return isinstance(node.value, (int, float)) and len(repr(node.value)) <= MAX_LITERAL_DIGITS
    if isinstance(node, ast.Name):
        return node.id in _GUARD_NAMES
    if isinstance(node, ast.Attribute):
        return _is_guard_attribute(node)
    if isinstance(node, ast.Call):  # L['x'].size(), math.floor(...), max(1, ...)
        if isinstance(node.func, ast.Name):
            return not node.keywords and node.func.id in _GUARD_FUNCTIONS
        return not node.keywords and len(node.args) <= 1 and isinstance(node.func, ast.Attribute)
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        exponent = node.right
        return (
            isinstance(exponent, ast.Constant)
            and isinstance(exponent.value, int)
            and abs(exponent.value) <= MAX_EXPONENT
        )
    return True


def _is_guard_attribute(node: ast.Attribute) -> bool:
    """A size method of an input (`L['x'].size`) or one of math's rounding functions."""
    if isinstance(node.value, ast.Name) and node.value.id == "math":
        return node.attr in _MATH_FUNCTIONS
    return node.attr in _TENSOR_METHODS and isinstance(node.value, ast.Subscript)


def compiled_code_members(path: Path) -> list[str]:
    """The members of a `.pt2` archive that hold compiled code (AOTInductor packages, shared
    libraries), which torch.export.load loads and so runs."""
    with zipfile.ZipFile(path) as archive:
        return [
            name
            for name in archive.namelist()
            if "/aotinductor/" in f"/{name}" or name.lower().endswith((".so", ".dll", ".dylib", ".pyd"))
        ]


@contextlib.contextmanager
def no_code_from_archive():
    """While the block runs, the loaders torch uses for archive contents run no code from them
    (see the module doc); what would have is raised as ArchiveRunsCode. Even where torch
    swallows that exception and tries another way, the block ends with it."""
    import sympy
    import torch

    refused: list[str] = []

    def refuse(what: str):
        refused.append(what)
        raise ArchiveRunsCode(what)

    real_load, real_sympify = torch.load, sympy.sympify

    def safe_torch_load(*args, **kwargs):
        if kwargs.get("weights_only") is False:
            refuse("a pickled object that is not a plain tensor or container (unpickling it runs code)")
        kwargs["weights_only"] = True
        return real_load(*args, **kwargs)

    def safe_sympify(value, *args, **kwargs):
        if isinstance(value, str) and not is_size_expression(value):
            refuse(
                f"a size expression that is not bounded arithmetic over sizes ({value[:60]!r}); sympy would evaluate it"
            )
        return real_sympify(value, *args, **kwargs)

    def no_pickle(*_args, **_kwargs):
        refuse("a pickled Python object (unpickling it runs code)")

    def no_custom_object(*_args, **_kwargs):
        refuse("a TorchScript custom object (loading it runs its class's code)")

    replaced = [
        (torch, "load", safe_torch_load),
        (sympy, "sympify", safe_sympify),
        (pickle, "loads", no_pickle),
        (pickle, "load", no_pickle),
        (torch._C, "_pickle_load_obj", no_custom_object),
    ]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in replaced]
    for owner, name, stand_in in replaced:
        setattr(owner, name, stand_in)
    try:
        yield
    except Exception:
        if refused:  # whatever torch made of the refusal, the refusal is the reason
            raise ArchiveRunsCode(refused[0]) from None
        raise
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
    if refused:  # torch caught it and loaded the archive another way
        raise ArchiveRunsCode(refused[0])
