"""The rewrite engine: match -> check -> rewrite, repeated to a fixed point.

Order is deterministic: passes over the rules in file order; within a rule, the nodes in
topological order. A pass that applies nothing ends the loop. The engine knows no rule: a
rule's conditions and its primitive decide, and every refusal is kept with its reason (the
report lists those whose nodes are still in the final graph).

The graph is imported once and exported once. Between passes only the shapes of the tensors
the pass created are inferred (local_shapes.py), and a rule looks again only where the graph
changed since it last looked (changes.py): a match none of whose nodes, nor the nodes its
primitive reads around it, changed would come out as it did (docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import gc
import math
from dataclasses import dataclass, field, replace

import onnx

from .. import ir
from ..algebra import Refusal
from ..errors import ConvexportError, first_line
from ..folds.primitives import Primitive, Rewrite, reach_of
from ..ir import heap
from ..report import types as report_types
from .changes import ChangeLog
from .conditions import first_failure
from .decisions import by_estimate, by_measurement
from .local_shapes import infer_new_shapes
from .matcher import Match, PatternMatcher
from .rulefile import Rule
from .runtime_fusions import RuntimeFusions

MAX_PASSES = 32
# 256 MiB of float32 weights: a collection after every fold of a large model costs more than
# freeing sooner saves (bench/RESULTS.md, "Measurements behind the code"); see _Run.release_replaced
COLLECT_AFTER_ELEMENTS = 64 << 20
STRATEGIES = ("all", "cost", "measure")
STRATEGY_ALIASES = {"exact": "all"}  # its old name: every strategy applies only exact rewrites


@dataclass(frozen=True)
class RewriteSettings:
    """What a rewrite aims at: how each rewrite is decided (`strategy`: all, cost or measure),
    the device those decisions are for, the half type the model will be rounded into (--dtype;
    None for float32), for the folds whose exactness rounding can undo (folds/half_rounding.py),
    the rules whose every verdict is kept (--explain), and the kernels ONNX Runtime's transformer
    optimizer makes ((kind, node names)), kept whole as the fusions of runtime_fusions.py are."""

    strategy: str = "cost"
    device: str = "cpu"
    half: str | None = None
    explain: frozenset[str] = frozenset()
    kept_kernels: tuple | list = ()


@dataclass
class RewriteContext:
    """What a primitive may use besides its match."""

    graph: ir.Graph
    opset: int
    fresh: ir.NameGenerator
    params: dict
    strategy: str
    device: str = "cpu"  # the target of --strategy cost and measure
    decided: dict = field(default_factory=dict)  # (rule, nodes) -> Decision, see rewrite_model
    fusions: RuntimeFusions | None = None  # what ONNX Runtime would fuse, kept whole (runtime_fusions.py)
    half: str | None = None  # the half type the model will be rounded into (--dtype), for folds that weigh it


@dataclass
class RewriteOutcome:
    model: onnx.ModelProto
    applied: list[report_types.Rewrite] = field(default_factory=list)
    skipped: list[report_types.Skipped] = field(default_factory=list)
    passes: int = 0
    explained: dict[str, dict[str, str]] = field(default_factory=dict)  # --explain: rule -> node -> why
    folded: int = 0  # nodes of constants computed between passes
    provenance: ir.Provenance = field(default_factory=ir.Provenance)  # where each node comes from
    invalid: str | None = None  # why shape inference refuses the rewritten model (a rewrite broke it)


@dataclass
class _Run:
    """What one rewrite_model run keeps across its passes."""

    primitives: dict[str, Primitive]
    changes: ChangeLog
    applied: list[dict]
    skipped: dict[tuple, dict]
    limit: int | None
    created: list[ir.Node] = field(default_factory=list)  # nodes the current pass inserted
    explain: frozenset[str] = frozenset()  # rules whose every verdict is kept (--explain)
    explained: dict[str, dict[str, str]] = field(default_factory=dict)  # rule -> anchor -> its last verdict
    folded: int = 0  # nodes of constants computed between passes (_fold_constant_nodes)
    provenance: ir.Provenance | None = None  # the main graph's (import_graph): made nodes derive from replaced ones
    weights_made: int = 0  # elements of the constants rewrites made since the collector last ran

    def release_replaced(self, rewrite: Rewrite) -> None:
        """Free the weights of the nodes rewrites replaced once the elements of those made (by
        their shapes: a constant not yet read stays unread) since the last time reach
        COLLECT_AFTER_ELEMENTS: the replaced weights are garbage, but in cycles (a gs
        tensor's reader lists point back to it), which only Python's collector frees, and
        large arrays do not make it run (a 0.25 GiB LoRA/BN MLP held 1.2 GiB of replaced
        weights at the rewrite stage's peak; issue 34)."""
        self.weights_made += sum(
            math.prod(tensor.shape)
            for node in rewrite.nodes
            for tensor in node.inputs
            if isinstance(tensor, ir.Constant)
        )
        if self.weights_made >= COLLECT_AFTER_ELEMENTS:
            heap.release()
            self.weights_made = 0

    def explaining(self, rule: Rule, anchor, verdict: str) -> None:
        if rule.name in self.explain:
            self.explained.setdefault(rule.name, {})[anchor.name or "(a tensor)"] = verdict

    def full(self) -> bool:
        return self.limit is not None and len(self.applied) >= self.limit


def rewrite_model(
    model: onnx.ModelProto,
    rules: list[Rule],
    primitives: dict[str, Primitive],
    settings: RewriteSettings = RewriteSettings(),
    *,
    source: str = "model",
    limit: int | None = None,
    decided: dict | None = None,
) -> RewriteOutcome:
    """Rewrite to a fixed point, as `settings` say; with `limit`, stop after that many rewrites
    (the same first ones as an unlimited run, since the order is deterministic: used to find a
    bad one). `decided` keeps each cost or measure decision by rule and nodes; a later run given
    the same dict replays them (a measurement need not come out the same twice). For the rules
    settings.explain names, the outcome's `explained` says, for each node where matching
    started (the root op's nodes), what happened there last: the pattern line or condition that
    failed, the primitive's or the decision's refusal, or the rewrite. `source` names the model
    in messages."""
    with _collector_paused():
        outcome = _rewrite(model, rules, primitives, settings, source, limit, decided)
    # the graph is garbage now, in cycles that hold every weight a rewrite read (a 1 GiB
    # LoRA/BN MLP: 1 GiB held through validation until the collector happened to run)
    heap.release_after(model)
    return outcome


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off while the graph is rewritten: importing a graph
    allocates a few objects per node and tensor, each allocation counts toward the next
    collection, and a full collection walks every object of the process (torch's included).
    The graph's node <-> tensor cycles wait for the next collection after the rewrite, as they
    would have waited for the next full one anyway; large replaced weights are collected as
    they pile up (_Run.release_replaced)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _rewrite(
    model, rules, primitives, settings: RewriteSettings, source: str, limit: int | None, decided: dict | None
) -> RewriteOutcome:
    strategy = settings.strategy
    if strategy not in STRATEGIES:  # the caller resolves aliases: an unknown one would mean "cost"
        raise ValueError(f"strategy {strategy!r}: expected one of {', '.join(STRATEGIES)}")
    opset = ir.onnx_opset(model) or ir.DEFAULT_OPSET
    decided = {} if decided is None else decided
    graph = ir.import_graph(model)
    fusions = RuntimeFusions(graph, settings.kept_kernels)
    base = RewriteContext(
        graph, opset, ir.NameGenerator(graph), {}, strategy, settings.device, decided, fusions, settings.half
    )
    explain = frozenset(settings.explain)
    state = _Run(primitives, ChangeLog(), [], {}, limit, explain=explain, provenance=graph.provenance)
    passes, changed_at_all = 0, False
    for passes in range(1, MAX_PASSES + 1):  # noqa: B007 (the count of passes made is reported)
        state.created = []
        changed = False
        for scope in ir.all_graphs(graph):  # each scope on its own: see _run_scope
            changed |= _run_scope(scope, rules, replace(base, graph=scope), state)
        if not changed:
            break
        for scope in ir.all_graphs(graph):
            state.folded += _fold_constant_nodes(scope, opset, base.fresh, state.changes, fusions)
        changed_at_all = True
        # a tensor that now has a shape may now match where it did not: a change like any other
        alive = [node for node in state.created if not state.changes.is_dead(node)]
        state.changes.touch(infer_new_shapes(alive, opset))
        for scope in ir.all_graphs(graph):
            ir.toposort(scope)
    # unchanged, the graph is `model` again (nothing to export), and every refusal still stands;
    # the report names nodes as import_graph did (the exported model gives a nameless node its
    # empty name back), so what still stands is found in the graph, not in the exported model
    current, still_there, invalid = model, list(state.skipped.values()), None
    if changed_at_all:
        graph = ir.cleaned_up(graph)
        heap.release_after(model)  # the replaced weights release_replaced has not collected yet, before the copy
        current = ir.export_graph(graph, model)
        if not ir.fully_shaped(current):  # else its value_info already holds all inference would give
            try:
                current = ir.infer_shapes(current, source)
            except ConvexportError as problem:  # the caller finds the rewrite that did it
                invalid = first_line(problem)
        if still_there:
            final_nodes = {node.name for scope in ir.all_graphs(graph) for node in scope.nodes}
            still_there = [entry for entry in still_there if set(entry["nodes"]) <= final_nodes]
    return RewriteOutcome(
        current, state.applied, still_there, passes, state.explained, state.folded, state.provenance, invalid
    )


def _fold_constant_nodes(
    scope: ir.Graph, opset: int, fresh: ir.NameGenerator, changes: ChangeLog, fusions: RuntimeFusions
) -> int:
    """The nodes a pass left reading only constants (a rule replaced their run-time input with
    a constant), computed now as the folding before the rules would have (ir.constant_node_values),
    but for those of a fusion: their outputs become constants, and their readers are looked at
    again. How many."""
    folded, members = 0, set(map(id, scope.nodes))  # (a fold adds no node)
    for node in list(scope.nodes):
        constant_inputs = [t for t in node.inputs if not ir.is_absent(t)]
        if (
            changes.is_dead(node)
            or not constant_inputs
            or not all(isinstance(t, ir.Constant) for t in constant_inputs)
            or any(_is_graph_output(out, scope) for out in node.outputs)
            or fusions.touched([node]) is not None
        ):
            continue
        values = ir.constant_node_values(node, opset)
        if values is None:
            continue
        replacements = [(out, ir.Constant(fresh(out.name), value)) for out, value in zip(node.outputs, values)]
        _apply(scope, Rewrite([], replacements, f"{node.op} of constants folded"), fresh, changes, members)
        folded += 1
    return folded


def _run_scope(graph: ir.Graph, rules: list[Rule], base: RewriteContext, state: _Run) -> bool:
    """One pass of every rule over one scope: the main graph or a subgraph (If branches, Loop
    and Scan bodies). A match never spans two scopes, so nothing moves in or out of a
    subgraph, and a tensor that a subgraph reads from outside counts as read there (not private)."""
    changed = False
    dead = state.changes.is_dead  # nodes a rewrite left without readers, dropped at the end
    members = set(map(id, graph.nodes))  # this scope's nodes, new ones added as they come
    by_op: dict[str, list[ir.Node]] = {}  # this scope's nodes by op, in graph order, new ones last
    for node in graph.nodes:
        by_op.setdefault(node.op, []).append(node)
    for rule in rules:
        if state.full():
            break
        if not rule.may_match(by_op.keys()):
            continue  # an op of its pattern is nowhere in this scope
        primitive = rule.plugin or state.primitives[rule.apply]
        group = rule.is_group
        if group or rule.root.is_class:  # (an op class: its ops' nodes, still in graph order)
            candidates = [node for node in graph.nodes if (group or node.op in rule.root.op_types) and not dead(node)]
        else:
            candidates = [node for node in by_op.get(rule.root.op_type, ()) if not dead(node)]
        region = state.changes.region(graph, rule, candidates, reach_of(primitive))
        state.changes.start_looking(graph, rule)
        if region is not None and not region:
            continue  # nothing it could see changed since it last looked
        matcher = PatternMatcher(rule, base.opset, set(map(id, graph.outputs)), members)
        context = replace(base, params=rule.params)
        for anchor in _anchors(graph, rule, candidates, region):
            if state.full():
                break
            if dead(anchor) if not group else any(dead(node) for node in anchor.inputs):
                continue
            match = matcher.match_group(anchor) if group else matcher.match(anchor)
            if match is None:
                state.explaining(rule, anchor, f"no match: {matcher.why}")
                continue
            silent = first_failure(rule.where, match.values, graph)
            if silent:
                state.explaining(rule, anchor, f"where: {silent}")
                continue
            verdict = _decide(match, primitive, context, members)
            covered = match.node_list() if isinstance(verdict, Refusal) else _covered(match, verdict, graph)
            _record(state, rule, covered, verdict)
            if isinstance(verdict, Refusal):
                kind = "refused" if verdict.reported else "not a case for it (unreported)"
                state.explaining(rule, anchor, f"{kind}: {verdict.reason}")
                continue
            state.explaining(rule, anchor, f"rewritten: {verdict.note}")
            state.provenance.derive(verdict.nodes, covered, rule.name)
            _apply(graph, verdict, base.fresh, state.changes, members)
            state.release_replaced(verdict)
            state.created.extend(verdict.nodes)
            changed = True
            matcher.graph_outputs = set(map(id, graph.outputs))
            members.update(map(id, verdict.nodes))
            for node in verdict.nodes:
                by_op.setdefault(node.op, []).append(node)
    graph.nodes = [node for node in graph.nodes if not dead(node)]
    return changed


def _covered(match: Match, rewrite: Rewrite, graph: ir.Graph) -> list[ir.Node]:
    """The nodes a rewrite replaces: its match's, then those beyond the match that it leaves
    unread (a primitive that follows a region or branches past its pattern), in graph order;
    Constant nodes aside. The report and the provenance of the new nodes name these."""
    matched = match.node_list()
    seen = set(map(id, matched))
    beyond = [node for node in reversed(_doomed(rewrite, graph)) if id(node) not in seen and node.op != "Constant"]
    return matched + beyond


def _record(state: _Run, rule: Rule, nodes: list[ir.Node], verdict: Rewrite | Refusal) -> None:
    """A verdict into the report's lists: applied (with the ops of the matched nodes and of the
    new ones, for the report's picture of the region), or skipped with its reason (a refusal
    that is not to be reported: nowhere)."""
    node_names = [node.name for node in nodes]
    entry = {"rule": rule.name, "file": rule.shown_file, "nodes": node_names}
    modules = state.provenance.modules(node_names) if state.provenance else []
    if modules:
        entry["modules"] = modules
        entry["module"] = state.provenance.enclosing_module(node_names)
    if isinstance(verdict, Refusal):
        if not verdict.reported:
            return
        decision = {"decision": verdict.decision} if verdict.decision else {}
        state.skipped[(rule.name, tuple(node_names))] = {**entry, "reason": verdict.reason, **decision}
    else:
        region = {"ops_before": [node.op for node in nodes], "ops_after": [node.op for node in verdict.nodes]}
        state.applied.append({**entry, "reason": verdict.note, **region, **_cost_fields(verdict), **verdict.extra})


def _anchors(graph: ir.Graph, rule: Rule, candidates: list[ir.Node], region: set[int] | None) -> list:
    """Where matching starts, in topological order: each candidate node (the live nodes of the
    root's op, for a root pattern), or each tensor a candidate (any live node) reads or writes
    (for a group pattern, whose members all read one shared tensor); only within `region`
    (node ids) when it is given."""
    nodes = candidates if region is None else [node for node in candidates if id(node) in region]
    if not rule.is_group:
        return nodes
    seen, tensors = set(), []  # a subgraph's nodes may share a tensor from the outer scope
    inputs = graph.inputs if region is None else []
    for tensor in [*inputs, *(t for node in nodes for t in (*node.inputs, *node.outputs))]:
        if id(tensor) not in seen and tensor.outputs:
            seen.add(id(tensor))
            tensors.append(tensor)
    return tensors


def _decide(match: Match, primitive: Primitive, context: RewriteContext, members: set[int]) -> Rewrite | Refusal:
    """The Rewrite to apply, or the Refusal that says why not; `members`: the ids of the
    scope's nodes."""
    reason = first_failure(match.rule.require, match.values, context.graph)
    if reason:
        return Refusal(reason)
    result = _called(match.rule, lambda: primitive(match, context))
    if isinstance(result, Refusal):
        return result
    if result.complete is not None and context.strategy != "cost":  # only the estimate judges a prospect
        result = _completed(result, match.rule)
    result = _checked(result, context.graph, members)
    if isinstance(result, Refusal):
        return result
    result = _fusions_kept(result, context)
    if isinstance(result, Refusal):
        return result
    return _judged(result, match.rule, match.node_names(), context, members)


def _fusions_kept(result: Rewrite, context: RewriteContext) -> Rewrite | Refusal:
    """The rewrite, or a Refusal where it would take a node out of a subgraph ONNX Runtime
    fuses (runtime_fusions.py); under --strategy all, the rewrite, marked as breaking it."""
    fusion = context.fusions.touched(_doomed(result, context.graph)) if context.fusions else None
    if fusion is None:
        return result
    numbers = {"method": "runtime fusion", "fusion": fusion.kind, "nodes": fusion.names}
    if context.strategy == "all":
        context.fusions.broken(fusion)
        result.extra["breaks_runtime_fusion"] = numbers
        return result
    _discard(result)
    fuses = "ONNX Runtime's transformer optimizer fuses" if fusion.by_optimizer else "ONNX Runtime fuses"
    why = "" if fusion.by_optimizer else " (faster than the fold saves)"
    span = f"{fusion.names[0]}..{fusion.names[-1]}"
    return Refusal(f"it would take {span} out of the {fusion.kind} that {fuses} into one kernel{why}", numbers)


def _doomed(rewrite: Rewrite, graph: ir.Graph) -> list[ir.Node]:
    """The old nodes the rewrite leaves without readers (what _apply will drop): the makers of
    the tensors it replaces, then each node whose outputs only those read, and so on up."""
    outputs = set(map(id, graph.outputs))
    outputs.update(id(new) for _, new in rewrite.replace)  # what takes a replaced tensor's readers stays read
    made = set(map(id, rewrite.nodes))
    replaced = {id(old) for old, _ in rewrite.replace}
    dead: set[int] = set()
    doomed = []
    stack = [old.inputs[0] for old, _ in rewrite.replace if old.inputs]
    while stack:
        node = stack.pop()
        if id(node) in dead or id(node) in made:
            continue
        unread = all(
            id(tensor) in replaced or (id(tensor) not in outputs and all(id(r) in dead for r in tensor.outputs))
            for tensor in node.outputs
        )
        if unread:
            dead.add(id(node))
            doomed.append(node)
            stack.extend(t.inputs[0] for t in node.inputs if isinstance(t, ir.Variable) and t.inputs)
    return doomed


def _judged(
    result: Rewrite, rule: Rule, node_names: list[str], context: RewriteContext, members: set[int]
) -> Rewrite | Refusal:
    """The rewrite with its decision's numbers, or the Refusal that the decision gives (under
    --strategy all, the rewrite as it is)."""
    if context.strategy == "all":
        return result
    key = (rule.name, tuple(node_names))
    judge = by_measurement if context.strategy == "measure" else by_estimate
    outputs = set(map(id, context.graph.outputs))
    decision = context.decided.get(key) or judge(result, context.opset, context.device, outputs)
    if decision.apply and result.complete is not None:  # a prospect that passes: build it, judge that
        result = _checked(_completed(result, rule), context.graph, members)
        if isinstance(result, Refusal):
            return result
        decision = context.decided.get(key) or judge(result, context.opset, context.device, outputs)
    context.decided[key] = decision  # a replay (the bisection) takes it as it is
    if not decision.apply:
        _discard(result)
        return Refusal(decision.reason, decision.numbers)
    result.extra["decision"] = decision.numbers
    return result


def _completed(prospect: Rewrite, rule: Rule) -> Rewrite | Refusal:
    _discard(prospect)
    return _called(rule, prospect.complete)


def _discard(rewrite: Rewrite) -> None:
    """Unhook a rewrite that will not be applied from the graph's tensors: building a node
    adds it to the readers of its inputs, where it would count as a reader of x (`private`
    would fail) and keep x's producer alive."""
    for node in rewrite.nodes:
        _disconnect_inputs(node)


def _called(rule: Rule, call) -> Rewrite | Refusal:
    """A primitive's (or a prospect's completion's) verdict: the Rewrite it returns, or the
    Refusal it raises. Anything else is a bug: a built-in primitive's exception propagates (an
    InternalError at the top: the tests run with it fatal, not hidden as "did not apply"); a
    user's primitive's, or a return value that is no Rewrite, is a ConvexportError naming the rule."""
    try:
        result = call()
    except Refusal as refusal:
        return refusal
    except Exception as exc:
        if rule.plugin is not None:  # the user's code: a clear error naming the rule
            raise ConvexportError(
                f"{rule.file}:{rule.line}: rule {rule.name!r}: primitive {rule.apply} raised "
                f"{type(exc).__name__}: {first_line(exc)}"
            ) from exc
        if not rule.builtin:  # a user's pattern that does not bind what the primitive reads
            raise ConvexportError(
                f"{rule.file}:{rule.line}: rule {rule.name!r}: primitive {rule.apply} raised "
                f"{type(exc).__name__}: {first_line(exc)} (does the pattern bind the names "
                f"{rule.apply} reads? see docs/rules.md)"
            ) from exc
        raise
    if not isinstance(result, Rewrite):
        raise ConvexportError(
            f"{rule.file}:{rule.line}: rule {rule.name!r}: primitive {rule.apply} returned "
            f"{'None' if result is None else 'a ' + type(result).__name__}, not a Rewrite "
            "(a primitive says no by raising Refusal)"
        )
    return result


def _checked(result: Rewrite | Refusal, graph: ir.Graph, members: set[int]) -> Rewrite | Refusal:
    """The rewrite, or a Refusal: the one given, or one for a rewrite that would rename a
    graph output."""
    if isinstance(result, Refusal):
        return result
    for old, new in result.replace:
        if _is_graph_output(old, graph) and not _takes_over(new, graph, members, result):
            _discard(result)
            return Refusal(f"would rename graph output {old.name!r} to {new.name!r}")
    return result


def _cost_fields(rewrite: Rewrite) -> dict:
    if rewrite.flops_before is None or rewrite.flops_after is None:
        return {}
    return {"flops_before": rewrite.flops_before, "flops_after": rewrite.flops_after}


def _apply(graph: ir.Graph, rewrite: Rewrite, fresh: ir.NameGenerator, changes: ChangeLog, members: set[int]) -> None:
    """Insert the new nodes and make each replaced tensor come from its replacement; the nodes
    this leaves dead are disconnected and buried in `changes` (to be dropped from the graph).

    A replacement made by a new node takes over the old tensor object itself (its name, its
    consumers, its place among the graph outputs), and the old producer gets a placeholder in
    its place; one that already exists (an input of the match) is wired into the old tensor's
    consumers instead, which leaves the old tensor unread where it is (never a graph output:
    _checked refuses that). Every tensor whose producer or readers this changes goes into
    `changes`, and so do the outputs of a node rewired to read an existing tensor (a constant
    now, where a pattern may want one: the replaced tensor no longer leads to that node).
    """
    graph.nodes.extend(rewrite.nodes)
    changes.touch(t for node in rewrite.nodes for t in (*node.inputs, *node.outputs))
    orphans = []
    for old, new in rewrite.replace:
        changes.touch((old, new))
        takes_over = _takes_over(new, graph, members, rewrite)
        orphans.extend(old.inputs)
        if takes_over:
            _detach(old, fresh)
            producer = new.inputs[0]
            for consumer in list(new.outputs):
                _rewire(consumer, new, old)
            producer.outputs[_position(producer.outputs, new)] = old
        else:  # a reader that reads a constant now may match where it did not: its outputs are touched
            for consumer in list(old.outputs):
                _rewire(consumer, old, new)
                changes.touch(consumer.outputs)
    _remove_dead(orphans, {id(t) for t in graph.outputs}, changes)


def _remove_dead(candidates: list[ir.Node], outputs: set[int], changes: ChangeLog) -> None:
    """Disconnect every node whose outputs nobody reads, then the producers that this leaves
    unread in turn; the work is proportional to what is removed, not to the graph."""
    stack = list(candidates)
    while stack:
        node = stack.pop()
        if changes.is_dead(node) or any(t.outputs or id(t) in outputs for t in node.outputs):
            continue
        changes.bury(node)
        stack.extend(p for tensor in node.inputs for p in tensor.inputs)
        _disconnect_inputs(node)


def _disconnect_inputs(node: ir.Node) -> None:
    """node.inputs.clear() by identity: gs's own removal finds the node among its inputs'
    readers with a deep __eq__, which can match another node of the same fields."""
    for tensor in node.inputs:
        list.pop(tensor.outputs, _position(tensor.outputs, node))
    list.clear(node.inputs)


def _position(items: list, item) -> int:
    """items.index(item) by identity (gs's own compares nodes and tensors with a deep __eq__)."""
    return next(index for index, each in enumerate(items) if each is item)


def _rewire(consumer: ir.Node, old, new) -> None:
    """Make `consumer` read `new` wherever it read `old` (gs lists take item assignment only)."""
    for index, tensor in enumerate(list(consumer.inputs)):
        if tensor is old:
            consumer.inputs[index] = new


def _takes_over(new, graph: ir.Graph, members: set[int], rewrite: Rewrite) -> bool:
    """The replacement's producer can output the old tensor instead (keeping its name): it is
    a node of this scope (in `members`, the ids of the scope's nodes, or one of the rewrite's:
    a subgraph may not rename a tensor of the graph around it, nor have one as its output) and
    its output is no graph output."""
    if not new.inputs or _is_graph_output(new, graph):
        return False
    producer = new.inputs[0]
    return id(producer) in members or any(producer is node for node in rewrite.nodes)


def _is_graph_output(tensor, graph: ir.Graph) -> bool:
    return any(tensor is out for out in graph.outputs)


def _detach(tensor: ir.Variable, fresh: ir.NameGenerator) -> None:
    """Give the old producer a dead placeholder output in place of `tensor`."""
    for producer in list(tensor.inputs):
        producer.outputs[_position(producer.outputs, tensor)] = ir.Variable(fresh(tensor.name + "_dead"))
