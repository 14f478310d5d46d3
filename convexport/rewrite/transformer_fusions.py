"""What ONNX Runtime's transformer optimizer fuses in a model, measured with the optimizer itself.

A transformer is deployed as exporter -> convexport -> `onnxruntime.transformers.optimizer.
optimize_model` -> serving. The optimizer replaces whole subgraphs with one kernel (Attention,
EmbedLayerNormalization, SkipLayerNormalization, BiasGelu, ...) by matching the exporter's
node patterns, and a rewrite that is exact can still break a match (BERT's `q @ k^T / sqrt(d)`
with the Sqrt folded into a constant: no Attention; bench/RESULTS.md, "Transformers through
ONNX Runtime's transformer optimizer"). Its patterns change with every ONNX Runtime release, so they are
not copied here: the optimizer is run on the model before the rewrite, and the nodes each fused
kernel replaced are kept whole (constant folding and the rules leave them alone, as
rewrite/runtime_fusions.py keeps the level-2 fusions); it is run again on the result, and the
report says what it fuses in each.

The optimizer is run as a user runs it (`optimize_model(model, model_type=...)`, CPU), for the
model types of MODEL_TYPES (measure says which): which one a user picks is not written in the
model. It runs its own graph fusions on the model's skeleton (opt_level 0, the weights left
out: _zeros_for_stripped_weights). A fused kernel's nodes are those its outputs are computed from,
back to its inputs, among the nodes the optimizer removed or left only for their shape
(_live_names); a removed node that only feeds those (BERT's Shape -> Gather -> Sqrt that made
the scale) belongs to the same kernel.

A fold can also make a fusion possible that the model as given misses: a LoRA merged into
BERT's query leaves the plain projection Attention is matched on. The optimizer's attention
patterns are written against the exporters' shape arithmetic (the scale as Sqrt of a dim read
by Shape), which constant folding would turn into constants. So for a model with attention
(a Softmax) whose fusions the optimizer finds, the rewrite runs twice, once with that shape
arithmetic folded and once with it kept (rewrite_keeping_fusions), and the result the
optimizer fuses more of is taken; where both fuse the same, the folded one.

Two runs of the optimizer are the check itself: the original as the first model type, the
result as the type checked. The others (more model types, the rewrite with the shape
arithmetic kept) are tried while the optimizer's time stays within OPTIONAL_RUNS_BUDGET_S:
where image dims are left dynamic (Swin, BEiT) its symbolic shape inference makes one run
cost many times a BERT's; the report says what was not tried.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from .. import ir
from ..ir.large import skeleton
from .engine import RewriteOutcome

# The optimizer's model types for the transformers optimum exports: BERT, DistilBERT, ViT and
# other encoders (bert), GPT-2 (gpt2), T5 (t5), BART and Whisper (bart).
MODEL_TYPES = ("bert", "gpt2", "t5", "bart")
# The external-data location of the weights the skeleton leaves out (no such file is read).
_NO_FILE = "convexport-weights-left-out"
# Where a model holds none of these, it has no attention or normalisation to fuse.
_TRANSFORMER_OPS = {"Softmax", "LayerNormalization", "SimplifiedLayerNormalization", "ReduceMean"}
# The optimizer's seconds, all runs on one model, past which no run beyond the check's two is
# started (module doc; what a run costs on which models: bench/RESULTS.md).
OPTIONAL_RUNS_BUDGET_S = 30.0


@dataclass(frozen=True)
class FusedKernel:
    """One kernel the optimizer made: its op and the names of the nodes it replaced."""

    kind: str
    nodes: frozenset[str]


@dataclass
class TransformerFusions:
    """The optimizer's fused kernels by model type: their counts, and the kernels themselves;
    the model types not run for time (OPTIONAL_RUNS_BUDGET_S)."""

    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # model type -> op -> count
    kernels: list[FusedKernel] = field(default_factory=list)
    not_tried: list[str] = field(default_factory=list)


@dataclass
class OptimizerClock:
    """The optimizer's time on one model: all its runs, and the longest (what one more costs)."""

    spent: float = 0.0
    longest: float = 0.0

    def timed(self, run: Callable, *arguments):
        began = time.perf_counter()
        try:
            return run(*arguments)
        finally:
            took = time.perf_counter() - began
            self.spent += took
            self.longest = max(self.longest, took)

    def affords_another(self) -> bool:
        return self.spent + self.longest <= OPTIONAL_RUNS_BUDGET_S


