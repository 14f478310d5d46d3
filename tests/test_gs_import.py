"""convexport's importer builds the graph gs.import_onnx builds: the same classes and fields,
the same tensors shared the same way, the same readers and producers in the same order."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper, numpy_helper

from convexport import gs_import
from helpers import IR_VERSION, make_model, tensor
from test_random_graphs import SAMPLES, random_graph
from test_robustness import if_model, loop_model, scan_model

FIXTURES = SAMPLES.parent / "tests" / "fixtures"


class _Pairing:
    """Walks two gs graphs side by side; objects met at the same place must correspond one to one."""

    def __init__(self):
        self.seen: dict[int, int] = {}

    def same_object(self, a, b, where: str) -> bool:
        """True the first time a and b meet (compare them then), False after; a pairing that
        contradicts an earlier one fails."""
        if id(a) in self.seen:
            assert self.seen[id(a)] == id(b), f"{where}: shared differently"
            return False
        assert id(b) not in self.seen.values(), f"{where}: shared differently"
        self.seen[id(a)] = id(b)
        return True

    def graphs(self, a: gs.Graph, b: gs.Graph, where: str = "graph") -> None:
        assert type(a) is type(b)
        plain = ("name", "doc_string", "opset", "producer_name", "producer_version", "ir_version", "name_idx")
        assert [getattr(a, f) for f in plain] == [getattr(b, f) for f in plain], where
        assert list(a.import_domains or []) == list(b.import_domains or []), where
        assert len(a.nodes) == len(b.nodes) and len(a.inputs) == len(b.inputs) and len(a.outputs) == len(b.outputs)
        for index, (x, y) in enumerate(zip(a.inputs + a.outputs, b.inputs + b.outputs)):
            self.tensors(x, y, f"{where} input/output {index}")
        for index, (x, y) in enumerate(zip(a.nodes, b.nodes)):
            self.nodes(x, y, f"{where} node {index}")

    def nodes(self, a: gs.Node, b: gs.Node, where: str) -> None:
        if not self.same_object(a, b, where):
            return
        assert type(a) is type(b) and set(vars(a)) == set(vars(b)), where
        assert (a.op, a.name, a.domain) == (b.op, b.name, b.domain), where
        assert type(a.attrs) is type(b.attrs) and list(a.attrs) == list(b.attrs), where
        for key in a.attrs:
            self.values(a.attrs[key], b.attrs[key], f"{where} attribute {key}")
        for kind in ("inputs", "outputs"):
            x, y = getattr(a, kind), getattr(b, kind)
            assert type(x) is type(y) and len(x) == len(y), where
            assert x.parent_obj is a and y.parent_obj is b and x.field_name == y.field_name, where
            for index, (s, t) in enumerate(zip(x, y)):
                self.tensors(s, t, f"{where} {kind}[{index}]")

    def tensors(self, a: gs.Tensor, b: gs.Tensor, where: str) -> None:
        if not self.same_object(a, b, where):
            return
        assert type(a) is type(b) and set(vars(a)) == set(vars(b)), where
        for field in vars(a):
            if field in ("inputs", "outputs"):
                x, y = getattr(a, field), getattr(b, field)
                assert type(x) is type(y) and x.field_name == y.field_name and x.parent_obj is a and y.parent_obj is b
                assert len(x) == len(y), f"{where} {field}"
                for index, (s, t) in enumerate(zip(x, y)):
                    self.nodes(s, t, f"{where} {field}[{index}]")
            elif field == "_values":
                self.lazy(a._values, b._values, where)
            else:
                assert getattr(a, field) == getattr(b, field), f"{where} {field}"

    def lazy(self, a, b, where: str) -> None:
        assert type(a) is type(b), where
        if isinstance(a, gs.ir.tensor.LazyValues):
            assert set(vars(a)) == set(vars(b)) and a.tensor is b.tensor, where
            assert (list(a.shape), a.dtype, a.nbytes) == (list(b.shape), b.dtype, b.nbytes), where
        else:
            np.testing.assert_array_equal(a, b)

    def values(self, a, b, where: str) -> None:
        assert type(a) is type(b), where
        if isinstance(a, gs.Graph):
            self.graphs(a, b, where)
        elif isinstance(a, gs.Tensor):
            self.tensors(a, b, where)
        elif isinstance(a, list):
            assert len(a) == len(b), where
            for x, y in zip(a, b):
                self.values(x, y, where)
        else:
            assert a == b, where


def assert_imports_alike(model: onnx.ModelProto) -> None:
    theirs, ours = gs.import_onnx(model), gs_import.import_model(model)
    _Pairing().graphs(theirs, ours)
    # gs.Graph shares the main graph's function list with every subgraph
    assert [sub._functions is theirs._functions for sub in theirs.subgraphs(recursive=True)] == [
        sub._functions is ours._functions for sub in ours.subgraphs(recursive=True)]


def _edge_cases() -> onnx.ModelProto:
    """Every attribute type gs imports, a Constant node's tensor, omitted optional inputs and
    outputs, a tensor described twice (the second entry completing the first), one described
    without a type, a symbolic and an unknown dim, a bfloat16 weight, a weight kept in external
    data, an initializer also listed as an input, a node domain and an empty one."""
    bf16 = numpy_helper.from_array(np.zeros((2,), np.float32), "bf")
    bf16.data_type, bf16.raw_data = TensorProto.BFLOAT16, b"\0" * 4
    external = numpy_helper.from_array(np.ones((3,), np.float32), "ext")
    external.data_location = TensorProto.EXTERNAL
    nodes = [
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.ones((4,), np.float32), "kv")),
        helper.make_node("Resize", ["x", "", "scales"], ["r"], mode="nearest", coordinate_transformation_mode="asymmetric"),
        helper.make_node("Dropout", ["r"], ["d", ""], seed=3),
        helper.make_node("Custom", ["d", "bf", "ext", "w"], ["y"], domain="my.ops", f=1.5, fs=[1.0, 2.0], i=2,
                         ints=[1, 2], s="text", strings=["a", "b"]),
        helper.make_node("Identity", ["y"], ["z"], domain=""),
    ]
    graph = helper.make_graph(
        nodes, "edges", [tensor("x", ["batch", 2, None, 4]), tensor("w", [4])], [tensor("z", None)],
        [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"), bf16, external,
         numpy_helper.from_array(np.zeros(4, np.float32), "w")],
        value_info=[helper.make_value_info("r", onnx.TypeProto()), tensor("d", None), tensor("d", [1, 2, 3, 8]),
                    tensor("scales", [4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("my.ops", 1)],
                             ir_version=IR_VERSION)


@pytest.mark.parametrize("build", [if_model, loop_model, scan_model, _edge_cases], ids=lambda build: build.__name__)
def test_hand_built_graphs_import_alike(build):
    assert_imports_alike(build())


@pytest.mark.parametrize("seed", range(12))
def test_random_graphs_import_alike(seed):
    builder, y = random_graph(seed)
    assert_imports_alike(builder.model([y]))


@pytest.mark.parametrize("source", ["seed000_subtracted_conv.py", "seed002_group_attention.py"])
def test_exported_sample_models_import_alike(source):
    from convexport.export import export_model
    from convexport.loading import load_model

    assert_imports_alike(export_model(load_model(str(SAMPLES / source))).model)


def test_an_optimized_model_imports_alike():
    import convexport

    optimized = convexport.optimize(str(FIXTURES / "small_net.py"), write=False, validate=False, profile=False).model
    assert_imports_alike(optimized)


def test_models_with_functions_or_sparse_weights_are_left_to_gs(monkeypatch):
    calls = []
    monkeypatch.setattr(gs, "import_onnx", lambda model: calls.append(model) or "gs")
    function = helper.make_function("my.fn", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                                    [helper.make_opsetid("", 18)])
    with_function = helper.make_model(
        helper.make_graph([helper.make_node("Twice", ["x"], ["y"], domain="my.fn")], "f", [tensor("x", [2])],
                          [tensor("y", [2])]),
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("my.fn", 1)], functions=[function],
        ir_version=IR_VERSION)
    sparse = make_model([helper.make_node("Add", ["x", "s"], ["y"])], [tensor("x", [2])], [tensor("y", [2])])
    sparse.graph.sparse_initializer.append(helper.make_sparse_tensor(
        numpy_helper.from_array(np.ones(1, np.float32), "s"), numpy_helper.from_array(np.array([0], np.int64)), [2]))
    assert gs_import.import_model(with_function) == "gs" and gs_import.import_model(sparse) == "gs"
    assert len(calls) == 2


def test_an_unknown_gs_layout_is_left_to_gs(monkeypatch):
    """Another onnx-graphsurgeon whose constructors set other fields: its own importer runs."""
    monkeypatch.setattr(gs_import, "_NODE_FIELDS", gs_import._NODE_FIELDS | {"extra"})
    gs_import.layout_is_known.cache_clear()
    try:
        assert not gs_import.layout_is_known()
        monkeypatch.setattr(gs, "import_onnx", lambda model: "gs")
        assert gs_import.import_model(make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [2])],
                                                 [tensor("y", [2])])) == "gs"
    finally:
        gs_import.layout_is_known.cache_clear()


def test_this_onnx_graphsurgeon_takes_the_fast_path():
    assert gs_import.layout_is_known()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.bool_, np.int8, np.int16, np.int32, np.int64,
                                   np.uint8, np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("shape", [(3, 2), (4,), (), (0, 3)])
def test_constant_values_reads_raw_data_as_gs_loads_it(dtype, shape):
    value = (np.arange(int(np.prod(shape))).reshape(shape) % 3).astype(dtype)
    proto = numpy_helper.from_array(value, "w")
    ours, theirs = (gs.Constant("w", gs.ir.tensor.LazyValues(proto)) for _ in range(2))
    loaded = gs_import.constant_values(ours)
    expected = theirs.values
    assert loaded.dtype == expected.dtype and loaded.shape == expected.shape and loaded.flags.writeable
    np.testing.assert_array_equal(loaded, expected)
    assert ours.values is loaded          # kept, as gs keeps what it loads


def test_constant_values_leaves_other_storage_to_gs():
    """Values in float_data (no raw bytes), a bfloat16 weight, an array already loaded."""
    typed = helper.make_tensor("f", TensorProto.FLOAT, [2], [1.5, -2.0])
    assert not typed.HasField("raw_data")
    np.testing.assert_array_equal(gs_import.constant_values(gs.Constant("f", gs.ir.tensor.LazyValues(typed))), [1.5, -2.0])
    bf16 = numpy_helper.from_array(np.zeros(2, np.float32), "b")
    bf16.data_type, bf16.raw_data = TensorProto.BFLOAT16, b"\0\0\x80\x3f"
    expected = gs.Constant("b", gs.ir.tensor.LazyValues(bf16)).values
    np.testing.assert_array_equal(gs_import.constant_values(gs.Constant("b", gs.ir.tensor.LazyValues(bf16))), expected)
    array = np.ones(3, np.float32)
    assert gs_import.constant_values(gs.Constant("a", array)) is array


def built_with(make_variable, make_constant, make_node):
    """x -> Conv(w, b) -> y -> Relu -> z, with one more reader of x made first by gs."""
    x = gs.Variable("x", np.float32, [1, 3, 4, 4])
    gs.Node("Relu", "early", {}, [x], [gs.Variable("early_out")])
    weight, bias = make_constant("w", np.ones([2, 3, 1, 1], np.float32)), make_constant("b", np.zeros(2, np.float32))
    y = make_variable("y", np.float32, [1, 2, 4, 4])
    conv = make_node("Conv", "conv", {"group": 1, "pads": [0, 0, 0, 0]}, [x, weight, bias], [y])
    make_node("Relu", "relu", {}, [y], [make_variable("z", None, None)])
    return conv


def test_new_objects_are_what_gs_constructors_make():
    ours = built_with(gs_import.new_variable, gs_import.new_constant, gs_import.new_node)
    theirs = built_with(gs.Variable, gs.Constant, gs.Node)
    pairing = _Pairing()
    pairing.nodes(ours, theirs, "conv")
    readers = [(node.name for node in tensor.outputs) for tensor in (ours.inputs[0], theirs.inputs[0])]
    assert list(readers[0]) == list(readers[1]) == ["early", "conv"]
    assert ours.outputs[0].outputs[0].name == "relu" and ours.outputs[0].outputs[0].inputs[0] is ours.outputs[0]
