"""What the exporter wrote about each node survives the rewrite: untouched nodes, values and
graphs keep their metadata, doc strings and names exactly; a folded node carries the union of
what its nodes said and the rules that made it; reports name the PyTorch modules folded."""

from __future__ import annotations

import ast
import io

import onnx
import onnx.parser
import pytest
import torch
from torch import nn

import convexport
from convexport.ir.provenance import CLASS_HIERARCHY, NAME_SCOPES, REPLACED, RULES


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.expand = nn.Conv2d(4, 8, 1)
        self.norm = nn.BatchNorm2d(8)
        self.act = nn.ReLU()
        self.norm.running_mean.uniform_(-1, 1)
        self.norm.running_var.uniform_(0.5, 2)

    def forward(self, x):
        return self.act(self.norm(self.expand(x)))


class Net(nn.Module):
    """block.expand + block.norm fold (conv-batchnorm); head then the scale fold after it
    (conv-mul); the sigmoid is left alone."""

    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = nn.Conv2d(8, 2, 3, padding=1)
        self.scale = nn.Parameter(torch.rand(1, 2, 1, 1) + 0.5)

    def forward(self, x):
        return torch.sigmoid(self.head(self.block(x)) * self.scale)


def exported(route: str) -> onnx.ModelProto:
    torch.manual_seed(0)
    module, args = Net().eval(), (torch.randn(1, 4, 8, 8),)
    if route == "torchscript":
        buffer = io.BytesIO()
        torch.onnx.export(module, args, buffer, dynamo=False, do_constant_folding=False)
        return onnx.load_from_string(buffer.getvalue())
    return torch.onnx.export(module, args, dynamo=True, optimize=route == "dynamo").model_proto


ROUTES = ["dynamo", "dynamo-unoptimized", "torchscript"]


@pytest.fixture(scope="module", params=ROUTES)
def routed(request):
    model = exported(request.param)
    return request.param, model, convexport.optimize(model, write=False, profile=False)


def test_untouched_nodes_keep_what_the_exporter_wrote_byte_for_byte(routed):
    _, model, result = routed
    after = {node.name: node for node in result.model.graph.node}
    kept = [node for node in model.graph.node if node.name in after and node.op_type == after[node.name].op_type]
    assert kept  # the Relu and the Sigmoid at the least
    for node in kept:
        assert [(e.key, e.value) for e in after[node.name].metadata_props] == [(e.key, e.value) for e in node.metadata_props]
        assert after[node.name].doc_string == node.doc_string


def test_values_and_the_graph_keep_theirs(routed):
    _, model, result = routed
    after = {value.name: value for value in (*result.model.graph.input, *result.model.graph.output,
                                            *result.model.graph.value_info)}
    for value in (*model.graph.input, *model.graph.output):
        assert list(after[value.name].metadata_props) == list(value.metadata_props)
    assert list(result.model.graph.metadata_props) == list(model.graph.metadata_props)


def test_folded_nodes_carry_the_union_and_the_rules(routed):
    route, _, result = routed
    made = [node for node in result.model.graph.node if any(e.key == RULES for e in node.metadata_props)]
    assert made
    for node in made:
        metadata = {e.key: e.value for e in node.metadata_props}
        assert metadata[REPLACED]
        if route != "torchscript":
            scopes = ast.literal_eval(metadata[NAME_SCOPES])
            paths = {s[-2] for s in (scopes if isinstance(scopes[0], list) else [scopes])}
            assert paths <= {"block.expand", "block.norm", "head", ""}
            assert CLASS_HIERARCHY in metadata


def test_a_chain_of_rewrites_accumulates_its_rules():
    model = exported("dynamo-unoptimized")  # BN kept: conv-batchnorm, then nothing else on it
    result = convexport.optimize(model, write=False, profile=False)
    rules = [{e.key: e.value for e in n.metadata_props}.get(RULES) for n in result.model.graph.node]
    assert "conv-batchnorm" in rules and "conv-mul" in rules


@pytest.mark.parametrize("route, expected", [
    ("dynamo-unoptimized", {"block.expand (Conv2d)", "block.norm (BatchNorm2d)"}),
    ("torchscript", {"block.expand", "block.norm"}),
])
def test_the_report_names_the_modules_folded(route, expected):
    result = convexport.optimize(exported(route), write=False, profile=False)
    (folded,) = [entry for entry in result.report["rewrites"] if entry["rule"] == "conv-batchnorm"]
    assert set(folded["modules"]) == expected and folded["module"].startswith("block")


@pytest.mark.parametrize("route", ROUTES)
def test_a_fold_across_modules_names_each(route):
    result = convexport.optimize(exported(route), write=False, profile=False)
    (folded,) = [entry for entry in result.report["rewrites"] if entry["rule"] == "conv-mul"]
    head, model = ("head", "(the model)") if route == "torchscript" else ("head (Conv2d)", "(the model) (Net)")
    assert folded["modules"] == [head, model] and folded.get("module") is None  # no module holds both


def test_the_summary_has_a_line_per_module(tmp_path):
    from helpers import invoke

    path = tmp_path / "net.onnx"
    onnx.save(exported("dynamo-unoptimized"), path)
    result = invoke("optimize", path, "--no-profile", "-o", tmp_path / "o.onnx")
    assert result.exit_code == 0, result.output
    assert "  block (Block): conv-batchnorm x1" in result.stdout


