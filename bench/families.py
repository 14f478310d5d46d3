"""convexport on eight re-parameterisable model families as the exporters emit them, against each
family's own hand re-parameterisation (issue 22, "Fold graphs as exporters really emit them").

    .venv/bin/python bench/families.py [--only NAME] [--write bench/RESULTS.md]

The networks are small re-implementations in their training form (bench/family_blocks.py:
RepVGG, MobileOne, FastViT, RepGhost, GhostNet, RepViT, LeViT, EfficientViT). Each is exported
by three routes, torch.onnx.export with dynamo=True and optimize=True (the default), dynamo=True
with optimize=False, and the TorchScript exporter with do_constant_folding=False, and each ONNX
graph goes through convexport.optimize (validated against the original with ONNX Runtime,
not profiled). The hand form (the family's reparameterize(), in torch) is exported by the first
route. Tables: nodes, Conv and Gemm+MatMul counts (original -> convexport, hand), convexport's
wall time; ONNX Runtime CPU latency of the original, convexport and hand graphs of the first
route, each pair (convexport beside the original, the hand graph beside convexport) in a fresh
process taking turns in blocks of runs (bench/peers.py's timed_pair: three sessions in one
2-core process gave one of them the second core in some runs and not in others; bench/RESULTS.md,
"Measurements behind the code"); and the
"all" strategy against the default one on the largest exported graph.

`--write FILE` replaces the section "## Real model families (own re-implementations)" of FILE,
or appends it at the end: after "## Measurements behind the code", which bench/peers.py keeps
with everything below it when it rewrites its own tables.
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import family_blocks  # noqa: E402
from peers import timed_pair  # noqa: E402

import convexport  # noqa: E402
from convexport.load.onnx_route import graph_input_specs  # noqa: E402
from convexport.profile.profiler import TIME_BUDGET_S  # noqa: E402
from convexport.util.quiet import quiet_libraries  # noqa: E402

ROUTES = ("dynamo", "dynamo unoptimized", "torchscript unfolded")
TIMED_ROUTE = "dynamo"
DEFAULT_STRATEGY = "cost"
STRATEGY_CALLS = 3  # "all" against the default: the median of this many calls each
HEADING = "## Real model families (own re-implementations)"


@dataclass
class Folded:
    """convexport's outcome on one exported graph: the optimized model, or the error it raised."""

    model: onnx.ModelProto | None
    seconds: float
    report: dict | None
    error: str | None = None


def export(module: torch.nn.Module, inputs: tuple, route: str) -> onnx.ModelProto:
    """The module as ONNX by one of ROUTES, at the exporters' own defaults otherwise (opset 18)."""
    with quiet_libraries():
        if route.startswith("dynamo"):
            program = torch.onnx.export(module, inputs, dynamo=True, optimize=route == "dynamo", verbose=False)
            return program.model_proto
        buffer = io.BytesIO()
        torch.onnx.export(module, inputs, buffer, dynamo=False, opset_version=18, do_constant_folding=False,
                          training=torch.onnx.TrainingMode.EVAL)
    return onnx.load_from_string(buffer.getvalue())


def fold(model: onnx.ModelProto, strategy: str = DEFAULT_STRATEGY) -> Folded:
    """convexport.optimize on the graph (validated, not profiled, nothing written), timed; a
    ConvexportError is the outcome, not the end of the benchmark."""
    start = time.perf_counter()
    try:
        result = convexport.optimize(model, strategy=strategy, write=False, profile=False)
    except convexport.ConvexportError as error:
        return Folded(None, time.perf_counter() - start, None, one_line(f"{type(error).__name__}: {error}"))
    return Folded(result.model, time.perf_counter() - start, result.report)


def one_line(message: str) -> str:
    """A message as one line, whole: it goes into a Markdown list item."""
    return " ".join(message.split())


def counts(model: onnx.ModelProto | None) -> tuple[int, int, int] | None:
    """Nodes, Conv nodes, and Gemm + MatMul nodes of the main graph."""
    if model is None:
        return None
    ops = [node.op_type for node in model.graph.node]
    return len(ops), ops.count("Conv"), ops.count("Gemm") + ops.count("MatMul")


def torch_error(model: torch.nn.Module, hand: torch.nn.Module, inputs: tuple) -> float:
    """Largest |training - hand| output difference in torch: the hand form is the same function."""
    with torch.no_grad():
        return float((model(*inputs) - hand(*inputs)).abs().max())


