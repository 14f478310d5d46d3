"""Step 5 of choose.py: where float32 is cheap and measurably closer, it is taken.

The nodes nearest the outputs in FLOPs (each node's own and those on its cheapest path to an output: a detector's box
decoding, whose distances float16 rounds to a 2048th of themselves before they are scaled to
pixels) are tried float32 in growing sets, those within TAIL_FLOPS_SHARE of the model's
FLOPs over 4^k of an output, while the set's FLOPs stay within TAIL_FLOPS_SHARE. A set that
brings the outputs nearer (each output's error over its bound, the worst) by TAIL_GAIN or
more is first pruned: each part of it that only its own Casts feed (a classifier's scores
beside the boxes) goes back to half where that saves Casts and leaves the outputs within
TAIL_SLACK of as near. It is kept where it then adds at most TAIL_CASTS_PER_OUTPUT Casts per
output (none: it moves the output's Cast); no set reaches a runtime fusion's nodes or what
they read (step 3: a Cast there stops the fusion).
"""

from __future__ import annotations

import math
from typing import Protocol

import onnx

from ..ir.slots import DataSlots
from .convert import Converted
from .kept import KeptFloat32
from .outputs import OutputJudgement, over_bound, worst_ratio

Attempt = tuple[Converted, dict[str, OutputJudgement]]  # a conversion, and its outputs judged


class Choosing(Protocol):
    """What the tail asks of choose.py's choice: its model and measurements, and its attempts."""

    model: onnx.ModelProto
    producer: dict[str, int]
    candidates: dict[int, DataSlots]
    regions: list[tuple[str, set[int]]]
    flops: list[float]

    def attempt(self, keep: dict[int, KeptFloat32]) -> Attempt: ...

    def with_regions(self, kept: dict[int, KeptFloat32]) -> dict[int, KeptFloat32]: ...

    def half_nodes(self, kept: dict[int, KeptFloat32]) -> set[int]: ...


# the float32 tail (module doc) may cost this share of the model's FLOPs, and is taken
# where it brings the outputs' error to this fraction of what it is without it or less; its
# sets are those within the share over 4^k of an output, k < TAIL_RUNGS (each rung one
# conversion judged); a part of it goes back to half where the outputs stay within TAIL_SLACK
# of the error with it, at most TAIL_PRUNES parts tried in all
TAIL_FLOPS_SHARE = 0.01
TAIL_GAIN = 0.8
TAIL_RUNGS = 6
TAIL_SLACK = 1.05
TAIL_PRUNES = 4
# the Casts a tail may add per output: none, it may only move the output's Cast
# (sample_models/seed000_subtracted_conv.py's
# tail was 0.7x the largest error at a third Cast, one more than onnxconverter-common's file;
# a Cast costs a kernel launch and a pass over its tensor on a GPU)
TAIL_CASTS_PER_OUTPUT = 0


def closer_tail(
    choice: Choosing, kept: dict[int, KeptFloat32], judged, casts: int
) -> tuple[dict[int, KeptFloat32], Attempt] | None:
    """Step 5: the float32 tail that brings the outputs nearest the exact result, where one
    within the FLOPs and Casts allowed (`casts`, those without it, and TAIL_CASTS_PER_OUTPUT
    more per output) does so by TAIL_GAIN or more, less its parts that do not pay for their Casts; None
    where none does. No tail reaches a runtime fusion's nodes nor what they read: a Cast
    there stops the fusion (a float32 residual stream between BERT's attentions does)."""
    fused = set().union(*(members for _, members in choice.regions))
    feeding = {choice.producer.get(name) for index in fused for name in choice.model.graph.node[index].input}
    half = choice.half_nodes(kept) - fused - feeding
    total = sum(choice.flops)
    cost = _flops_to_outputs(choice.model, list(judged), choice.flops)
    allowed, casts_allowed = TAIL_FLOPS_SHARE * total, casts + TAIL_CASTS_PER_OUTPUT * len(judged)
    best, best_error, tried, prunes = None, worst_ratio(judged), set(), TAIL_PRUNES
    for rung in reversed(range(TAIL_RUNGS)):
        tail = frozenset(index for index in half if cost.get(index, math.inf) <= allowed / 4**rung)
        if not tail or tail in tried:
            continue
        tried.add(tail)
        trial = _with_tail(choice, kept, tail, total)
        if sum(choice.flops[i] for i in trial if i not in kept) > allowed:
            break  # the set, or a fused kernel's nodes that came with it, cost too much
        result = choice.attempt(trial)
        if over_bound(result[1]) or worst_ratio(result[1]) > TAIL_GAIN * best_error:
            continue
        trial, result, prunes = _without_idle_parts(choice, kept, trial, result, total, prunes)
        if result[0].casts <= casts_allowed:
            best, best_error = (trial, result), worst_ratio(result[1])
    return best


