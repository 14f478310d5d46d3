"""Whether an exact candidate rewrite is worth applying: `--strategy cost` estimates both sides
on the target device (cost.py), `--strategy measure` times them there (measure.py); `all`
applies every exact rewrite. Each decision keeps its numbers for the report."""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from ..folds.primitives import Rewrite
from .cost import DEVICES, Estimate, estimate
from .measure import Unmeasurable, measure


@dataclass(frozen=True)
class Decision:
    apply: bool
    numbers: dict  # for the report: how it was decided and with what
    reason: str = ""  # why not, when it is not applied


def replaced_nodes(rewrite: Rewrite, graph_outputs: set[int]) -> list[ir.Node]:
    """The old nodes the rewrite leaves without readers: the producers of the tensors it
    replaces, and theirs in turn, while all they feed is replaced or going too (a batching
    primitive replaces more than its match: the branches it followed)."""
    replaced = {id(old) for old, _ in rewrite.replace}
    doomed: dict[int, ir.Node] = {}
    stack = [old.inputs[0] for old, _ in rewrite.replace if old.inputs]
    while stack:
        node = stack.pop()
        if id(node) in doomed:
            continue
        if all(
            id(out) in replaced or (id(out) not in graph_outputs and all(id(c) in doomed for c in out.outputs))
            for out in node.outputs
        ):
            doomed[id(node)] = node
            stack.extend(t.inputs[0] for t in node.inputs if isinstance(t, ir.Variable) and t.inputs)
    return list(doomed.values())


def by_estimate(rewrite: Rewrite, opset: int, device: str, graph_outputs: set[int]) -> Decision:
    if not rewrite.nodes:  # only removes nodes: nothing to weigh
        return Decision(True, {"method": "estimate", "device": device, "after_us": 0.0, "note": "no nodes left"})
    target = DEVICES[device]
    before = estimate(replaced_nodes(rewrite, graph_outputs), target, rewrite.flops_before)
    after = estimate(rewrite.nodes, target, rewrite.flops_after, {id(new): old for old, new in rewrite.replace})
    return estimated_decision(before, after, device)


def estimated_decision(before: Estimate, after: Estimate, device: str) -> Decision:
    """Apply when the estimate after is no larger than before; the numbers for the report."""
    numbers = {
        "method": "estimate",
        "device": device,
        "before_us": before.seconds * 1e6,
        "after_us": after.seconds * 1e6,
        "flops_before": before.flops,
        "flops_after": after.flops,
        "bytes_before": before.bytes,
        "bytes_after": after.bytes,
        "nodes_before": before.nodes,
        "nodes_after": after.nodes,
    }
    apply = after.seconds <= before.seconds
    reason = (
        ""
        if apply
        else (
            f"estimated {after.seconds * 1e6:.3g} us on {device} instead of {before.seconds * 1e6:.3g} us "
            f"(FLOPs {before.flops:.3g} -> {after.flops:.3g}, bytes {before.bytes:.3g} -> {after.bytes:.3g}, "
            f"nodes {before.nodes} -> {after.nodes}); --strategy all applies it"
        )
    )
    return Decision(apply, numbers, reason)


# Cut-out subgraphs that run in less than this differ by scheduling noise more than by their
# work (on sample_models/seed000_subtracted_conv.py, pieces of a few microseconds measured
# "faster" made the whole model slower): the estimate decides those, and the report keeps both.
NOISE_FLOOR_MS = 0.05


def by_measurement(rewrite: Rewrite, opset: int, device: str, graph_outputs: set[int]) -> Decision:
    """Time both sides; where they cannot be cut out and run alone, or run too fast for the
    timing to mean anything, the estimate decides (and the report says why)."""

    def estimated(note: str, timed: dict | None = None) -> Decision:
        decision = by_estimate(rewrite, opset, device, graph_outputs)
        return Decision(decision.apply, {**decision.numbers, **(timed or {}), "note": note}, decision.reason)

    if not rewrite.nodes:
        return by_estimate(rewrite, opset, device, graph_outputs)
    try:
        timed = measure(
            replaced_nodes(rewrite, graph_outputs),
            [old for old, _ in rewrite.replace],
            rewrite.nodes,
            [new for _, new in rewrite.replace],
            opset,
            device,
        )
    except Unmeasurable as exc:
        return estimated(f"not measurable ({exc}): estimated")
    if max(timed["before_ms"], timed["after_ms"]) < NOISE_FLOOR_MS:
        return estimated(
            f"measured {timed['before_ms'] * 1e3:.3g} -> {timed['after_ms'] * 1e3:.3g} us: below the "
            "noise floor, estimated",
            timed,
        )
    numbers = {"method": "measured", "device": device, **timed}
    apply = timed["speedup"] >= 1  # the paired ratio: the medians' ratio mixes moments of the machine
    reason = (
        ""
        if apply
        else (
            f"measured {timed['after_ms'] * 1e3:.3g} us on {device} instead of "
            f"{timed['before_ms'] * 1e3:.3g} us (median of {timed['runs']} runs each; paired speedup "
            f"{timed['speedup']:.2f}x, {timed['low']:.2f}-{timed['high']:.2f})"
        )
    )
    return Decision(apply, numbers, reason)
