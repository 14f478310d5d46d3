"""Seed 003: a bank of three 135x135 filters on 1-channel images (TensorFlow memory question).

The model is a single bias-free ``nn.Conv2d(1, 3, 135)`` with valid padding, the PyTorch
equivalent of the seed's ``tf.nn.conv2d(images, filters[135,135,1,3], padding="VALID")``.
Linear structure: one conv whose kernel area (18225 taps) is huge, so im2col/direct
convolution is memory- and compute-hungry; convexport should be able to turn it into an FFT
convolution (ONNX DFT) or a separable sum when the kernel has low exact rank. The random
kernels here are full rank, so FFT is the applicable rewrite. ``build()`` uses the seed's image
size (batch 2 of 1x321x481 -> 2x3x187x347; the seed used 200 frames); ``build_small()`` gives
1x1x160x200 -> 1x3x26x66 for fast tests.
"""

import torch
from torch import nn

SEED = 3
KERNEL = 135
INPUT_SHAPE = (2, 1, 321, 481)
OUTPUT_SHAPE = (2, 3, 321 - KERNEL + 1, 481 - KERNEL + 1)        # (2, 3, 187, 347)
SMALL_INPUT_SHAPE = (1, 1, 160, 200)
SMALL_OUTPUT_SHAPE = (1, 3, 160 - KERNEL + 1, 200 - KERNEL + 1)  # (1, 3, 26, 66)


class LargeKernelBank(nn.Module):
    """Three 135x135 filters, valid padding, no bias."""

    def __init__(self, filters=3, kernel=KERNEL):
        super().__init__()
        self.conv = nn.Conv2d(1, filters, kernel, bias=False)

    def forward(self, x):
        return self.conv(x)


def _make_module() -> nn.Module:
    torch.manual_seed(SEED)
    return LargeKernelBank().eval()


def _inputs(shape):
    generator = torch.Generator().manual_seed(SEED + 1)
    return (torch.randn(*shape, generator=generator),)


def example_inputs():
    return _inputs(INPUT_SHAPE)


def example_inputs_small():
    return _inputs(SMALL_INPUT_SHAPE)


def build():
    return _make_module(), example_inputs()


def build_small():
    return _make_module(), example_inputs_small()
