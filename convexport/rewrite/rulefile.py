"""Rule files: YAML documents holding rules; parsed with every error as file:line:col.

    rules:
      - name: conv-batchnorm
        doc: BatchNormalization after a Conv scales its weights and shifts its bias.
        match:
          - c = Conv(x, w, b?)
          - y = BatchNormalization[training_mode=0](c, scale, shift, mean, var)
        where:              # silent: no match unless these hold
          rank: {x: [3, 4, 5]}
        require:            # reported: the report's `skipped` lists the failing reason
          constant: [w, b, scale, shift, mean, var]
          private: [c]
        apply: compose_linear
        with: {}            # optional parameters for the primitive

See docs/rules.md for the language; pattern lines are parsed by pattern.py.
"""

from __future__ import annotations

import functools
import stat
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import onnx
import yaml

from ..errors import ConvexportError
from ..folds import builtin_primitives
from ..folds.primitives import contract_of
from .conditions import CONDITIONS
from .contracts import contract_problems
from .pattern import PatternNode, PatternSyntaxError, parse_pattern_line
from .plugins import is_plugin_name, load_plugin

RULE_KEYS = {"name", "doc", "match", "where", "require", "apply", "with", "override", "samplers", "examples"}


@dataclass(frozen=True)
class Rule:
    name: str
    doc: str
    pattern: tuple[PatternNode, ...]
    where: tuple[tuple[str, object], ...]  # silent: a failure is no match
    require: tuple[tuple[str, object], ...]  # reported: a failure is a refusal
    apply: str
    params: dict = field(default_factory=dict, hash=False, compare=False)
    file: str = ""
    line: int = 0
    plugin: object = field(default=None, hash=False, compare=False)  # a user primitive (apply: module:function)
    override: bool = False  # replaces the earlier rule of its name (a built-in one, say)
    samplers: dict = field(default_factory=dict, hash=False, compare=False)  # op -> the author's sampler
    examples: tuple = ()  # (model path, whether the rule must rewrite it), for rules test

    @functools.cached_property  # (read for every match the engine records)
    def builtin(self) -> bool:
        """One of convexport's own rules (an exception in its primitive is convexport's bug)."""
        return Path(self.file).resolve().parent == _builtin_folder()

    @functools.cached_property
    def shown_file(self) -> str:
        """The rule file as reports name it: rules/NAME for a built-in one (wherever the package
        is installed), the path given for a user's."""
        return f"rules/{Path(self.file).name}" if self.builtin else self.file

    @property
    def root(self) -> PatternNode:
        return self.pattern[-1]

    def may_match(self, ops_present) -> bool:
        """Whether a scope holding these op types may hold a match: one of each line's ops
        (a line of an op class has several) is there."""
        return all(not line.op_types.isdisjoint(ops_present) for line in self.pattern)

    @property
    def is_group(self) -> bool:
        """A group pattern: the last line is an element line, matched by every node (two or
        more) that reaches one shared tensor, the anchor, through the pattern."""
        return self.root.is_element

    @property
    def anchor(self) -> str | None:
        """The group's shared tensor: the first plain name that no line produces."""
        produced = {ref.name for line in self.pattern for ref in line.outputs}
        for line in reversed(self.pattern):
            for ref in line.inputs:
                if not ref.per_element and not ref.wildcard and ref.name not in produced:
                    return ref.name
        return None


# libyaml's parser where PyYAML was built with it (several times faster; the same nodes and marks)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# An error line quotes at most this much of a message (a value an author wrote can be long)
MAX_MESSAGE = 1000


class RuleFileError(ConvexportError):
    def __init__(self, file: str, line: int, column: int, message: str):
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 3] + "..."
        super().__init__(f"{file}:{line}:{column}: {message}")


