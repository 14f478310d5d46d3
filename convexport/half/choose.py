"""Which nodes run in half precision: chosen by measured error against the exact result, not
by a list of ops.

1. Every node with float data whose op has a half form (slots.py), and for bfloat16 a kernel
   on the device (kernels.py), is a candidate; the others stay float32, with the reason.
2. Each candidate's own error in half is measured with its inputs exact (measure.py); one over
   its bound stays float32: a reduction that loses its small terms, a kernel that accumulates
   in half. One whose exact output is beyond the half type's range (an attention mask's
   finfo(float32).min, a stand-in for an infinity: convert.rounded) stays in half where the
   outputs still meet their bound with it there (a softmax gives 0 for both), float32 where
   not; judged both on the half model's own run and with its output as the half type holds
   it, an infinity (ONNX Runtime's CPU provider computes a float16 node in float32 and keeps
   the value a float16 device loses). Where a node is still over in float32 on its inputs rounded to half (a Softmax of
   large logits: exp's error is the logit's rounding times itself), the producers of those
   inputs stay float32 too.
3. A runtime fusion's nodes (ONNX Runtime's transformer optimizer's Attention, its Gelu, kept
   whole by the rewrite) run in one precision: a Cast inside one would stop the fusion. A node
   that only moves values stays float32 where what it moves is made in float32, and a Cast
   into float where only float32 nodes read it (_movers_follow): each would cost Casts and
   round nothing of its own.
4. The model is converted (convert.py) and its outputs judged against the exact result
   (outputs.py): where a weight has rows and there is a float64 reference, once with its
   weights rounded each way (rounding.py: keeping their rows' sums, to nearest, and by their
   inputs' second moments where any has them, input_moments.py), the rounding whose outputs are
   nearer (within the bound, then by rms error; the moments' by MOMENTS_MARGIN) kept for what
   follows. Then the model's own float32 islands (islands.py: what its code casts into float32,
   a Llama RMSNorm with the residual stream it reads, a rotary embedding's angles), exempt from
   step 3 (islands.py takes none that would put a Cast inside a fused kernel), are kept where
   its outputs come ISLAND_GAIN nearer (rms), and not out of the bound where they met it: before
   any region is grown, since what the model computes in float32 is often why half misses the
   bound (ONNX Runtime's fused norm reads an epsilon stored in half as 1e-5), and a region grown
   first took what the islands hold with the projections around them (a 594 MiB Llama: its
   queries' projections and rotations, bench/RESULTS.md). Where they miss the bound, by
   errors that each node kept within its own but that grow through the graph (an
   ill-conditioned head: a difference of large terms), a float32 region grows back from the
   outputs that missed it: their half-precision ancestors, nearest first (by their own error
   among equals), as few as make the outputs meet the bound, found by bisection, within
   REGION_FLOPS_SHARE of the model's FLOPs. Where none within it does, but
   keeping every ancestor float32 would (a float32 interface: the outputs are then the float32
   model's), the error is spread through the model (a deep chain of convolutions, each layer's
   rounding amplified by the next) and no cheap region removes it: the outputs are then judged
   against the model with every value rounded to half (rounded_run.py) as well, whose error is
   what half precision costs the model by itself, and a region grows, by the same bisection
   without the share, only where they miss that bound too. Where that run puts an output
   further than rounded_run.LOST_SHARE of its largest value, half precision loses it, and the
   region grows as far as the float32 original's bound asks. (Before, such a model was kept
   float32 whole: MobileOne-S0 with random weights, its 43 layers each 0.2-0.3 of their own
   bound.)
5. Where float32 is cheap and measurably closer, it is taken: a float32 tail at the outputs
   (tails.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Literal, cast

import numpy as np
import onnx
from onnx import TensorProto

from .. import ir
from ..ir import heap, proto_subgraphs
from ..ir.slots import HALF_TYPES, DataSlots, NoHalfForm, data_slots, element_types
from ..ir.stats import flops_by_node
from ..report.types import Precision, WeightsRounded
from ..validate.rounded_run import lost_outputs, rounded_runs
from .cast_chains import MOVES_VALUES
from .convert import PrecisionPlan, with_precision
from .input_moments import input_moments
from .islands import float32_islands
from .kept import KeptFloat32
from .kernels import lacking_kernels
from .measure import NodeError, node_errors
from .on_disk import handed_over, on_disk
from .outputs import HalfRuns, OutputJudgement, judge_outputs, judged_outputs, over_bound
from .rounding import ROUNDING_WAYS, WeightRounding, weight_shapes
from .tails import Attempt, closer_tail

FLOAT = TensorProto.FLOAT
# step 4: the rounding by input moments is kept only where its outputs are this much nearer
# (rms) than the other two's: its H is measured on the first input set, which is judged too,
# and with few output elements (a pooled classifier's) the rms on three sets is noisy; within
# the margin the rows' sums, which need no estimate, stay
MOMENTS_MARGIN = 1 / 0.9
# step 4: the FLOPs a float32 region grown to meet the bound may cost. A half model exists to
# run faster; a region over a tenth of its FLOPs forfeits much of that for an error the model
# has in half anyway (every real network measured needed 0-1% or 74-100%: bench/RESULTS.md)
REGION_FLOPS_SHARE = 0.1
# step 4: the model's float32 islands are kept where the outputs' worst rms error is this share
# of it with them in half, or less
ISLAND_GAIN = 0.95


@dataclass
class HalfPrecision:
    """The model in half precision and what was chosen (module doc)."""

    model: onnx.ModelProto
    dtype: str
    io_dtype: str
    nodes_half: int
    casts: int
    kept: list[KeptFloat32]
    outputs: dict[str, OutputJudgement]
    against: Literal["float64", "float32"]  # float32 where no float64 reference was computed
    attempts: int = 1  # conversions judged, the bisection's included
    measured: int = 0  # nodes whose own error was measured
    weights_rounded: dict[str, int] = field(default_factory=dict)  # by way: convert.Converted
    # what the bound counts as the model's own error (module doc, step 4): the float32
    # original's ("float32"), or also the model's with every value rounded to half ("rounded")
    bound_by: Literal["float32", "rounded"] = "float32"
    # the folder of a large model's weights (on_disk.py): the caller's to close once it is written
    files: contextlib.ExitStack | None = None
    rounding: WeightRounding | None = None  # how the weights were rounded (its way of each)

    @property
    def passed(self) -> bool:
        return all(judged.beyond == 0 for judged in self.outputs.values())

    def failure(self) -> str:
        """Why the outputs fail, where they do: the worst output against its bound."""
        name, worst = max(self.outputs.items(), key=_missing_most)
        hint = "; with a float32 interface (--io-dtype fp32) it may" if self.io_dtype != "float32" else ""
        return (
            f"the {self.dtype} model misses the bound against the {self.against} result with every node it "
            f"depends on float32: {worst.missed(name)}{hint}"
        )

    def to_report(self) -> Precision:
        return {
            "dtype": self.dtype,
            "io_dtype": self.io_dtype,
            "nodes_half": self.nodes_half,
            "nodes_float32": len(self.kept),
            "casts": self.casts,
            "kept_float32": [kept.to_report() for kept in self.kept],
            "nodes_measured": self.measured,
            "attempts": self.attempts,
            "weights_rounded": cast(WeightsRounded, {way: self.weights_rounded.get(way, 0) for way in ROUNDING_WAYS}),
            "validation": {
                "passed": self.passed,
                "against": self.against,
                "bound_by": self.bound_by,
                "outputs": {name: judged.to_report() for name, judged in self.outputs.items()},
            },
        }


@dataclass(frozen=True)
class HalfTarget:
    """What a model is converted for: the half type it computes in (float16, bfloat16), its
    interface's type (the half type, or float32), the device it runs on, and the kernels ONNX
    Runtime fuses there ((kind, node names)), each kept in one precision."""

    dtype: str
    io_dtype: str
    device: str
    fused: list[tuple[str, frozenset[str]]] = field(default_factory=list)


def to_half_precision(
    model: onnx.ModelProto,
    target: HalfTarget,
    runs: HalfRuns,
    values: dict[str, np.ndarray],
    given: dict[str, tuple[onnx.TensorProto, str]] | None = None,
) -> HalfPrecision:
    """`model` (float32) with every node it can run in the target's type within the bound
    (module doc): judged on `runs`, each node measured on `values` (the exact value of every
    tensor on the first input set), the nodes of each fused kernel in one precision, the
    weights of `given` rounded as given (WeightRounding.given)."""
    dtype, io_dtype, device = target.dtype, target.io_dtype, target.device
    if not _float_interface(model):  # nothing of an int64 or bool interface takes the half type
        io_dtype = "float32"
    io_type = HALF_TYPES[dtype] if io_dtype == dtype else FLOAT
    choice = _Choice(model, HALF_TYPES[dtype], io_type, runs, device, given)
    kept = choice.kept_by_own_error(values, target.fused)
    converted, judged = choice.nearer_rounding(choice.attempt(kept), kept, values)
    if choice.out_of_range and (over_bound(judged) or over_bound(choice.judged_out_of_range_in_half())):
        del converted  # an attempt that misses the bound goes before the next (a large one's files: on_disk.py)
        nodes = choice.model.graph.node
        kept = choice.with_regions({**kept, **{i: _kept_for_range(nodes[i]) for i in choice.out_of_range}})
        converted, judged = choice.attempt(kept)
    islands = choice.with_islands(kept, judged)
    if islands is not None:
        del converted
        kept, (converted, judged) = islands
    if over_bound(judged):
        del converted
        kept, (converted, judged) = choice.grown_to_bound(kept, judged)
    tail = closer_tail(choice, kept, judged, converted.casts)
    if tail is not None:
        kept, (converted, judged) = tail
    listed = [kept[i] for i in sorted(kept)]
    return HalfPrecision(
        converted.model, dtype, io_dtype, converted.half_nodes, converted.casts, listed, judged, runs.against,
        choice.attempts, len(choice.local), converted.weights_rounded, bound_by=choice.bound_by,
        files=handed_over(converted), rounding=choice.rounding,
    )  # fmt: skip


def _float_interface(model: onnx.ModelProto) -> bool:
    """Whether any input or output of the model is a floating-point tensor (what --io-dtype
    changes; a float16 model's float32 twin keeps its float16 interface)."""
    floats = (FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)
    return any(value.type.tensor_type.elem_type in floats for value in (*model.graph.input, *model.graph.output))


class _Choice:
    """The steps of the module doc on one model; `attempts` counts the conversions judged."""

    def __init__(
        self, model: onnx.ModelProto, half: int, io_type: int, runs: HalfRuns, device: str, given: dict | None = None
    ):
        self.model, self.half, self.io_type, self.runs, self.device = model, half, io_type, runs, device
        inferred = ir.infer_shapes(model, "the model")
        self.types = element_types(model, inferred)
        self.flops = flops_by_node(inferred)
        self.candidates, self.refused = _candidates(model, self.types, half)
        for index, reason in lacking_kernels(model, self.candidates, self.types, half, device).items():
            del self.candidates[index]
            self.refused[index] = KeptFloat32.of(model.graph.node[index], reason)
        self.producer = _producers(model)
        self.rounding = WeightRounding(model.graph, half, given=given)  # each weight's rounding chosen once
        self.local: dict[int, NodeError] = {}
        self.regions: list[tuple[str, set[int]]] = []
        self.out_of_range: set[int] = set()  # step 2's nodes whose exact output half cannot hold
        self.islands: set[int] = set()  # step 4's float32 islands' nodes and their Casts in, once kept
        self.attempts = 0
        self.bound_by: Literal["float32", "rounded"] = (
            "float32"  # HalfPrecision.bound_by: "rounded" once step 4 judges by the rounded run
        )

    def attempt(self, keep: dict[int, KeptFloat32]) -> Attempt:
        plan = PrecisionPlan(self.half, self.io_type, {i: s for i, s in self.candidates.items() if i not in keep})
        converted = with_precision(self.model, plan, self.types, self.rounding)
        converted = on_disk(converted)  # the one in memory goes here, a large model's weights with it
        if converted.files is not None:
            heap.release()
        self.attempts += 1
        dtype = onnx.helper.tensor_dtype_to_np_dtype(self.half).name
        return converted, judge_outputs(converted.model, self.runs, dtype, self.device)

    def nearer_rounding(self, first: Attempt, kept: dict[int, KeptFloat32], values: dict[str, np.ndarray]) -> Attempt:
        """Step 4's first conversion, its weights rounded keeping their rows' sums (`first`),
        again rounded to nearest, and again rounded by their inputs' second moments on
        `values` (where any weight has them: input_moments.py): the attempt whose outputs are
        nearer (_rounding_key; the moments' by MOMENTS_MARGIN), its rounding kept for every later
        attempt. Only where there is a float64 reference to be nearer to and a weight with rows."""
        if self.runs.against != "float64" or not self.rounding.rows:
            return first
        best, best_rounding = first, self.rounding
        del first  # a large model's attempt holds its weights (on_disk.py): one at a time beside the best
        moments = input_moments(self.model.graph, self.rounding.rows, weight_shapes(self.model.graph), values)
        others = [(self.rounding.to_nearest(), 1.0)]
        if moments:
            others.append((self.rounding.by_input_moments(moments), MOMENTS_MARGIN))
        for rounding, margin in others:
            self.rounding = rounding
            other = self.attempt(kept)
            if _rounding_key(other[1], margin) < _rounding_key(best[1]):
                del best
                best, best_rounding = other, rounding
            else:
                del other
        self.rounding = best_rounding
        return best

    def kept_by_own_error(self, values: dict[str, np.ndarray], fused) -> dict[int, KeptFloat32]:
        """Steps 1-3: the nodes that stay float32 before the outputs are judged."""
        nodes = self.model.graph.node
        self.local = node_errors(self.model, self.candidates, values, self.rounding, self.device)
        kept = dict(self.refused)
        for index in self.candidates:
            error = self.local.get(index)
            if error is None and not self.candidates[index].outputs:
                continue  # no float output to round (Shape, a comparison): the outputs judge it
            if error is None:
                kept[index] = KeptFloat32.of(nodes[index], "its inputs have no exact value")
            elif error.out_of_range:
                self.out_of_range.add(index)
            elif error.ratio > 1:
                kept[index] = _kept_for_error(nodes[index], error)
                if error.from_inputs:
                    self._keep_producers(index, kept)
        self.regions = _regions(self.model, fused)
        return self.with_regions(kept)

    def _keep_producers(self, index: int, kept: dict[int, KeptFloat32]) -> None:
        """The producers of a node's data inputs float32, where rounding those inputs to half is
        what puts the node over its bound (a Softmax reading the logits a Conv makes)."""
        nodes = self.model.graph.node
        reader = nodes[index]
        for position in self.candidates[index].inputs:
            made_by = self.producer.get(reader.input[position])
            if made_by in self.candidates and made_by not in kept:
                reason = (
                    f"its output rounded to half puts {reader.name or reader.output[0]} ({reader.op_type}) over "
                    "its bound even computed in float32"
                )
                kept[made_by] = KeptFloat32.of(nodes[made_by], reason)

    def with_regions(self, kept: dict[int, KeptFloat32]) -> dict[int, KeptFloat32]:
        """`kept` with the fused kernels whole and the value-moving nodes following, until
        neither adds a node (a Transpose kept by _movers_follow inside an Attention takes its
        kernel with it, and a kernel kept float32 may leave a Transpose after it to follow)."""
        while True:
            count = len(kept)
            _keep_regions(self.model, self.regions, self.candidates, kept, self.islands)
            _movers_follow(self.model, self.candidates, self.producer, self.io_type != self.half, kept)
            if len(kept) == count:
                return kept

    def with_islands(self, kept: dict[int, KeptFloat32], judged) -> tuple[dict[int, KeptFloat32], Attempt] | None:
        """Step 4's islands (module doc): `kept` with the model's own float32 islands, and its
        attempt, where that brings the outputs ISLAND_GAIN nearer, within the bound where
        `judged` (their attempt in half) was; else None."""
        nodes = self.model.graph.node
        islands = float32_islands(self.model, self.candidates, self.types, self.flops, [m for _, m in self.regions])
        members = {index for island in islands for index in island.nodes if index not in kept}
        if not members:
            return None
        self.islands = members | {index for island in islands for index in island.entries}
        # their Casts in float32 too: each then casts into float32 once, where its other
        # readers read what it casts (convert._no_op_casts)
        members |= {index for island in islands for index in island.entries if index in self.candidates} - kept.keys()
        trial = self.with_regions({**kept, **{index: KeptFloat32.of(nodes[index], "") for index in members}})
        result = self.attempt(trial)
        gain = _rounding_key(result[1])[1] / max(_rounding_key(judged)[1], 1e-300)
        if (over_bound(result[1]) and not over_bound(judged)) or gain > ISLAND_GAIN:
            self.islands = set()
            return None
        reason = (
            f"the model computes it in float32 (its own Casts into float32 before it); in half the "
            f"outputs are {1 / gain:.2g}x as far from the exact result (rms)"
        )
        for index in members:  # (their reason known once the attempt is judged)
            trial[index] = KeptFloat32.of(nodes[index], reason)
        return trial, result

    def half_nodes(self, kept) -> set[int]:
        return {index for index in self.candidates if index not in kept and index in self.local}

    def grown_to_bound(self, kept: dict[int, KeptFloat32], judged) -> tuple[dict[int, KeptFloat32], Attempt]:
        """Step 4 (module doc): the fewest ancestors of the outputs over the bound kept float32,
        within REGION_FLOPS_SHARE of the FLOPs; past it, the outputs judged by the model with
        every value rounded to half as well, and a region grown without the share where they
        still miss. Without a float64 reference there is no rounded run to judge by, and the
        region grows as far as the bound asks."""
        ranked = self._ranked(kept, judged)
        within = _within_share(ranked, self.flops, REGION_FLOPS_SHARE * sum(self.flops))
        if within == len(ranked) or self.runs.against != "float64":
            return self._bisected_all(kept, ranked, judged)
        grown = self._bisected(kept, ranked, judged, within)
        if grown is not None:
            return grown
        if self.io_type != FLOAT:  # a half interface: the float32 model's outputs are not within reach
            everything = self._keeping(kept, ranked, len(ranked), judged)
            result = self.attempt(everything)
            if over_bound(result[1]):
                return everything, result
        rounded_outputs = self._rounded_runs()
        rounded = replace(self.runs, rounded=rounded_outputs)
        wanted = [exact or float32 for exact, float32 in zip(self.runs.exact, self.runs.float32)]
        if lost_outputs(rounded_outputs, wanted, [name for name, judgement in judged.items() if judgement.beyond]):
            return self._bisected_all(kept, ranked, judged)
        self.bound_by, self.runs = "rounded", rounded
        result = self.attempt(kept)
        if not over_bound(result[1]):
            return kept, result
        ranked = self._ranked(kept, result[1])
        return self._bisected_all(kept, ranked, result[1])

    def _ranked(self, kept: dict[int, KeptFloat32], judged) -> list[int]:
        missed = [name for name, judgement in judged.items() if judgement.beyond]
        return _nearest_first(self.model, self.producer, missed, self.half_nodes(kept), self.local)

    def _keeping(self, kept, ranked: list[int], count: int, failing) -> dict[int, KeptFloat32]:
        trial = dict(kept)
        _keep_worst(trial, ranked[:count], self.model.graph.node, self.local, failing)
        return self.with_regions(trial)

    def _bisected_all(self, kept, ranked: list[int], failing) -> tuple[dict[int, KeptFloat32], Attempt]:
        """_bisected among all of `ranked`: with every one of them float32 the outputs are the
        float32 model's, so some number of them meets the bound."""
        found = self._bisected(kept, ranked, failing, len(ranked))
        assert found is not None, "_bisected returns None only below len(ranked)"
        return found

    def _bisected(self, kept, ranked: list[int], failing, high: int) -> tuple[dict[int, KeptFloat32], Attempt] | None:
        """The fewest of `ranked`, nearest first, kept float32 that make the outputs meet the
        bound, among the first `high`; None where keeping those `high` misses it too (with all
        of them float32 the outputs are the float32 model's: not checked before the end)."""
        low, passing = 0, None
        if high < len(ranked):
            if high == 0:
                return None  # `failing` is the model without a region
            passing = self.attempt(self._keeping(kept, ranked, high, failing))
            if over_bound(passing[1]):
                return None
        # keeping `low` of the ranked nodes float32 misses the bound; keeping `high` meets it
        while high - low > 1:
            middle = (low + high) // 2
            result = self.attempt(self._keeping(kept, ranked, middle, failing))
            if over_bound(result[1]):
                low, failing = middle, result[1]
            else:
                high, passing = middle, result
        if passing is None:
            passing = self.attempt(self._keeping(kept, ranked, high, failing))
        return self._keeping(kept, ranked, high, failing), passing

    def judged_out_of_range_in_half(self) -> dict[str, OutputJudgement]:
        """The outputs judged with the out-of-range nodes' outputs as the half type holds them
        (an infinity beyond its range; the rest in float32): ONNX Runtime's CPU provider computes
        a float16 MatMul in float32 between Casts and takes the Cast pair out, so the half
        model's own run there keeps a 120000 that a float16 device makes infinite."""
        nodes = self.model.graph.node
        names = {name for index in self.out_of_range for name in nodes[index].output}
        outputs = rounded_runs(self.model, self.types, self.half, self.runs.feeds, only=names)
        return judged_outputs(outputs, self.runs, onnx.helper.tensor_dtype_to_np_dtype(self.half).name)

    def _rounded_runs(self) -> list[dict[str, np.ndarray]]:
        """The model's outputs with every value rounded to half (rounded_run.py) on each input set."""
        return rounded_runs(self.model, self.types, self.half, self.runs.feeds)


def _candidates(model, types, half) -> tuple[dict[int, DataSlots], dict[int, KeptFloat32]]:
    """The nodes that may run in half (with their data operands), and those with float data
    that may not (with why)."""
    opset = ir.onnx_opset(model) or 1
    read_inside = _read_in_subgraphs(model.graph)
    candidates, kept = {}, {}
    for index, node in enumerate(model.graph.node):
        if node.op_type == "Constant":
            continue  # a stored constant: in the type of its readers (convert.py)
        if not any(types.get(name) == FLOAT for name in (*node.input, *node.output)):
            continue
        try:
            slots = data_slots(node, opset, types, half)
        except NoHalfForm as why:
            if any(types.get(name) == FLOAT for name in node.output):
                kept[index] = KeptFloat32.of(node, str(why))
            continue
        if read_inside & set(node.output):
            kept[index] = KeptFloat32.of(node, "its output is read inside a subgraph")
            continue
        candidates[index] = slots
    return candidates, kept


def _read_in_subgraphs(graph: onnx.GraphProto) -> set[str]:
    """Names the subgraphs of the graph's nodes read (outer-scope values among them)."""
    read = set()
    for node in graph.node:
        for subgraph in proto_subgraphs(node):
            for inner in subgraph.node:
                read.update(inner.input)
            read |= _read_in_subgraphs(subgraph)
    return read


def _within_share(ranked: list[int], flops: list[float], allowed: float) -> int:
    """How many of `ranked`, from the first, cost `allowed` FLOPs or less together."""
    spent = 0.0
    for count, index in enumerate(ranked):
        spent += flops[index]
        if spent > allowed:
            return count
    return len(ranked)


def _nearest_first(model, producer, outputs: list[str], half: set[int], local: dict[int, NodeError]) -> list[int]:
    """The nodes of `half` that `outputs` depend on, nearest first (the fewest nodes between),
    then by their own error (worst first)."""
    distance = _distances(model, producer, outputs)
    near = [index for index in distance if index in half]
    return sorted(near, key=lambda index: (distance[index], -local[index].ratio))


def _producers(model: onnx.ModelProto) -> dict[str, int]:
    """Each tensor a node makes -> that node's position."""
    return {name: index for index, node in enumerate(model.graph.node) for name in node.output}


def _distances(model, producer: dict[str, int], outputs: list[str]) -> dict[int, int]:
    """Each node that `outputs` depend on: how many nodes from one of them (its producer: 0)."""
    distance, frontier, step = {}, [producer[name] for name in outputs if name in producer], 0
    while frontier:
        following = []
        for index in frontier:
            if index not in distance:
                distance[index] = step
                following += [producer[name] for name in model.graph.node[index].input if name in producer]
        frontier, step = following, step + 1
    return distance


def _rounding_key(judged: dict[str, OutputJudgement], margin: float = 1.0) -> tuple[bool, float]:
    """How step 4 ranks a rounding of the weights: within the bound first, then by the worst
    output's rms error over its rms. Rounding moves every weight, and the rms over every
    element of the input sets measures that steadily (on fresh input sets it came out within
    1.5% of the made-up sets' on the median network of the bench's families, 14% at most, and
    ranked the two roundings as they did on every one); the largest error is one element's draw
    (its choice was the further by rms on fresh sets on about one network in four:
    bench/RESULTS.md)."""
    return over_bound(judged), margin * max((judgement.rms_ratio for judgement in judged.values()), default=0.0)


def _kept_for_error(node: onnx.NodeProto, error: NodeError) -> KeptFloat32:
    reason = (
        f"in half precision its output is {error.error:.3g} off the exact result, over the bound "
        f"{error.bound:.3g} (float32: {error.error_float32:.3g})"
    )
    return KeptFloat32.of(node, reason, error.error, error.bound)


def _kept_for_range(node: onnx.NodeProto) -> KeptFloat32:
    reason = "its exact output is beyond the half type's range, and with it in half the outputs miss the bound"
    return KeptFloat32.of(node, reason)


def _missing_most(item) -> tuple:
    """The output that misses its bound most: one with elements beyond it before one without,
    then by its error over its bound."""
    judged = item[1]
    return judged.beyond > 0, judged.error / max(judged.bound, 1e-300)


def _keep_worst(kept: dict, indices: list[int], nodes, local: dict[int, NodeError], failing) -> None:
    """The nodes kept float32 so that the outputs meet the bound, with the output that missed it."""
    name, worst = max(failing.items(), key=_missing_most)
    for index in indices:
        error = local[index]
        reason = (
            f"kept so that the outputs meet the bound (with it in half, {worst.missed(name)}); its own error in "
            f"half is {error.ratio:.2g} of its bound"
        )
        kept[index] = KeptFloat32.of(nodes[index], reason, error.error, error.bound)


def _movers_follow(model, candidates, producer, float32_inputs: bool, kept: dict[int, KeptFloat32]) -> None:
    """A node that only moves values (cast_chains.MOVES_VALUES) float32 where what it moves is
    made in float32: in half it would round nothing of its own and cost a Cast on each side (a
    Transpose between two nodes the device has no bfloat16 kernel for); in node order, so a
    chain of them follows its first. And a Cast into float (an attention mask's) float32 where
    only float32 nodes read it: in half it would round the values its readers take back."""
    nodes = model.graph.node
    graph_inputs = {value.name for value in model.graph.input}
    for index, node in enumerate(nodes):
        if node.op_type not in MOVES_VALUES or index not in candidates or index in kept:
            continue
        if 0 not in candidates[index].inputs:
            continue
        made = producer.get(node.input[0])
        if made is None:
            from_float32 = node.input[0] in graph_inputs and float32_inputs
        else:
            from_float32 = made in kept or (made not in candidates and nodes[made].op_type != "Constant")
        if from_float32:
            source = "the float32 interface" if made is None else nodes[made].name or nodes[made].op_type
            kept[index] = KeptFloat32.of(node, f"it only moves values, which {source} makes in float32")
    readers: dict[str, list[int]] = {}
    for index, node in enumerate(nodes):
        for name in node.input:
            readers.setdefault(name, []).append(index)
    outputs = {value.name for value in model.graph.output}
    for index in reversed(range(len(nodes))):  # a Cast read by a Cast follows the last
        node = nodes[index]
        if node.op_type != "Cast" or index not in candidates or index in kept or node.output[0] in outputs:
            continue
        if not candidates[index].outputs:  # a Cast out of float (to float64, to int) rounds nothing
            continue
        read_by = readers.get(node.output[0], [])
        if read_by and all(reader in kept or reader not in candidates for reader in read_by):
            kept[index] = KeptFloat32.of(node, "every node reading what it makes computes in float32")


def _regions(model: onnx.ModelProto, fused: list[tuple[str, frozenset[str]]]) -> list[tuple[str, set[int]]]:
    positions = {node.name: index for index, node in enumerate(model.graph.node) if node.name}
    return [(kind, {positions[name] for name in names if name in positions}) for kind, names in fused]


def _keep_regions(model, regions, candidates, kept: dict[int, KeptFloat32], exempt: set[int]) -> None:
    """A fused kernel's nodes float32 together where one of them is (module doc, step 3), but
    for the nodes of the model's own float32 islands (`exempt`, step 4)."""
    nodes = model.graph.node
    for kind, members in regions:
        first = next((index for index in sorted(members) if index in kept and index not in exempt), None)
        if first is None:
            continue
        for index in members:
            # a node with no float output (Shape) follows its inputs' type (convert.py)
            if index in candidates and index not in kept and candidates[index].outputs:
                reason = f"in one precision with {nodes[first].name or nodes[first].op_type}, its {kind} kernel"
                kept[index] = KeptFloat32.of(nodes[index], reason)