def bench_family(name: str, factory) -> dict:
    """Every route's original and convexport outcome, the hand graph, and the hand form's error."""
    model, inputs = factory()
    hand = family_blocks.reparameterized(model)
    family = {"name": name, "hand": export(hand, inputs, TIMED_ROUTE), "hand_error": torch_error(model, hand, inputs),
              "routes": {}}
    for route in ROUTES:
        try:
            original = export(model, inputs, route)
        except Exception as error:  # an exporter failing on a family is a result to show
            failed = one_line(f"export failed: {type(error).__name__}: {error}")
            family["routes"][route] = (None, Folded(None, 0.0, None, failed))
            continue
        family["routes"][route] = (original, fold(original))
    return family


def cell(before: int, after: int | None, hand: int) -> str:
    """`before -> after (hand)`, or just `before (hand)` where convexport gave no graph."""
    middle = "" if after is None else f" -> {after}"
    return f"{before}{middle} ({hand})"


def fold_rows(family: dict) -> list[str]:
    """One table row per route of the family."""
    hand = counts(family["hand"])
    rows = []
    for route, (original, folded) in family["routes"].items():
        if original is None:
            rows.append(f"| {family['name']} | {route} | | | | | **export failed** (below) |")
            continue
        before, after = counts(original), counts(folded.model)
        columns = [cell(before[index], after[index] if after else None, hand[index]) for index in range(3)]
        if folded.error is None:
            validation = folded.report["validation"]
            error = max(output["max_rel"] for output in validation["outputs"].values())
            rewriting = folded.report["timings_s"].get("rewriting", 0.0)
            outcome = f"{len(folded.report['rewrites'])} rewrites, max rel error {error:.1e}"
            seconds = f"{folded.seconds:.2f} ({rewriting:.2f})"
        else:
            outcome, seconds = f"**{error_name(folded.error)}** (below)", f"{folded.seconds:.2f}"
        rows.append(f"| {family['name']} | {route} | {' | '.join(columns)} | {seconds} | {outcome} |")
    return rows


def latency_row(family: dict) -> str:
    """The TIMED_ROUTE graphs: convexport's beside the original, then the hand graph beside
    convexport's, each pair in a fresh process; each ratio is within its pair."""
    original, folded = family["routes"][TIMED_ROUTE]
    if original is None or folded.model is None:
        return f"| {family['name']} | {'export' if original is None else 'convexport'} failed | | | | | |"
    inputs = graph_input_specs(original)
    against_original = timed_pair(original, folded.model, inputs, "cpu")
    against_hand = timed_pair(family["hand"], folded.model, inputs, "cpu")
    convexport_ms, original_ms = against_original["variant"]["ms"], against_original["original"]["ms"]
    hand_ms, beside_hand_ms = against_hand["original"]["ms"], against_hand["variant"]["ms"]
    return (f"| {family['name']} | {original_ms:.3f} | {convexport_ms:.3f} ({beside_hand_ms:.3f}) | {hand_ms:.3f} | "
            f"{original_ms / convexport_ms:.2f}x | {hand_ms / beside_hand_ms:.2f}x | {family['hand_error']:.1e} |")


def strategy_runs(original: onnx.ModelProto) -> dict[str, list[Folded]]:
    """"all" against the default strategy on one graph, STRATEGY_CALLS calls each,
    alternating so that machine noise hits both."""
    runs = {"all": [], DEFAULT_STRATEGY: []}
    for _ in range(STRATEGY_CALLS):
        for strategy, calls in runs.items():
            calls.append(fold(original, strategy))
    return runs


def strategy_rows(runs: dict[str, list[Folded]]) -> list[str]:
    """Per strategy: nodes and Conv after, median wall time of the call and of its rewriting."""
    rows = []
    for strategy, calls in runs.items():
        seconds, last = statistics.median(call.seconds for call in calls), calls[-1]
        if last.error is not None:
            rows.append(f"| {strategy} | | | {seconds:.2f} | **{error_name(last.error)}** (below) |")
            continue
        nodes, conv, _ = counts(last.model)
        rewriting = statistics.median(call.report["timings_s"].get("rewriting", 0.0) for call in calls)
        rows.append(f"| {strategy} | {nodes} | {conv} | {seconds:.2f} | {rewriting:.2f} |")
    return rows


def error_name(error: str) -> str:
    """The exception's class name at the head of a recorded error ("export failed" for an export)."""
    return error.split(":")[0]


def failures(families: list[dict], largest: str, runs: dict[str, list[Folded]]) -> list[str]:
    """Every export or convexport error, word for word, with its family and route (or strategy)."""
    found = [f"- {family['name']}, {route}: `{folded.error}`"
             for family in families for route, (_, folded) in family["routes"].items() if folded.error]
    return found + [f"- {largest}, strategy {strategy}: `{calls[-1].error}`"
                    for strategy, calls in runs.items() if calls[-1].error]