def applies(model: onnx.ModelProto) -> bool:
    """Whether the model holds what the optimizer fuses (attention, normalisation)."""
    return any(node.op_type in _TRANSFORMER_OPS for node in model.graph.node)


def measure(model: onnx.ModelProto, model_types=None, clock: OptimizerClock | None = None) -> TransformerFusions:
    """The optimizer's fusions in `model` for each model type given, or for MODEL_TYPES in
    turn where it finds any, up to the first that fuses every attention of the model (BERT's
    `bert`: the type such a model is optimized as; each run is a cost, bench/RESULTS.md), none
    after `bert` where it fuses nothing or the model has no attention (FastViT's Gelus: every
    type fuses them alike), none after the first where `clock` affords no other run;
    nothing where the model holds nothing to fuse."""
    if not applies(model):
        return TransformerFusions()
    light, stripped = skeleton(model)  # the weights' values decide no fusion (_zeros_for_stripped_weights)
    for _, tensor in stripped:  # a location onnx's checker takes; no file is read from it
        entry = tensor.external_data.add()
        entry.key, entry.value = "location", _NO_FILE
    found = TransformerFusions()
    clock = clock or OptimizerClock()
    types = list(model_types or MODEL_TYPES)
    for number, model_type in enumerate(types):
        if number and not model_types and not clock.affords_another():
            found.not_tried = types[number:]
            break
        optimized = clock.timed(_optimized, light, model_type)
        if optimized is None:
            continue
        counts = {op: n for op, n in optimized.get_fused_operator_statistics().items() if n}
        if counts or model_types:
            found.counts[model_type] = counts
        if counts:
            found.kernels += _kernels(model.graph, optimized.model.graph, set(counts))
        if not model_types and (not counts or not _softmaxes(model)):
            break  # `bert` (the first) fuses the most kinds; the types differ in their attentions
        if not model_types and _attention_kernels(found) >= _softmaxes(model) > 0:
            break
    return found


def checked_type(found: TransformerFusions) -> str:
    """The model type whose result is checked after the rewrite: the one that fuses most."""
    return max(found.counts, key=lambda model_type: sum(found.counts[model_type].values()))


def _softmaxes(model: onnx.ModelProto) -> int:
    return sum(node.op_type == "Softmax" for node in model.graph.node)


def _optimized(light: onnx.ModelProto, model_type: str):
    """The optimizer's result for one model type on a copy of the weightless model, or None
    where it fails on it. Its own graph fusions only (opt_level 0): the level-1 ONNX Runtime
    session it runs first by default would need the weights, and folds only what ONNX Runtime
    folds when it loads the model anyway."""
    from onnxruntime.transformers.optimizer import optimize_model  # (puts its modules on sys.path)

    copy = onnx.ModelProto()
    copy.CopyFrom(light)
    with _optimizer_silenced(), _zeros_for_stripped_weights():
        try:
            return optimize_model(copy, model_type=model_type, opt_level=0, use_gpu=False)
        except Exception:  # the optimizer's own failure on a graph it was not written for
            return None


