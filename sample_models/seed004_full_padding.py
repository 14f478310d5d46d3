"""Seed 004: two chained convs with "full" padding, from "How do I merge 2D convolutions in PyTorch?".

The model is ``Conv2d(1, 100, 3, padding=2)`` followed by ``Conv2d(100, 2, 5, padding=4)``:
padding ``k - 1`` is the mathematical "full" convolution of the answer, whose two kernels
(900 and 5000 weights) merge into one equivalent 1->2 7x7 kernel (98 weights) with padding 6.
Linear structure: conv -> conv with nothing between, the textbook conv-conv composition.
The seed used bias-free kernels; ``build()`` adds ``bias=True`` on both convs, which makes the
merge exact only with a constant border correction (the second conv reads positions of the
intermediate where conv1 would output its bias, not zero), while ``build_nobias()`` reproduces
the seed's bias-free kernels, for which the merge is exact with no correction.
Input 1x1x32x32, output 1x2x38x38.
"""

import torch
from torch import nn

SEED = 4
INPUT_SHAPE = (1, 1, 32, 32)
OUTPUT_SHAPE = (1, 2, 38, 38)   # 32 + 2 = 34, 34 + 4 = 38


class FullPaddingConvs(nn.Module):
    def __init__(self, bias=True):
        super().__init__()
        out1, in1, s1 = (100, 1, 3)
        out2, in2, s2 = (2, 100, 5)
        self.conv1 = nn.Conv2d(in1, out1, s1, padding=s1 - 1, bias=bias)
        self.conv2 = nn.Conv2d(in2, out2, s2, padding=s2 - 1, bias=bias)

    def forward(self, x):
        return self.conv2(self.conv1(x))


def example_inputs():
    generator = torch.Generator().manual_seed(SEED + 1)
    return (torch.randn(*INPUT_SHAPE, generator=generator),)


def build():
    torch.manual_seed(SEED)
    return FullPaddingConvs(bias=True).eval(), example_inputs()


def build_nobias():
    torch.manual_seed(SEED)
    return FullPaddingConvs(bias=False).eval(), example_inputs()