def test_a_nameless_node_stays_nameless_and_a_doc_string_stays():
    model = onnx.parser.parse_model("""
        <ir_version: 10, opset_import: ["" : 18]>
        g (float[1,2] x) => (float[1,2] y) { h = Relu(x)
                                               y = Sigmoid(h) }
    """)
    model.graph.node[0].name = ""
    model.graph.node[1].name = "head"
    model.graph.node[1].doc_string = "the head"
    entry = model.graph.node[1].metadata_props.add()
    entry.key, entry.value = "mine", "kept"
    identity = onnx.helper.make_node("Identity", ["y0"], ["y"], name="passthrough")
    model.graph.node[1].output[0] = "y0"
    model.graph.node.append(identity)  # the clean-up removes it: the graph changes, is exported
    result = convexport.optimize(model, write=False, profile=False)
    assert [(node.op_type, node.name) for node in result.model.graph.node] == [("Relu", ""), ("Sigmoid", "head")]
    (head,) = [node for node in result.model.graph.node if node.op_type == "Sigmoid"]
    assert head.doc_string == "the head" and [(e.key, e.value) for e in head.metadata_props] == [("mine", "kept")]


@pytest.mark.parametrize("route", ["dynamo-unoptimized", "torchscript"])
def test_explain_names_modules_and_takes_one(route):
    model = exported(route)
    result = convexport.optimize(
        model, write=False, profile=False, explain=["conv-batchnorm", "conv-batchnorm@block", "conv-mul@block.expand"]
    )
    everywhere, in_block = result.report["explain"]["conv-batchnorm"], result.report["explain"]["conv-batchnorm@block"]
    assert in_block and set(in_block) <= set(everywhere)
    assert all(result.report["explain_modules"][node].startswith("block.") for node in in_block)
    assert "(module)" in result.report["explain"]["conv-mul@block.expand"]  # the scale is outside the block


def test_explain_of_an_unknown_module_suggests_the_close_ones():
    result = convexport.optimize(exported("torchscript"), write=False, profile=False, explain=["conv-mul@blok"])
    (said,) = result.report["explain"]["conv-mul@blok"].values()
    assert said.startswith("no module blok in the model; did you mean block")


def test_the_summary_names_modules_in_explain_lines(tmp_path):
    from helpers import invoke

    path = tmp_path / "net.onnx"
    onnx.save(exported("dynamo-unoptimized"), path)
    result = invoke("optimize", path, "--no-profile", "-o", tmp_path / "o.onnx", "--explain", "conv-batchnorm@block")
    assert result.exit_code == 0, result.output
    assert "explain conv-batchnorm@block: 1 node(s) looked at" in result.stdout
    assert " in block.norm (BatchNorm2d): rewritten: " in result.stdout or " in block.expand (Conv2d): rewritten" in result.stdout


WRONG_RULE = """rules:
  - name: relu-is-identity
    doc: Deliberately wrong, to see the failure name the module.
    match:
      - y = Relu(x)
    apply: forward_input
"""


def test_a_failing_rewrite_is_blamed_on_its_module(tmp_path):
    rules = tmp_path / "wrong.yaml"
    rules.write_text(WRONG_RULE)
    with pytest.raises(convexport.ValidationError) as caught:
        convexport.optimize(exported("dynamo-unoptimized"), write=False, rules=[rules], profile=False)
    assert caught.value.report["validation"]["culprit"]["module"] == "block.act (ReLU)"
    assert "(in block.act (ReLU)) is the first that breaks it" in str(caught.value)


class Bottleneck(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv3 = nn.Sequential(nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1))

    def forward(self, x):
        return torch.relu(self.conv3(x))


class Stacked(nn.Module):
    """Containers inside modules inside containers: blocks.0.conv3.0, as torch names it, which
    the TorchScript exporter's node names spell /blocks/blocks.0/conv3/conv3.0/Conv."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Bottleneck(), Bottleneck())
        self.head = nn.ModuleList([nn.Sequential(nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1))])

    def forward(self, x):
        return self.head[0](self.blocks(x))


@pytest.mark.parametrize("route", ["dynamo-unoptimized", "torchscript"])
def test_module_paths_are_torchs_whichever_exporter_wrote_them(route):
    """The TorchScript exporter's names gave blocks.blocks.0.conv3.conv3.0 (each segment joined);
    both exporters now give the module's own path, and --explain takes it."""
    torch.manual_seed(0)
    module, args = Stacked().eval(), (torch.randn(1, 4, 6, 6),)
    if route == "torchscript":
        buffer = io.BytesIO()
        torch.onnx.export(module, args, buffer, dynamo=False, do_constant_folding=False)
        model = onnx.load_from_string(buffer.getvalue())
    else:
        model = torch.onnx.export(module, args, dynamo=True, optimize=False).model_proto
    result = convexport.optimize(model, write=False, profile=False, explain=["conv-conv@blocks.1"])
    folded = {entry.get("module") for entry in result.report["rewrites"] if entry["rule"] == "conv-conv"}
    assert {path.split(" ")[0] for path in folded if path} == {"blocks.0.conv3", "blocks.1.conv3", "head.0"}
    assert not result.report["explain"]["conv-conv@blocks.1"].get("(module)")  # found, not "no module"
    assert all(path.startswith("blocks.1.") for path in result.report["explain_modules"].values() if "blocks" in path)