def _without_idle_parts(choice: Choosing, kept, trial, result: Attempt, total: float, tries: int):
    """`trial`'s tail less the parts (_tail_parts) that cost Casts and bring the outputs no
    nearer: each given back to half where the Casts fall and the outputs stay within
    TAIL_SLACK of `result`'s error, those with most nodes tried first, `tries` at most; the
    tries left are returned with the tail and its attempt."""
    error = worst_ratio(result[1])
    tail = {index for index in trial if index not in kept}
    half = set(choice.candidates) - set(trial)
    now = _border_casts(choice.model, choice.candidates, choice.producer, tail, half)
    parts = _tail_parts(choice.model, choice.candidates, choice.producer, tail, half)
    for part in sorted(parts, key=len, reverse=True):
        smaller = tail - part
        if not part <= tail or not smaller or tries == 0:
            continue
        fewer_crossings = _border_casts(choice.model, choice.candidates, choice.producer, smaller, half | part)
        if fewer_crossings >= now:
            continue
        candidate = _with_tail(choice, kept, frozenset(smaller), total)
        if any(index in candidate for index in part):
            continue  # a fused kernel's node: the part comes back with it
        tries -= 1
        outcome = choice.attempt(candidate)
        fewer = outcome[0].casts < result[0].casts
        if fewer and not over_bound(outcome[1]) and worst_ratio(outcome[1]) <= TAIL_SLACK * error:
            tail, half, trial, result, now = smaller, half | part, candidate, outcome, fewer_crossings
    return trial, result, tries


def _with_tail(choice: Choosing, kept, tail: frozenset[int], total: float) -> dict[int, KeptFloat32]:
    share = sum(choice.flops[index] for index in tail) / total if total else 0.0
    nodes = choice.model.graph.node
    reason = (
        f"in the outputs' float32 tail ({100 * share:.2g}% of the model's FLOPs), where float32 costs little and "
        "brings the outputs nearer"
    )
    return choice.with_regions({**kept, **{index: KeptFloat32.of(nodes[index], reason) for index in tail}})


def _flops_to_outputs(model: onnx.ModelProto, outputs: list[str], flops: list[float]) -> dict[int, float]:
    """Each node that `outputs` depend on: the FLOPs of the cheapest path from it to one of
    them, its own included (the nodes are in topological order, so its readers come after it)."""
    readers: dict[str, list[int]] = {}
    for index, node in enumerate(model.graph.node):
        for name in node.input:
            readers.setdefault(name, []).append(index)
    wanted = set(outputs)
    cost: dict[int, float] = {}
    for index in reversed(range(len(model.graph.node))):
        node = model.graph.node[index]
        onward = [cost[reader] for name in node.output for reader in readers.get(name, ()) if reader in cost]
        if wanted.intersection(node.output):
            onward.append(0.0)
        if onward:
            cost[index] = flops[index] + min(onward)
    return cost


def _tail_parts(model, candidates: dict[int, DataSlots], producer, tail: set[int], half: set[int]) -> set[frozenset]:
    """The parts of a float32 tail that may go back to half alone: for each set of tensors made
    in half that the tail reads (its entries), the tail's nodes that depend on no other entry."""
    nodes = model.graph.node
    entries: dict[int, frozenset[str]] = {}
    for index in sorted(tail):
        reached: set[str] = set()
        for position in candidates[index].inputs:
            name = nodes[index].input[position]
            made_by = producer.get(name)
            if made_by in tail:
                reached |= entries[made_by]
            elif made_by in half:
                reached.add(name)
        entries[index] = frozenset(reached)
    every = frozenset().union(*entries.values())
    return {
        frozenset(index for index, own in entries.items() if own and own <= fed)
        for fed in set(entries.values())
        if fed and fed != every
    }


def _border_casts(model, candidates: dict[int, DataSlots], producer, tail: set[int], half: set[int]) -> int:
    """The Casts where a float32 tail meets the half nodes: the float tensors that cross."""
    nodes = model.graph.node
    crossing = set()
    for index in tail | half:
        for position in candidates[index].inputs:
            name = nodes[index].input[position]
            made_by = producer.get(name)
            if (index in tail and made_by in half) or (index in half and made_by in tail):
                crossing.add(name)
    return len(crossing)