@contextlib.contextmanager
def _optimizer_silenced():
    """The optimizer logs a warning for every model type it is not told the head count of, and
    prints "failed in shape inference" where its symbolic shape inference fails (optimum's
    wav2vec2, four times a run: on the terminal of `optimize -q`)."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logging.disable(previous)


@contextlib.contextmanager
def _zeros_for_stripped_weights():
    """The optimizer reads a weight's values only to pack them into its kernel's (Q, K and V
    into one matrix), never to decide whether it fuses; on the skeleton (ir.skeleton: the large
    weights' data left out, which the optimizer would otherwise copy for each of its shape
    inferences: bench/RESULTS.md, "Transformers through ...") such a weight reads as zeros of its
    shape. onnx's own reader is wrapped (the optimizer's modules all read through it), for
    the weights marked _NO_FILE only."""
    from onnx import numpy_helper

    read = numpy_helper.to_array

    def to_array(tensor, base_dir: str = ""):
        if any(entry.key == "location" and entry.value == _NO_FILE for entry in tensor.external_data):
            return np.zeros(tuple(tensor.dims), onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
        return read(tensor, base_dir)

    numpy_helper.to_array = to_array
    try:
        yield
    finally:
        numpy_helper.to_array = read


def _kernels(original: onnx.GraphProto, optimized: onnx.GraphProto, fused_ops: set[str]) -> list[FusedKernel]:
    """Each fused node of `optimized` with the nodes of `original` it replaced (module doc)."""
    kept = _live_names(optimized)
    removed = {node.name: node for node in original.node if node.name and node.name not in kept}
    maker = {output: node for node in removed.values() for output in node.output}
    owner: dict[str, int] = {}
    fused = [node for node in optimized.node if node.op_type in fused_ops]
    for number, node in enumerate(fused):
        inputs, pending = set(node.input), list(node.output)
        while pending:
            source = maker.get(pending.pop())
            if source is None or source.name in owner:
                continue
            owner[source.name] = number
            pending += [name for name in source.input if name not in inputs]
    _attach_feeders(removed, owner)
    members: dict[int, set[str]] = {}
    for name, number in owner.items():
        members.setdefault(number, set()).add(name)
    return [FusedKernel(fused[number].op_type, frozenset(names)) for number, names in sorted(members.items())]


def _live_names(graph: onnx.GraphProto) -> set[str]:
    """The names of the nodes whose values some graph output is computed from (a Shape reads
    no value). The optimizer can leave nodes a fusion matched in the graph where only their
    shape is still read (Phi-3's cos path: its RotaryEmbeddings' caches hold its values, and its
    last dim, read by a Shape, bounds the rotated slice): they are the kernel's as much as those
    it removed, and a rewrite of them (its Mul by 1 dropped) stops the match as surely."""
    maker = {output: node for node in graph.node for output in node.output}
    live: dict[int, onnx.NodeProto] = {}
    pending = [value.name for value in graph.output]
    while pending:
        node = maker.get(pending.pop())
        if node is None or id(node) in live:
            continue
        live[id(node)] = node
        if node.op_type not in ir.SHAPE_ONLY_OPS:
            pending += node.input
        pending += [name for sub in ir.proto_subgraphs(node) for name in ir.proto_outer_reads(sub)]
    return {node.name for node in live.values()}


def _attach_feeders(removed: dict[str, onnx.NodeProto], owner: dict[str, int]) -> None:
    """Give each removed node that no kernel reached the kernel of a removed node it feeds."""
    readers: dict[str, list[str]] = {}
    for node in removed.values():
        for name in node.input:
            readers.setdefault(name, []).append(node.name)
    changed = True
    while changed:
        changed = False
        for node in removed.values():
            if node.name in owner:
                continue
            fed = [owner[r] for output in node.output for r in readers.get(output, ()) if r in owner]
            if fed:
                owner[node.name] = fed[0]
                changed = True


# A kernel that does what another does and more: one of it in place of the other is no loss
# (after a fold, GPT-2's last LayerNormalization reads a residual Add the optimizer then takes in
# as a SkipLayerNormalization).
_LARGER = {
    "LayerNormalization": ("SkipLayerNormalization", "EmbedLayerNormalization"),
    "SimplifiedLayerNormalization": ("SkipSimplifiedLayerNormalization",),
    "Gelu": ("BiasGelu",),
    "FastGelu": ("BiasFastGelu",),
    "MultiHeadAttention": ("Attention",),
}


def lost(before: TransformerFusions, after: TransformerFusions) -> dict[str, dict[str, int]]:
    """{model type: {op: how many fewer}} for each model type measured `after` where the
    optimizer fuses less than `before` (a kernel replaced by a larger one of _LARGER counted
    as kept)."""
    fewer = {}
    for model_type, fused in after.counts.items():
        counts = before.counts.get(model_type, {})
        now, was = Counter(fused), Counter(counts)
        missing = {}
        for op, count in counts.items():
            gained = sum(max(0, now[larger] - was[larger]) for larger in _LARGER.get(op, ()))
            if now[op] + gained < count:
                missing[op] = count - now[op] - gained
        if missing:
            fewer[model_type] = missing
    return fewer


def report_entry(stage: FusionAwareRewrite) -> dict:
    """The report's `transformer_fusions`: per model type, the optimizer's fused kernels on the
    original and on the optimized graph, and those lost; whether the shape arithmetic was kept."""
    import onnxruntime

    before, after = stage.before, stage.after
    entry: dict = {
        "checked_with": f"onnxruntime.transformers.optimizer (ONNX Runtime {onnxruntime.__version__})",
        "shape_arithmetic_kept": stage.shape_arithmetic_kept,
    }
    if before.not_tried or stage.shape_arithmetic_untried:
        entry["not_tried_for_time"] = {
            "model_types": before.not_tried,
            "shape_arithmetic_kept": stage.shape_arithmetic_untried,
            "longest_run_s": round(stage.clock.longest, 1),
            "budget_s": OPTIONAL_RUNS_BUDGET_S,
        }
    entry["model_types"] = {
        model_type: {"original": counts, "optimized": after.counts.get(model_type) if after else None}
        for model_type, counts in before.counts.items()
    }
    entry["lost"] = lost(before, after) if after is not None else {}
    return entry


def shape_arithmetic(model: onnx.ModelProto) -> frozenset[str]:
    """The names of the nodes that compute from tensors' shapes alone: Shape nodes, and each
    node whose run-time inputs all come from such nodes (constants aside)."""
    graph = model.graph
    constant = {init.name for init in graph.initializer}
    constant |= {name for node in graph.node if node.op_type == "Constant" for name in node.output}
    from_shapes: set[str] = set()
    names = set()
    for node in graph.node:  # in graph order: a node's inputs are made before it
        live = [name for name in node.input if name and name not in constant]
        if node.op_type == "Shape" or (live and all(name in from_shapes for name in live)):
            from_shapes.update(node.output)
            names.add(node.name)
    return frozenset(name for name in names if name)


@dataclass
class FusionAwareRewrite:
    """The rewrite stage's result: the folded model the rules ran on, their outcome, the
    kernels kept whole, the decisions they made, and the optimizer's fusions before and after."""

    folded: onnx.ModelProto
    outcome: RewriteOutcome
    kept: list[tuple[str, frozenset[str]]]
    decided: dict
    before: TransformerFusions
    after: TransformerFusions | None
    clock: OptimizerClock
    shape_arithmetic_kept: bool = False
    shape_arithmetic_untried: bool = False  # the attempt with it kept was not run, for time


