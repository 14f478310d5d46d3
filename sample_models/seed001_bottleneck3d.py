"""Seed 001: the 3-D bottleneck and separable blocks from a V-Net speed/memory question.

``BottleNeckSeq`` is the poster's replacement for one 3x3x3 conv: Conv3d 1x1x1 (16->16) ->
Conv3d 3x3x3 padding 1 (16->16) -> Conv3d 1x1x1 (16->32), all with biases and no activation
between, followed by BatchNorm3d + ReLU. ``GroupSeq`` is the separable variant: depthwise Conv3d
3x3x3 (groups=in_channels) -> pointwise Conv3d 1x1x1, again followed by BatchNorm3d + ReLU (the
post's Sequential bodies are cut off after the convs; the norm + ReLU tail is taken from the
post's ``BottleNeck``/``CBR`` classes). Linear structure: three stacked convs + BN, and a
depthwise conv + 1x1 conv + BN, each a candidate to fold into one dense 3x3x3 conv. Caveat the
folder must respect: the first 1x1 has a bias and the 3x3x3 after it reads zero padding, so
1x1 -> 3x3x3 is exact only with a constant border correction (the 3x3x3 -> 1x1 fold and the
BN folds are always exact). BatchNorm statistics are randomized so BN folding is exercised.
Input 1x16x16x24x24, output 1x32x16x24x24.
"""

import torch
from torch import nn

SEED = 1
INPUT_SHAPE = (1, 16, 16, 24, 24)
OUTPUT_SHAPE = (1, 32, 16, 24, 24)

Norm = nn.BatchNorm3d


class BottleNeckSeq(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=1, N=2):
        super(BottleNeckSeq, self).__init__()
        self.seq = nn.Sequential(
            nn.Conv3d(in_channels=in_channels, out_channels=out_channels // N, kernel_size=1, stride=1),
            nn.Conv3d(in_channels=out_channels // N, out_channels=out_channels // N, kernel_size=kernel_size,
                      stride=stride, padding=padding),
            nn.Conv3d(in_channels=out_channels // N, out_channels=out_channels, kernel_size=1),
            Norm(out_channels),
            nn.ReLU(),
        )

    def forward(self, input):
        return self.seq(input)


class GroupSeq(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=1, N=2):
        super(GroupSeq, self).__init__()
        self.seq = nn.Sequential(
            nn.Conv3d(in_channels=in_channels, out_channels=in_channels, groups=in_channels,
                      kernel_size=kernel_size, stride=stride, padding=padding),
            nn.Conv3d(in_channels=in_channels, out_channels=out_channels, kernel_size=1),
            Norm(out_channels),
            nn.ReLU(),
        )

    def forward(self, input):
        return self.seq(input)


class Bottleneck3DNet(nn.Module):
    """BottleNeckSeq(16 -> 32) then GroupSeq(32 -> 32)."""

    def __init__(self, in_channels=16, out_channels=32):
        super().__init__()
        self.bottleneck = BottleNeckSeq(in_channels, out_channels, kernel_size=3, stride=1, padding=1)
        self.separable = GroupSeq(out_channels, out_channels, kernel_size=3, stride=1, padding=1)

    def forward(self, x):
        return self.separable(self.bottleneck(x))


def _randomize_batchnorm(module: nn.Module) -> None:
    """Non-trivial BN statistics and affine parameters (drawn from the global, seeded RNG)."""
    with torch.no_grad():
        for layer in module.modules():
            if isinstance(layer, nn.modules.batchnorm._BatchNorm):
                layer.running_mean.uniform_(-1.0, 1.0)
                layer.running_var.uniform_(0.5, 2.0)
                layer.weight.uniform_(0.5, 1.5)
                layer.bias.uniform_(-1.0, 1.0)


def example_inputs():
    generator = torch.Generator().manual_seed(SEED + 1)
    return (torch.randn(*INPUT_SHAPE, generator=generator),)


def build():
    torch.manual_seed(SEED)
    module = Bottleneck3DNet(16, 32)
    _randomize_batchnorm(module)
    return module.eval(), example_inputs()
