"""Made-up inputs sized where the model is defined (load/input_domains.py): an image's channels and
spatial dims read from the Conv that takes it, a waveform's samples from its stack of strided
convs."""

from __future__ import annotations

import numpy as np
import onnx
from helpers import invoke, make_model, tensor
from onnx import helper

import convexport
from convexport.load.input_domains import conv_reads, sized_by_running, sized_for_data
from convexport.load.inputs import InputSpec
from convexport.load.onnx_route import graph_input_specs

# Wav2Vec2's feature extractor: kernels and strides of its seven convs (400 samples make a frame)
WAV2VEC2_CONVS = ((10, 5), (3, 2), (3, 2), (3, 2), (3, 2), (2, 2), (2, 2))


def waveform_model(axes_as_constant_node: bool = True) -> onnx.ModelProto:
    """input_values (batch x samples) -> Unsqueeze(1) -> Wav2Vec2's seven convs with Relus
    between -> the frames' mean."""
    rng = np.random.default_rng(0)
    weights, nodes, current, channels = {}, [], "with_channel", 1
    if axes_as_constant_node:
        nodes.append(helper.make_node("Constant", [], ["axes"], value=onnx.numpy_helper.from_array(np.array([1]))))
    else:
        weights["axes"] = np.array([1])
    nodes.append(helper.make_node("Unsqueeze", ["input_values", "axes"], ["with_channel"]))
    for number, (kernel, stride) in enumerate(WAV2VEC2_CONVS):
        weights[f"w{number}"] = rng.normal(0, 0.5, (4, channels, kernel)).astype(np.float32)
        nodes.append(helper.make_node("Conv", [current, f"w{number}"], [f"c{number}"], strides=[stride]))
        nodes.append(helper.make_node("Relu", [f"c{number}"], [f"r{number}"]))
        current, channels = f"r{number}", 4
    nodes.append(helper.make_node("ReduceMean", [current], ["y"], keepdims=0, axes=[2]))
    return make_model(nodes, [tensor("input_values", ["batch", "samples"])], [tensor("y", ["batch", 4])], weights,
                      opset=17)  # fmt: skip


def test_a_waveform_is_made_up_long_enough_for_its_strided_convs():
    model = waveform_model()
    (spec,) = sized_by_running(model, graph_input_specs(model))
    samples = spec.dims[1]
    assert isinstance(samples, int) and 400 <= samples < 500, spec  # 400 is the fewest that run
    assert spec.dims[0] == "batch"  # the batch is not the Conv's to size


def test_a_waveform_model_is_optimized_and_validated_without_inputs_given(tmp_path):
    for constant_node in (True, False):
        path = tmp_path / f"audio{constant_node}.onnx"
        onnx.save(waveform_model(constant_node), path)
        result = convexport.optimize(str(path), output=str(tmp_path / "out.onnx"), profile=False)
        assert result.report["validation"]["passed"]


def test_the_command_line_runs_a_waveform_model(tmp_path):
    onnx.save(waveform_model(), tmp_path / "audio.onnx")
    done = invoke("optimize", tmp_path / "audio.onnx", "--no-profile", "-q")
    assert done.exit_code == 0, done.output


def test_an_unsqueeze_that_adds_a_trailing_dim_is_not_read_as_a_waveforms_channel():
    """[batch, channels, length] -> [.., length, 1] for a Conv2d of (k, 1) kernels: the input's
    last dim is not the Conv's last spatial dim, so nothing is read from that Conv."""
    weights = {"axes": np.array([3]), "w": np.ones((2, 3, 5, 1), np.float32)}
    nodes = [helper.make_node("Unsqueeze", ["x", "axes"], ["x4"]), helper.make_node("Conv", ["x4", "w"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, 3, "length"])], [tensor("y", None)], weights, opset=17)
    assert conv_reads(model) == {}


def test_a_position_table_fixes_the_image_size_at_an_exact_multiple_of_the_stride():
    """A ViT's patch count is fixed by its position table: only 224 (14 patches of 16) runs."""
    weights = {"w": np.ones((8, 3, 16, 16), np.float32)}
    nodes = [helper.make_node("Conv", ["pixel_values", "w"], ["p"], strides=[16, 16])]
    model = make_model(nodes, [tensor("pixel_values", ["b", "c", "h", "w"])], [tensor("p", None)], weights)
    tried = []

    def run(feeds):
        tried.append(feeds["pixel_values"].shape)
        if feeds["pixel_values"].shape[2:] != (224, 224):
            raise RuntimeError("position table of 196 patches")

    (spec,) = sized_for_data(model, [InputSpec("pixel_values", ("b", "c", "h", "w"))], run)
    assert spec.dims == ("b", 3, 224, 224)
    assert max(shape[2] for shape in tried) == 224  # nothing larger was made up


def test_an_image_that_runs_at_no_size_is_left_as_given_after_the_linear_multiples():
    """Past 64 multiples of the stride only a one-dim signal is tried further (an image that
    large would be gigabytes of made-up data)."""
    weights = {"w": np.ones((8, 3, 16, 16), np.float32)}
    nodes = [helper.make_node("Conv", ["pixel_values", "w"], ["p"], strides=[16, 16])]
    model = make_model(nodes, [tensor("pixel_values", ["b", 3, "h", "w"])], [tensor("p", None)], weights)
    tried = []

    def run(feeds):
        tried.append(feeds["pixel_values"].shape)
        raise RuntimeError("never")

    (spec,) = sized_for_data(model, [InputSpec("pixel_values", ("b", 3, "h", "w"))], run)
    assert spec.dims == ("b", 3, "h", "w")
    assert max(shape[2] for shape in tried) == 64 * 16