def _brief(value) -> str:
    """A value as an error message quotes it: its repr, cut to a few dozen characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def builtin_rule_files() -> list[Path]:
    folder = resources.files("convexport.builtin_rules")
    return sorted(Path(str(entry)) for entry in folder.iterdir() if entry.name.endswith(".yaml"))


def rule_files(paths: list[str | Path]) -> list[Path]:
    """Expand files and folders (their *.yaml / *.yml, sorted) given with --rules."""
    found = []
    for raw in paths:
        path = Path(raw)
        try:
            if path.is_dir():
                inside = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
                if not inside:
                    raise ConvexportError(f"{raw}: a folder without rule files (*.yaml, *.yml)")
                found.extend(inside)
            elif path.is_file():
                found.append(path)
            elif path.exists():
                raise ConvexportError(f"{raw}: not a regular file (a FIFO, socket or device); give a rule file")
            else:
                raise ConvexportError(f"{raw}: no such rule file or folder")
        except OSError as exc:
            raise ConvexportError(f"{raw}: {exc.strerror or exc}") from None
    return found


def load_rules(files: list[Path], primitives: set[str]) -> list[Rule]:
    """The rules of `files`, in the order they run: files by name (a built-in file before a
    user's of the same name), rules in file order. A rule named as an earlier one is an error,
    unless it says `override: true`: then it takes that rule's place in the list."""
    rules: list[Rule] = []
    seen: dict[str, str] = {}
    for path in sorted(files, key=lambda path: path.name):
        for rule in parse_rule_file(path, primitives):
            if rule.name in seen and not rule.override:
                raise RuleFileError(
                    str(path),
                    rule.line,
                    1,
                    f"rule {rule.name!r} is already defined in {seen[rule.name]} (say override: true to replace it)",
                )
            if rule.override and rule.name not in seen:
                raise RuleFileError(str(path), rule.line, 1, f"rule {rule.name!r} overrides no rule of that name")
            if rule.name in seen:
                rules = [rule if kept.name == rule.name else kept for kept in rules]
            else:
                rules.append(rule)
            seen[rule.name] = f"{rule.file}:{rule.line}"
    return rules


# A rule file is a few KiB (the largest built-in one 5.5 KiB): a 20 MB one took YAML minutes and
# gigabytes before any check of its content, so its size is checked first.
MAX_RULE_FILE_BYTES = 1 << 20


def read_rule_text(path: Path) -> str:
    """A rule file's text: a regular file (a FIFO would block the read) of at most
    MAX_RULE_FILE_BYTES, in UTF-8; a ConvexportError otherwise."""
    try:
        status = path.stat()
        if not stat.S_ISREG(status.st_mode):
            raise ConvexportError(f"{path}: cannot read rule file (not a regular file)")
        if status.st_size > MAX_RULE_FILE_BYTES:
            raise ConvexportError(
                f"{path}: cannot read rule file ({status.st_size / 2**20:.1f} MiB; a rule file is at most "
                f"{MAX_RULE_FILE_BYTES >> 20} MiB)"
            )
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConvexportError(f"{path}: cannot read rule file ({exc})") from exc


def parse_rule_file(path: Path, primitives: set[str]) -> list[Rule]:
    file = str(path)
    text = read_rule_text(path)
    if path.resolve().parent == _builtin_folder():
        return list(_parsed_builtin(file, text, frozenset(primitives)))
    return _parsed(file, text, primitives)


@functools.cache
def _builtin_folder() -> Path:
    return Path(str(resources.files("convexport.builtin_rules"))).resolve()


@functools.cache
def _parsed_builtin(file: str, text: str, primitives: frozenset[str]) -> tuple[Rule, ...]:
    """convexport's own rule files, parsed once per process for each text (a pipeline that
    calls optimize in a loop parses them once); they name no plugin, whose module a later
    call would have to import again."""
    return tuple(_parsed(file, text, primitives))


# A rule file nests a few levels (rules, a rule, its conditions, a list); the YAML parser
# recurses once per level on the C stack, and tens of thousands of levels crash the process.
MAX_NESTING = 64
# A rule file's values, counted as its YAML aliases expand them (each alias stands for a whole
# copy of what its anchor holds): the built-in files hold about a thousand; nine nested
# aliases of ten make a billion, which building or printing would take minutes and gigabytes.
MAX_EXPANDED_VALUES = 100_000


def _check_expansion(file: str, document) -> None:
    """A RuleFileError naming the first rule (or the file) whose values, aliases expanded,
    number over MAX_EXPANDED_VALUES, or that an alias makes contain itself. Counted on the
    composed nodes, where an alias is a second reference to its anchor's node: linear in the
    file's size, whatever the expansion."""
    sizes: dict[int, int | None] = {}  # None: being counted (an alias back into it is a cycle)

    def size(node) -> int:
        key = id(node)
        if key in sizes:
            if sizes[key] is None:
                raise RuleFileError(file, _line(node), _column(node), "a YAML alias makes this value contain itself")
            return sizes[key]
        sizes[key] = None
        children = node.value if isinstance(node, yaml.SequenceNode) else []
        if isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        sizes[key] = min(1 + sum(size(child) for child in children), MAX_EXPANDED_VALUES + 1)
        return sizes[key]

    rules = _mapping(document).get("rules", (None, None))[1] if isinstance(document, yaml.MappingNode) else None
    for node in (rules.value if isinstance(rules, yaml.SequenceNode) else []) + [document]:
        if size(node) > MAX_EXPANDED_VALUES:
            raise RuleFileError(
                file,
                _line(node),
                _column(node),
                f"expands to over {MAX_EXPANDED_VALUES:,} values through YAML aliases (*name); write the values out",
            )


def _check_nesting(file: str, text: str) -> None:
    """A RuleFileError where the text nests deeper than MAX_NESTING, in flow style ([ and {)
    or by indentation, before the parser sees it. Brackets inside quotes count too: a rule
    file has no business with 64 of them open at once."""
    depth, indents = 0, []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip(" ")
        if stripped and not stripped.startswith("#"):
            indent = len(line) - len(stripped)
            while indents and indents[-1] >= indent:
                indents.pop()
            indents.append(indent)
            if len(indents) > MAX_NESTING:
                raise RuleFileError(file, number, indent + 1, f"nested deeper than {MAX_NESTING} levels")
        for column, char in enumerate(line, 1):
            depth += (char in "[{") - (char in "]}")
            if depth > MAX_NESTING:
                raise RuleFileError(file, number, column, f"nested deeper than {MAX_NESTING} levels")


def rule_file_errors(paths: list[Path], primitives: set[str]) -> tuple[int, list[str]]:
    """`rules check`: (the number of rules that parse, every error in every file): each rule's
    mistakes (all of them), a name defined twice, a name that a built-in rule already has."""
    builtin = {rule.name: (Path(rule.file).name, rule.line) for rule in load_rules(builtin_rule_files(), primitives)}
    # a built-in file is itself wherever it lies (the checkout's rules/, an installed package's
    # convexport/builtin_rules/): known by what it holds, not by its path
    builtin_texts = {read_rule_text(path) for path in builtin_rule_files()}
    seen: dict[str, str] = {}
    good, errors = 0, []
    for path in paths:
        try:
            text = read_rule_text(path)
        except ConvexportError as exc:
            errors.append(str(exc))
            continue
        is_builtin = text in builtin_texts
        try:
            nodes = _rule_nodes(str(path), text)
        except RuleFileError as exc:
            errors.append(str(exc))
            continue
        for node in nodes:
            try:
                rule = _parse_rule(str(path), node, primitives)
            except RuleErrors as found:
                errors += [str(error) for error in found.errors]
                continue
            except RuleFileError as exc:
                errors.append(str(exc))
                continue
            where = f"{rule.file}:{rule.line}"
            if rule.name in builtin and not is_builtin and not rule.override:
                theirs = f"rules/{builtin[rule.name][0]}:{builtin[rule.name][1]}"
                errors.append(f"{where}:1: rule {rule.name!r} has the name of the built-in rule at {theirs}")
            elif rule.name in seen and not rule.override:
                errors.append(f"{where}:1: rule {rule.name!r} is already defined in {seen[rule.name]}")
            elif rule.override and rule.name not in builtin and rule.name not in seen:
                errors.append(f"{where}:1: rule {rule.name!r} overrides no rule of that name")
            else:
                good += 1
            seen.setdefault(rule.name, where)
    return good, errors


def _parsed(file: str, text: str, primitives: set[str]) -> list[Rule]:
    return [_parse_rule(file, node, primitives) for node in _rule_nodes(file, text)]


def _yaml_error(file: str, exc: yaml.YAMLError) -> RuleFileError:
    """A YAML error at the construct it is about (an unclosed bracket or quote: where it opened),
    saying where the parser noticed when that is elsewhere."""
    problem, context = getattr(exc, "problem_mark", None), getattr(exc, "context_mark", None)
    opened = str(getattr(exc, "context", "") or "")
    if not ("flow" in opened or "quoted" in opened):  # only an unclosed construct is about where it opened
        context = None
    where = context or problem
    line, column = (where.line + 1, where.column + 1) if where else (1, 1)
    message = f"not valid YAML: {getattr(exc, 'problem', None) or exc}"
    if context is not None and problem is not None and problem.line != context.line:
        message += f" ({getattr(exc, 'context', 'this')} here; noticed on line {problem.line + 1})"
    return RuleFileError(file, line, column, message)


def _rule_nodes(file: str, text: str) -> list:
    """The YAML nodes of the file's rules (each parsed on its own)."""
    _check_nesting(file, text)
    try:
        document = yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        raise _yaml_error(file, exc) from None
    _check_expansion(file, document)
    if not isinstance(document, yaml.MappingNode):
        raise RuleFileError(file, 1, 1, "a rule file is a mapping with a 'rules:' list")
    top = _mapping(document)
    if "rules" not in top or not isinstance(top["rules"][1], yaml.SequenceNode):
        raise RuleFileError(file, _line(document), 1, "expected a top-level 'rules:' list")
    return list(top["rules"][1].value)


def _parse_rule(file: str, node, primitives: set[str]) -> Rule:
    """The rule, or RuleErrors with every mistake found in it (a missing `doc:` hides none of the
    others): each part is checked on its own, and what depends on a part that failed is not."""
    if not isinstance(node, yaml.MappingNode):
        raise RuleFileError(file, _line(node), _column(node), "each rule is a mapping with name, doc, match, apply")
    errors: list[RuleFileError] = []

    def attempt(parse, *args):
        try:
            return parse(*args)
        except RuleFileError as error:
            errors.append(error)
            return None

    fields = _mapping(node)
    for key, (key_node, _) in fields.items():
        if key not in RULE_KEYS:
            expected = ", ".join(sorted(RULE_KEYS))
            errors.append(
                RuleFileError(file, _line(key_node), _column(key_node), f"unknown key {key!r} (expected {expected})")
            )
    for key in ("name", "doc", "match", "apply"):
        if key not in fields:
            errors.append(RuleFileError(file, _line(node), _column(node), f"rule lacks {key!r}"))
    scalar = {
        key: attempt(_scalar, file, fields[key][1], key) if key in fields else None for key in ("name", "doc", "apply")
    }
    name = scalar["name"] or "?"
    apply, plugin = scalar["apply"], None
    if apply is not None:
        plugin = attempt(_primitive, file, name, apply, fields["apply"][1], primitives)
        if plugin is None and apply not in primitives:
            apply = None  # (its error is recorded)
    pattern = attempt(_parse_match, file, name, fields["match"][1]) if "match" in fields else None
    where, require = (
        attempt(_parse_conditions, file, name, key, fields[key][1], pattern) if key in fields and pattern else ()
        for key in ("where", "require")
    )
    params = attempt(_parse_params, file, name, apply, plugin, fields["with"][1]) if "with" in fields else {}
    if apply is not None and pattern is not None:
        errors += _contract_errors(file, name, apply, plugin, pattern, fields["match"][1])
    samplers = attempt(_parse_samplers, file, name, fields["samplers"][1]) if "samplers" in fields else {}
    examples = attempt(_parse_examples, file, name, fields["examples"][1]) if "examples" in fields else ()
    override = attempt(_parse_override, file, fields["override"][1]) if "override" in fields else False
    if errors:
        raise RuleErrors(errors)
    return Rule(
        name,
        scalar["doc"],
        pattern,
        tuple(where),
        tuple(require),
        apply,
        params,
        file,
        _line(node),
        plugin,
        override,
        samplers,
        examples,
    )


class RuleErrors(RuleFileError):
    """Every mistake found in one rule; its message is the first, with how many more there are
    (`rules check` lists them all)."""

    def __init__(self, errors: list[RuleFileError]):
        self.errors = errors
        more = (
            f" (and {len(errors) - 1} more in this rule: convexport rules check lists them)" if len(errors) > 1 else ""
        )
        Exception.__init__(self, f"{errors[0]}{more}")


def _primitive(file: str, rule: str, apply: str, node, primitives) -> object | None:
    """A user primitive (`apply: module:function`), loaded; None for a built-in one; a
    RuleFileError for a name that is neither."""
    if is_plugin_name(apply):
        try:
            return load_plugin(apply, Path(file), f"apply: of rule {rule!r}")
        except ValueError as exc:
            raise RuleFileError(
                file, _line(node), _column(node), f"rule {rule!r}: primitive {apply!r}: {exc}"
            ) from None
    if apply not in primitives:
        known = ", ".join(sorted(primitives))
        raise RuleFileError(
            file,
            _line(node),
            _column(node),
            f"rule {rule!r}: unknown primitive {apply!r} (known: {known}, or module:function)",
        )
    return None


def _parse_params(file: str, rule: str, apply: str | None, plugin, node) -> dict:
    params = _value(file, node)
    if not isinstance(params, dict):
        raise RuleFileError(file, _line(node), _column(node), "'with' must be a mapping")
    known = None if plugin is not None or apply is None else _accepted_params(apply)
    unknown = sorted(set(params) - known) if known is not None else []
    if unknown:
        raise RuleFileError(
            file,
            _line(node),
            _column(node),
            f"rule {rule!r}: {apply} takes no parameter {', '.join(map(repr, unknown))} "
            f"(it takes {', '.join(sorted(known)) or 'none'})",
        )
    return params


def _parse_override(file: str, node) -> bool:
    override = _value(file, node)
    if not isinstance(override, bool):
        raise RuleFileError(file, _line(node), _column(node), "'override' is true or false")
    return override


def _contract_errors(file: str, rule: str, apply: str, plugin, pattern, match_node) -> list[RuleFileError]:
    """Where the pattern breaks what its primitive declares it reads (primitives.consumes; a
    user primitive without the declaration is not checked)."""
    primitive = plugin if plugin is not None else builtin_primitives().get(apply)
    contract = contract_of(primitive)
    if contract is None:
        return []
    return [
        RuleFileError(file, line or _line(match_node), 1, f"rule {rule!r}: {message}")
        for line, message in contract_problems(pattern, contract, apply)
    ]


def _parse_samplers(file: str, rule: str, node) -> dict:
    """`samplers: {OpType: file.py:function}`: the author's samplers for `rules test` (the
    signature of convexport/ruletest/samplers.py's), loaded as primitives are."""
    value = _value(file, node)
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise RuleFileError(
            file, _line(node), _column(node), f"rule {rule!r}: 'samplers' maps op types to file.py:function"
        )
    loaded = {}
    for op, where in value.items():
        if not onnx.defs.has(str(op)):
            raise RuleFileError(file, _line(node), _column(node), f"rule {rule!r}: samplers: unknown ONNX op {op!r}")
        try:
            loaded[str(op)] = load_plugin(where, Path(file), f"samplers: of rule {rule!r}")
        except ValueError as exc:
            raise RuleFileError(file, _line(node), _column(node), f"rule {rule!r}: sampler {where!r}: {exc}") from None
    return loaded


def _parse_examples(file: str, rule: str, node) -> tuple:
    """`examples: [{model: a.onnx, rewrites: true}, ...]`: small models (paths relative to the
    rule file) that `rules test` checks the rule rewrites, exactly, or leaves alone."""
    value = _value(file, node)
    shape = "a list of {model: FILE.onnx, rewrites: true|false}"
    if not isinstance(value, list):
        raise RuleFileError(file, _line(node), _column(node), f"rule {rule!r}: 'examples' is {shape}")
    examples = []
    for item in value:
        if not isinstance(item, dict) or set(item) != {"model", "rewrites"} or not isinstance(item["rewrites"], bool):
            raise RuleFileError(file, _line(node), _column(node), f"rule {rule!r}: 'examples' is {shape}")
        path = (Path(file).parent / str(item["model"])).resolve()
        if not path.is_file():
            raise RuleFileError(file, _line(node), _column(node), f"rule {rule!r}: example {path}: no such file")
        examples.append((path, item["rewrites"]))
    return tuple(examples)


def _parse_match(file: str, rule: str, node) -> tuple[PatternNode, ...]:
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise RuleFileError(file, _line(node), _column(node), f"rule {rule!r}: 'match' is a list of pattern lines")
    lines = []
    for item in node.value:
        text = _scalar(file, item, "pattern line")
        try:
            parsed = parse_pattern_line(text, _line(item))
        except PatternSyntaxError as exc:
            raise RuleFileError(file, _line(item), _column(item) + exc.column - 1, f"rule {rule!r}: {exc}") from None
        if parsed.is_class:
            problem = _op_class_problem(parsed)
            if problem:
                raise RuleFileError(file, _line(item), _column(item), f"rule {rule!r}: {problem}")
            lines.append(parsed)
            continue
        if not onnx.defs.has(parsed.op_type):
            raise RuleFileError(file, _line(item), _column(item), f"rule {rule!r}: unknown ONNX op {parsed.op_type!r}")
        for name, value in parsed.attributes:
            problem = _attribute_problem(parsed.op_type, name, value)
            if problem:
                raise RuleFileError(
                    file, _line(item), _column(item) + max(text.find(name), 0), f"rule {rule!r}: {problem}"
                )
        problem = _input_count_problem(parsed)
        if problem:
            raise RuleFileError(file, _line(item), _column(item), f"rule {rule!r}: {problem}")
        lines.append(parsed)
    _check_connected(file, rule, lines, node)
    return tuple(lines)


_ATTRIBUTE_VALUES = {
    onnx.defs.OpSchema.AttrType.INT: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    onnx.defs.OpSchema.AttrType.FLOAT: ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    onnx.defs.OpSchema.AttrType.STRING: ("a string", lambda v: isinstance(v, str)),
    onnx.defs.OpSchema.AttrType.INTS: (
        "a list of integers",
        lambda v: isinstance(v, tuple) and all(isinstance(x, int) and not isinstance(x, bool) for x in v),
    ),
    onnx.defs.OpSchema.AttrType.FLOATS: (
        "a list of numbers",
        lambda v: isinstance(v, tuple) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v),
    ),
    onnx.defs.OpSchema.AttrType.STRINGS: (
        "a list of strings",
        lambda v: isinstance(v, tuple) and all(isinstance(x, str) for x in v),
    ),
}


