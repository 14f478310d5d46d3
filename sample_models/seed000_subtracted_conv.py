"""Seed 000: the ``SubtractedConv`` block from a forum post about replacing ResNet-50's convs.

Each block is, exactly as the poster wrote it, a strided bias-free 1x1 pointwise conv ``p``, a
depthwise KxK conv on ``p`` from which ``p`` is subtracted in place (``d -= p``), a full KxK
"low-pass" conv on ``p``, and a channel concat ``cat(d, l)``. The whole block is linear: it is
``[concat(D - I, L)] o P`` applied to ``x``, so it folds into ONE dense KxK conv on ``x`` (for the
stride-2 block, a stride-2 conv with a dilation-2 KxK window, since the strided 1x1 comes first).
The composition is exact because the pointwise conv is an unpadded, bias-free 1x1. The sample
net stacks two blocks (stride 1, then stride 2) with a ReLU between, so the best result is two
convs and one ReLU; input 1x16x56x56, output 1x32x28x28.
"""

import torch
from torch import nn

SEED = 0
INPUT_SHAPE = (1, 16, 56, 56)
OUTPUT_SHAPE = (1, 32, 28, 28)


class SubtractedConv(nn.Module):
    """Verbatim from the seed (PyTorch 0.4-era code, unchanged)."""

    def __init__(self, input_ch, output_ch, kernels, stride=1):
        super().__init__()
        self.point_wise = nn.Conv2d(input_ch, output_ch // 2, 1, bias=False, stride=stride)
        self.depth_wise = nn.Conv2d(output_ch // 2, output_ch // 2, kernels, groups=output_ch // 2,
                                    bias=False, padding=kernels // 2)
        self.low_pass = nn.Conv2d(output_ch // 2, output_ch // 2, kernels, bias=False,
                                  padding=kernels // 2)

    def forward(self, x):
        p = self.point_wise(x)
        d = self.depth_wise(p)
        d -= p
        l = self.low_pass(p)
        x = torch.cat((d, l), 1)
        return x


class SubtractedConvNet(nn.Module):
    """Two SubtractedConv blocks (stride 1, stride 2) with a ReLU between."""

    def __init__(self, input_ch=16, output_ch=32, kernels=3):
        super().__init__()
        self.block1 = SubtractedConv(input_ch, output_ch, kernels, stride=1)
        self.relu = nn.ReLU()
        self.block2 = SubtractedConv(output_ch, output_ch, kernels, stride=2)

    def forward(self, x):
        return self.block2(self.relu(self.block1(x)))


def example_inputs():
    generator = torch.Generator().manual_seed(SEED + 1)
    return (torch.randn(*INPUT_SHAPE, generator=generator),)


def build():
    torch.manual_seed(SEED)
    module = SubtractedConvNet(16, 32, 3)
    return module.eval(), example_inputs()