def largest_graph(families: list[dict]) -> tuple[str, onnx.ModelProto]:
    """The exported graph with the most nodes, of any family and route ("family, route"): the
    heaviest job for convexport."""
    exported = [(f"{family['name']}, {route}", original)
                for family in families for route, (original, _) in family["routes"].items() if original is not None]
    return max(exported, key=lambda item: len(item[1].graph.node))


def warm_up() -> None:
    """One untimed convexport call: the first in a process also pays one-time imports and rule
    parsing, which would otherwise be charged to the first family."""
    model, inputs = family_blocks.repvgg()
    fold(export(model, inputs, TIMED_ROUTE))


def section(families: list[dict], latency: list[str], largest: str, largest_nodes: int,
            strategies: dict[str, list[Folded]], seconds: float) -> str:
    """The results as the Markdown section HEADING."""
    lines = [
        HEADING, "",
        f"{datetime.date.today()}, {platform.machine()} with {os.cpu_count()} cores, torch {torch.__version__}, "
        f"ONNX Runtime {__import__('onnxruntime').__version__} on CPU; `bench/families.py` (networks: "
        "`bench/family_blocks.py`, written for this benchmark from each family's block diagram, 1x3x64x64 input, "
        f"random BatchNorm statistics). Whole benchmark: {seconds:.0f} s.", "",
        "Counts are `original -> convexport (hand re-parameterised)`; the hand graph is the family's "
        "reparameterize() exported by the dynamo route with optimize=True. convexport s is the whole "
        "convexport.optimize call (constant folding, rewriting, validation against the original with ONNX "
        "Runtime; in brackets the rewriting alone). Routes: `dynamo` is torch.onnx.export(dynamo=True, "
        "optimize=True), `dynamo unoptimized` the same with optimize=False, `torchscript unfolded` the "
        "TorchScript exporter (dynamo=False, opset 18) with do_constant_folding=False.", "",
        "| family | route | nodes | Conv | Gemm+MatMul | convexport s (rewriting) | outcome |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for family in families:
        lines += fold_rows(family)
    lines += [
        "", f"### Latency, {TIMED_ROUTE} route", "",
        "ONNX Runtime CPU, median ms of block-interleaved runs (as many as fit in about "
        f"{TIME_BUDGET_S:g} s per graph; convexport/profile/profiler.py), convexport's graph beside the original in one "
        "fresh process and beside the hand graph (in brackets) in another; each ratio is within its pair. Ratios > 1: "
        "convexport's graph is faster; where convexport made no rewrite the two graphs are the same, and their "
        "ratio is the noise of the measurement. The last column checks the harness: the largest "
        "|training - hand| output difference in torch.", "",
        "| family | original ms | convexport ms (beside hand) | hand ms | original / convexport | hand / convexport | "
        "hand vs training |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *latency,
        "", f"### Strategy all against {DEFAULT_STRATEGY} on the largest graph: {largest}", "",
        f"The exported graph with the most nodes ({largest_nodes}); median of {STRATEGY_CALLS} calls each, "
        "alternating.", "",
        "| strategy | nodes after | Conv after | convexport s | rewriting s |",
        "|---|---:|---:|---:|---:|",
        *strategy_rows(strategies),
    ]
    errors = failures(families, largest, strategies)
    if errors:
        lines += ["", "### Errors, as raised", "", *errors]
    return "\n".join(lines) + "\n"


def write_section(path: Path, text: str, heading: str = HEADING) -> None:
    """Replace the `heading` section of `path` (up to the next level-2 heading) with `text`, or
    append it; every other section stays as it is."""
    old = path.read_text() if path.exists() else ""
    start = old.find(heading)
    if start < 0:
        path.write_text(old.rstrip("\n") + "\n\n" + text)
        return
    end = old.find("\n## ", start + len(heading))
    rest = "" if end < 0 else "\n" + old[end + 1:]
    path.write_text(old[:start] + text + rest)


def arguments(doc: str, what: str) -> argparse.Namespace:
    """A benchmark's command line: --only (a name part) and --write (a Markdown file)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--only", help=f"Only the {what} whose name contains this.")
    parser.add_argument("--write", type=Path, help="Put the section into this Markdown file.")
    return parser.parse_args()


def main() -> None:
    args = arguments(__doc__, "families")
    start = time.perf_counter()
    warm_up()
    families = []
    for name, factory in family_blocks.FAMILIES.items():
        if args.only is None or args.only.lower() in name.lower():
            families.append(bench_family(name, factory))
            print("\n".join(fold_rows(families[-1])), flush=True)
    latency = [latency_row(family) for family in families]
    largest, graph = largest_graph(families)
    strategies = strategy_runs(graph)
    text = section(families, latency, largest, len(graph.graph.node), strategies, time.perf_counter() - start)
    print("\n" + text)
    if args.write:
        write_section(args.write, text)


if __name__ == "__main__":
    main()