def _accepted_params(apply: str) -> frozenset[str]:
    """The `with:` keys a built-in primitive reads (none where it declares none)."""
    from ..folds import builtin_primitives  # the registry sits below the rules: it imports no rule code
    from ..folds.primitives import accepted_params

    return accepted_params(builtin_primitives()[apply]) or frozenset()


def _op_class_problem(line: PatternNode) -> str | None:
    """Why a line of an op class (`a = Linear(x)`) is malformed: it names its one run-time
    input and nothing else (the class's constants are the primitive's to read)."""
    if line.attributes or len(line.inputs) != 1 or line.inputs[0].variadic or line.inputs[0].constant:
        return f"{line.op_type}(x) takes exactly one run-time input and no attribute conditions"
    return None


def _input_count_problem(line: PatternNode) -> str | None:
    """Why a line can never match for the number of inputs it names: more than the op takes, or
    fewer than it needs (a node always has those; the match compares them one for one)."""
    if line.variadic_input is not None:
        return None
    schema = onnx.defs.get_schema(line.op_type)
    given = len(line.inputs)
    if given > schema.max_input:
        return f"{line.op_type} takes at most {schema.max_input} input(s); the line names {given}"
    if given < schema.min_input:
        return f"{line.op_type} takes at least {schema.min_input} input(s); the line names {given}"
    return None


