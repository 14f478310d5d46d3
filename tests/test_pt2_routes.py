"""torch.export archives (.pt2) through optimize, export and the Python API: the program's own
input shapes (dynamic dims included) stand in for --input, its dynamic dims get readable names
in the ONNX graph, and what --input or --dynamic-batch cannot change is a one-line user error."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
import torch
from helpers import assert_user_error, invoke, run, tensor
from torch import nn

import convexport
from convexport.load.routes.exported_program import _name_torch_symbols
from convexport.load.inputs import InputSpec
from convexport.load.routes import load_model

Dim = torch.export.Dim
TORCH_SYMBOL = re.compile(r"^s\d+$")


class TokensAndMask(nn.Module):
    """Two inputs sharing a batch and a sequence dim, one of them int64."""

    def __init__(self):
        super().__init__()
        self.embed, self.linear = nn.Embedding(10, 8), nn.Linear(8, 8)

    def forward(self, ids, mask):
        return self.linear(self.embed(ids)) * mask.unsqueeze(-1)


def conv_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()).eval()


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """{name: .pt2 path}: dynamic batch, a bounded batch, two inputs with shared dims, static."""
    folder = tmp_path_factory.mktemp("pt2")
    torch.manual_seed(0)
    made = {
        "dynamic": (conv_net(), (torch.randn(3, 3, 8, 8),), {"input": {0: Dim("batch")}}),
        "bounded": (nn.Linear(4, 5).eval(), (torch.randn(5, 4),), {"input": {0: Dim("batch", min=4, max=64)}}),
        "from_one": (nn.Linear(4, 5).eval(), (torch.randn(3, 4),), {"input": {0: Dim("batch", min=1, max=64)}}),
        "tokens": (
            TokensAndMask().eval(),
            (torch.randint(0, 10, (3, 7)), torch.rand(3, 7)),
            {"ids": {0: Dim("batch"), 1: Dim("seq")}, "mask": {0: Dim("batch"), 1: Dim("seq")}},
        ),
        "static": (conv_net(), (torch.randn(1, 3, 8, 8),), None),
    }
    paths = {}
    for name, (module, args, dynamic_shapes) in made.items():
        paths[name] = folder / f"{name}.pt2"
        torch.export.save(torch.export.export(module, args, dynamic_shapes=dynamic_shapes), paths[name])
    return paths


def dims(value: onnx.ValueInfoProto) -> list:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def all_dim_params(model: onnx.ModelProto) -> set[str]:
    values = [*model.graph.input, *model.graph.output, *model.graph.value_info]
    return {d.dim_param for value in values for d in value.type.tensor_type.shape.dim if d.dim_param}


def reference(path, *args) -> np.ndarray:
    with torch.no_grad():
        return torch.export.load(str(path)).module()(*args).numpy()


def optimize(path, tmp_path, **kwargs) -> onnx.ModelProto:
    result = convexport.optimize(str(path), output=tmp_path / "out.onnx", profile=False, **kwargs)
    assert result.report["validation"]["passed"]
    return onnx.load(tmp_path / "out.onnx")




def test_a_dynamic_program_needs_no_input_and_stays_dynamic(programs, tmp_path):
    model = optimize(programs["dynamic"], tmp_path)
    assert dims(model.graph.input[0]) == ["batch", 3, 8, 8]
    assert dims(model.graph.output[0]) == ["batch", 4, 8, 8]
    assert not any(TORCH_SYMBOL.match(name) for name in all_dim_params(model))
    for batch in (2, 5):
        x = torch.randn(batch, 3, 8, 8)
        (actual,) = run(model, {model.graph.input[0].name: x.numpy()})
        np.testing.assert_allclose(actual, reference(programs["dynamic"], x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, batch", [("dynamic", 2), ("bounded", 4), ("from_one", 2)])
def test_example_inputs_take_the_smallest_size_of_two_or_more_in_range(programs, name, batch):
    """0 and 1 are sizes torch specialises; 4 is the least a program bounded to [4, 64] takes."""
    loaded = load_model(str(programs[name]))
    (example,) = loaded.example_inputs
    assert example.shape[0] == batch and example.dtype == torch.float32
    assert loaded.input_names == ["input"]


def test_example_inputs_keep_each_inputs_dtype_and_shared_dims(programs):
    ids, mask = load_model(str(programs["tokens"])).example_inputs
    assert ids.dtype == torch.int64 and mask.dtype == torch.float32
    assert tuple(ids.shape) == tuple(mask.shape) == (2, 2)


def test_shared_dims_get_one_name_each_and_run_at_any_size(programs, tmp_path):
    model = optimize(programs["tokens"], tmp_path)
    assert [dims(value) for value in model.graph.input] == [["batch", "ids_dim1"], ["batch", "ids_dim1"]]
    assert dims(model.graph.output[0]) == ["batch", "ids_dim1", 8]
    for batch, length in ((2, 3), (4, 9)):
        ids, mask = torch.randint(0, 10, (batch, length)), torch.rand(batch, length)
        (actual,) = run(model, {"ids": ids.numpy(), "mask": mask.numpy()})
        np.testing.assert_allclose(actual, reference(programs["tokens"], ids, mask), rtol=1e-5, atol=1e-5)


def test_input_names_the_dynamic_dims(programs, tmp_path):
    """By name (an input left out keeps its dims, under the names given for the shared ones)."""
    model = optimize(programs["tokens"], tmp_path, inputs=["ids:Bxseq"])
    assert [dims(value) for value in model.graph.input] == [["B", "seq"], ["B", "seq"]]
    assert not any(TORCH_SYMBOL.match(name) for name in all_dim_params(model))


def test_input_by_position_renames_the_inputs(programs, tmp_path):
    result = invoke("export", programs["tokens"], "-o", tmp_path / "t.onnx", "--input", "a:Nxseq:int64",
                    "--input", "b:Nxseq")
    assert result.exit_code == 0, result.output
    model = onnx.load(tmp_path / "t.onnx")
    assert [(value.name, dims(value)) for value in model.graph.input] == [("a", ["batch", "seq"]),
                                                                         ("b", ["batch", "seq"])]


def test_a_concrete_input_size_is_validated_on_and_the_dim_stays_dynamic(programs, tmp_path):
    result = convexport.optimize(str(programs["dynamic"]), inputs=["input:4x3x8x8"], profile=False, write=False)
    assert result.report["validation"]["passed"]
    assert dims(result.model.graph.input[0]) == ["batch", 3, 8, 8]


def test_input_with_n_on_a_dynamic_program_names_it_batch(programs, tmp_path):
    result = invoke("optimize", programs["dynamic"], "-o", tmp_path / "o.onnx", "--no-profile", "-q",
                    "--input", "x:Nx3x8x8")
    assert result.exit_code == 0, result.output
    model = onnx.load(tmp_path / "o.onnx")
    assert (model.graph.input[0].name, dims(model.graph.input[0])) == ("x", ["batch", 3, 8, 8])
    assert dims(model.graph.output[0])[0] == "batch"


def test_dynamic_batch_on_a_dynamic_program_is_already_met(programs, tmp_path):
    result = invoke("optimize", programs["dynamic"], "-o", tmp_path / "o.onnx", "--no-profile", "-q",
                    "--dynamic-batch")
    assert result.exit_code == 0, result.output
    assert dims(onnx.load(tmp_path / "o.onnx").graph.input[0]) == ["batch", 3, 8, 8]


def test_a_static_program_works_as_before(programs, tmp_path):
    model = optimize(programs["static"], tmp_path)
    assert dims(model.graph.input[0]) == [1, 3, 8, 8] and dims(model.graph.output[0]) == [1, 4, 8, 8]
    assert op_types(model) == {"Conv", "Relu"}
    x = torch.randn(1, 3, 8, 8)
    (actual,) = run(model, {"input": x.numpy()})
    np.testing.assert_allclose(actual, reference(programs["static"], x), rtol=1e-5, atol=1e-5)
    assert dims(optimize(programs["static"], tmp_path, inputs=["input:1x3x8x8"]).graph.input[0]) == [1, 3, 8, 8]


def op_types(model: onnx.ModelProto) -> set[str]:
    return {node.op_type for node in model.graph.node}


@pytest.mark.parametrize("name, options, fragments", [
    ("static", ["--dynamic-batch"], ["static batch of 1", "dims are fixed when it is exported", "--dynamic-batch"]),
    ("static", ["--input", "input:Nx3x8x8"], ["dim 0 of 1", "dims are fixed when it is exported"]),
    ("dynamic", ["--input", "input:Nx3x9x8"], ["dim 2 of 8"]),
    ("dynamic", ["--input", "input:Nx3x8"], ["rank 4, not 3"]),
    ("dynamic", ["--input", "input:Nx3x8x8:int64"], ["'input' is float32"]),
    ("bounded", ["--input", "input:2x4"], ["dim 0 only in [4, 64]"]),
    ("tokens", ["--input", "a:Nx7"], ["takes 2 tensor input(s) (ids, mask), not 1"]),
])
def test_what_a_program_cannot_change_is_a_one_line_error(programs, tmp_path, name, options, fragments):
    result = invoke("optimize", programs[name], "-o", tmp_path / "o.onnx", "--no-profile", *options)
    assert_user_error(result, f"{name}.pt2", *fragments)
    assert not (tmp_path / "o.onnx").exists()


def test_symbols_are_renamed_everywhere_and_inside_expressions():
    """Consistently across inputs, outputs and value_info, inside expressions (2*s12) too."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Concat", ["a", "b"], ["c"], axis=0), onnx.helper.make_node("Identity", ["c"], ["d"])],
        "g",
        [tensor("a", ["s12", "s7"]), tensor("b", ["s12", "s7"])],
        [tensor("d", ["2*s12", "s7"])],
        value_info=[tensor("c", ["2*s12", "s7"])],
    )
    model = onnx.helper.make_model(graph)
    _name_torch_symbols(model, [])
    assert [dims(value) for value in model.graph.input] == [["batch", "a_dim1"], ["batch", "a_dim1"]]
    assert dims(model.graph.output[0]) == ["2*batch", "a_dim1"]
    assert dims(model.graph.value_info[0]) == ["2*batch", "a_dim1"]


@pytest.mark.parametrize("inputs, specs, expected", [
    # a name the graph already gives a dim that is no symbol is not given to a symbol too
    ([["s3", 2], ["batch", 2]], [], [["a_dim0", 2], ["batch", 2]]),
    # two symbols are two sizes torch found independent: one name each, even where --input gave one
    ([["s3"], ["s4"]], [InputSpec("a", ("n",)), InputSpec("b", ("n",))], [["n"], ["b_dim0"]]),
    # a symbol --input names at its first input keeps that name wherever it appears
    ([["s3", "s5"], ["s3", "s5"]], [InputSpec("a", (2, "seq"))], [["batch", "seq"], ["batch", "seq"]]),
])
def test_names_given_are_unique_per_symbol(inputs, specs, expected):
    graph = onnx.helper.make_graph([], "g", [tensor(name, shape) for name, shape in zip("ab", inputs)], [])
    model = onnx.helper.make_model(graph)
    _name_torch_symbols(model, specs)
    assert [dims(value) for value in model.graph.input] == expected