def rewrite_keeping_fusions(
    model: onnx.ModelProto,
    reference: onnx.ModelProto,
    source: str,
    strategy: str,
    rewrite: Callable,
    unfolded: frozenset[str] = frozenset(),
) -> FusionAwareRewrite:
    """Constant folding and the rules (`rewrite(folded, kept, decided)`, the engine's outcome),
    with the optimizer's kernels kept whole (but under --strategy all) and the nodes of
    `unfolded` (names, or ir.scoped_name) left unfolded, the dims `reference` named carried
    over, and, for a model with attention, the better of two (module doc)."""
    return _every_type_after(_best_attempt(model, reference, source, strategy, rewrite, unfolded))


def _best_attempt(model, reference, source, strategy, rewrite, unfolded) -> FusionAwareRewrite:
    """The rewrite with the kernels kept whole, and for a model with attention the better of it
    and the rewrite with the shape arithmetic also kept (module doc)."""
    clock = OptimizerClock()
    before = measure(model, clock=clock)
    kept = [] if strategy == "all" else _with_constant_feeders(model, before.kernels)
    keep = frozenset(name for _, names in kept for name in names) | unfolded
    chosen = _attempt(model, reference, source, rewrite, before, kept, keep, clock)
    if strategy == "all" or not before.counts or _attention_kernels(chosen.after) >= _softmaxes(model):
        return chosen  # (every attention fused already: keeping shape arithmetic cannot add one)
    with_shapes = keep | shape_arithmetic(model)
    if with_shapes == keep:
        return chosen
    if not clock.affords_another():
        chosen.shape_arithmetic_untried = True
        return chosen
    other = _attempt(model, reference, source, rewrite, before, kept, with_shapes, clock)
    other.shape_arithmetic_kept = True
    return other if _fuses_more(other.after, chosen.after) else chosen