def _attribute_problem(op: str, name: str, value) -> str | None:
    """Why `op[name=value]` can never match (an attribute the op lacks, a value of the wrong kind)."""
    attributes = onnx.defs.get_schema(op).attributes
    if name not in attributes:
        return f"{op} has no attribute {name!r} (it has {', '.join(sorted(attributes)) or 'none'})"
    kind = attributes[name].type
    if kind not in _ATTRIBUTE_VALUES:
        return f"{op}'s attribute {name!r} holds a {kind.name.lower()}, which a pattern cannot compare"
    words, accepts = _ATTRIBUTE_VALUES[kind]
    return None if accepts(value) else f"{op}'s attribute {name!r} is {words}, not {_brief(value)}"


def _check_acyclic(file: str, rule: str, lines: list[PatternNode], produced: dict[str, PatternNode]) -> None:
    """Producer edges (a line reads a name another line produces) must not loop."""
    state: dict[int, str] = {}  # line index -> "open" while on the path, "done" after

    def visit(index: int) -> None:
        state[index] = "open"
        for ref in lines[index].inputs:
            producer = produced.get(ref.name)
            if producer is None:
                continue
            other = lines.index(producer)
            if state.get(other) == "open":
                raise RuleFileError(
                    file, producer.line, 1, f"rule {rule!r}: the pattern's lines form a cycle through {ref.name!r}"
                )
            if other not in state:
                visit(other)
        state[index] = "done"

    for index in range(len(lines)):
        if index not in state:
            visit(index)


def _check_connected(file: str, rule: str, lines: list[PatternNode], node) -> None:
    """Every line but the root feeds another line; element lines belong to a variadic list."""
    produced: dict[str, PatternNode] = {}
    for line in lines:
        for ref in line.outputs:
            if ref.name in produced:
                raise RuleFileError(file, line.line, 1, f"rule {rule!r}: {ref.name!r} is produced twice")
            produced[ref.name] = line
    _check_acyclic(file, rule, lines, produced)
    used = {ref.name for line in lines for ref in line.inputs}
    variadic = {ref.name for line in lines for ref in line.inputs if ref.variadic}
    if lines[-1].is_element:
        if not all(line.is_element for line in lines):
            raise RuleFileError(
                file,
                lines[-1].line,
                1,
                f"rule {rule!r}: a group pattern (last line name[] = ...) has only element lines",
            )
        shared = [
            ref
            for line in lines
            for ref in line.inputs
            if not ref.per_element and not ref.wildcard and ref.name not in produced
        ]
        if not shared:
            raise RuleFileError(
                file,
                lines[-1].line,
                1,
                f"rule {rule!r}: a group pattern needs a shared input (a plain name) that all its members read",
            )
    for line in lines[:-1]:
        name = line.outputs[0].name
        if name not in used:
            raise RuleFileError(file, line.line, 1, f"rule {rule!r}: {name!r} is not read by any later line")
        element_read = any(ref.name == name and ref.per_element for other in lines for ref in other.inputs)
        if line.is_element and name not in variadic and not element_read and not lines[-1].is_element:
            raise RuleFileError(file, line.line, 1, f"rule {rule!r}: {name}[] has no variadic *{name} input")