def _with_constant_feeders(model: onnx.ModelProto, kernels: list[FusedKernel]) -> list[tuple[str, frozenset[str]]]:
    """Each kernel as (kind, node names) with the nodes outside it that make an input of it
    from constants alone: constant folding would turn that input into a constant, which
    changes the kernel's pattern (SkipLayerNormalization is an Add of two computed values then
    a LayerNormalization; with edgenext's positional encoding, which depends on no input,
    folded, the optimizer fuses an Add of a constant no more). They are kept with the kernel
    (they stay nodes; what they read may fold)."""
    feeders = _constant_producers(model)
    inputs_of = {node.name: node.input for node in model.graph.node}
    kept = []
    for kernel in kernels:
        read = {name for node in kernel.nodes for name in inputs_of.get(node, ())}
        kept.append((kernel.kind, kernel.nodes | ({feeders[name] for name in read if name in feeders} - kernel.nodes)))
    return kept


def _constant_producers(model: onnx.ModelProto) -> dict[str, str]:
    """{output: its node's name} for the main graph's node outputs that depend on no graph
    input (what constant folding computes), in one pass in graph order; a node with a subgraph
    or a random op counts as depending on its inputs, and a Constant node is left out (a
    constant either way: the optimizer tells it from no initializer)."""
    known = {tensor.name for tensor in model.graph.initializer} - {value.name for value in model.graph.input}
    producers: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type.startswith("Random") or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                                    for a in node.attribute):  # fmt: skip
            continue
        if all(not name or name in known for name in node.input):
            outputs = [name for name in node.output if name]
            known.update(outputs)
            if node.op_type != "Constant":
                producers.update(dict.fromkeys(outputs, node.name))
    return producers


def _every_type_after(stage: FusionAwareRewrite) -> FusionAwareRewrite:
    """The chosen rewrite's fusions measured for each model type the original was measured for
    (its attempts measured one: the type that fuses most), while the clock affords; a type not
    measured stays out of `after` (the report says null for it, not that nothing fuses)."""
    if stage.after is None:
        return stage
    for model_type in stage.before.counts:
        if model_type in stage.after.counts or not stage.clock.affords_another():
            continue
        measured = measure(stage.outcome.model, [model_type], stage.clock)
        stage.after.counts[model_type] = measured.counts.get(model_type, {})
    return stage


_ATTENTION = ("Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention")


def _attention_kernels(found: TransformerFusions | None) -> int:
    """The most attention kernels the optimizer makes for any model type."""
    if found is None:
        return 0
    return max((sum(counts.get(op, 0) for op in _ATTENTION) for counts in found.counts.values()), default=0)


def _attempt(model, reference, source, rewrite, before, kept, keep, clock: OptimizerClock) -> FusionAwareRewrite:
    folded = ir.fold_to_fixed_point(model, source, keep)  # the rules see constants as constants
    decided: dict = {}
    outcome = rewrite(folded, kept, decided)
    outcome.model = ir.carry_dim_names(outcome.model, reference, same_outputs=True)  # its dims, named as it names them
    after = measure(outcome.model, [checked_type(before)], clock) if before.counts else None
    return FusionAwareRewrite(folded, outcome, kept, decided, before, after, clock)


def _fuses_more(one: TransformerFusions | None, other: TransformerFusions | None) -> bool:
    """Whether the optimizer fuses all it fuses in `other` in `one`, and more."""
    if one is None or other is None:
        return False
    gained = any(
        sum(counts.values()) > sum(other.counts.get(model_type, {}).values())
        or set(counts) - set(other.counts.get(model_type, {}))
        for model_type, counts in one.counts.items()
    )
    return gained and not lost(other, one)