def _parse_conditions(
    file: str, rule: str, section: str, node, pattern: tuple[PatternNode, ...]
) -> tuple[tuple[str, object], ...]:
    if not isinstance(node, yaml.MappingNode):
        raise RuleFileError(
            file, _line(node), _column(node), f"rule {rule!r}: '{section}' is a mapping of condition: names"
        )
    names = {ref.name for line in pattern for ref in (*line.inputs, *line.outputs)}
    conditions = []
    for key, (key_node, value_node) in _mapping(node).items():
        if key not in CONDITIONS:
            raise RuleFileError(
                file,
                _line(key_node),
                _column(key_node),
                f"rule {rule!r}: unknown condition {key!r} (known: {', '.join(sorted(CONDITIONS))})",
            )
        value = _value(file, value_node)
        if isinstance(value, dict):
            referenced = (
                [*value, *(v for v in value.values() if isinstance(v, str))] if key == "per_channel" else list(value)
            )
        else:
            referenced = value if isinstance(value, list) else [value]
        for name in referenced:
            if not isinstance(name, str):
                raise RuleFileError(
                    file,
                    _line(value_node),
                    _column(value_node),
                    f"rule {rule!r}: condition {key!r} takes names (a name or a list of names), not {_brief(name)}",
                )
            if name not in names:
                raise RuleFileError(
                    file,
                    _line(value_node),
                    _column(value_node),
                    f"rule {rule!r}: condition {key!r} names {name!r}, which the pattern does not bind",
                )
        conditions.append((key, value))
    return tuple(conditions)


def _value(file: str, node) -> object:
    """The Python value of a composed node, as yaml.safe_load would give it (the node keeps
    its marks for error messages; constructing it directly skips a serialize-and-parse)."""
    try:
        return yaml.constructor.SafeConstructor().construct_document(node)
    except yaml.constructor.ConstructorError as exc:  # a tag safe YAML does not build, say !!python/object
        mark = exc.problem_mark or node.start_mark
        raise RuleFileError(file, mark.line + 1, mark.column + 1, f"not valid YAML: {exc.problem}") from None


def _mapping(node: yaml.MappingNode) -> dict[str, tuple]:
    return {key.value: (key, value) for key, value in node.value}


def _scalar(file: str, node, what: str) -> str:
    if not isinstance(node, yaml.ScalarNode) or not str(node.value).strip():
        raise RuleFileError(file, _line(node), _column(node), f"{what} must be a non-empty string")
    return str(node.value).strip()


def _line(node) -> int:
    return node.start_mark.line + 1


def _column(node) -> int:
    return node.start_mark.column + 1
