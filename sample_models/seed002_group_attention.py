"""Seed 002: a serial multi-group attention head with per-class FC layers (GPU-parallelization notes).

The seed's "old serial format", scaled down (2048 -> 512 channels becomes 256 -> 64): a 1x1
reduce ``BasicConv`` (conv + BN + ReLU), then ``groups=12`` ``Parallel_AttentionBottleneck``
branches built in a Python loop (conv1x1-BN-ReLU-conv3x3-BN-ReLU-conv1x1(expand 2)-BN, + residual,
ReLU), all reading the same tensor; the seed's repeated-concat residual (``residual =
torch.cat((residual, x), dim=1)`` in a loop: 12 copies of x, i.e. 11 Concat nodes) is added to
the 12 branch outputs concatenated along channels, which are split back per group and each
global-max-pooled (``AdaptiveMaxPool2d(1)`` + ``.view(B, C)``) and stacked to [B, 12, C]; then
per-class ``nn.Linear`` layers in a nested loop over groups with unequal ``nclasses_per_group``
reading ``x[:, i, :]`` (stacked to [B, 17, class_channels]) and a second per-class
``nn.Linear(class_channels, 1)`` loop over ``h[:, i, :]`` concatenated to [B, 17]. Linear
structure: BN after every conv (fold), 12 parallel branches on one input (the first 1x1 convs
merge into one conv + Split, the rest become grouped convs with groups=12), a tensor
concatenated with itself (-> Tile/Expand), and two grouped-FC patterns of Gather + Gemm
(-> one Einsum / batched MatMul each). BatchNorm statistics are randomized.
Input 2x256x14x14, output 2x17.
"""

import torch
from torch import nn

SEED = 2
INPUT_SHAPE = (2, 256, 14, 14)
IN_CHANNELS = 256
GROUPS = 12
GROUP_CHANNELS = 64
CLASS_CHANNELS = 16
NCLASSES_PER_GROUP = [1, 2, 1, 3, 1, 1, 2, 1, 1, 2, 1, 1]
NCLASSES = sum(NCLASSES_PER_GROUP)   # 17
OUTPUT_SHAPE = (INPUT_SHAPE[0], NCLASSES)


class BasicConv(nn.Module):
    """The seed's ``utils.BasicConv`` (CBAM style): conv (no bias) + BN + ReLU."""

    def __init__(self, in_planes, out_planes, kernel_size, stride=1, padding=0):
        super().__init__()
        self.conv = nn.Conv2d(in_planes, out_planes, kernel_size, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(out_planes)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


class Parallel_AttentionBottleneck(nn.Module):
    """As in the seed (channel/spatial attention lines were commented out there too)."""

    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        # inplanes is group_channels, planes = group_channels // 2
        super(Parallel_AttentionBottleneck, self).__init__()
        expand = 2
        self.conv1 = nn.Conv2d(inplanes, planes, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * expand, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * expand)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        residual = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        out = self.relu(out)
        out = self.conv3(out)
        out = self.bn3(out)
        if self.downsample is not None:
            residual = self.downsample(x)
        out += residual
        out = self.relu(out)
        return out


class GroupAttentionHead(nn.Module):
    def __init__(self, in_channels=IN_CHANNELS, groups=GROUPS, group_channels=GROUP_CHANNELS,
                 class_channels=CLASS_CHANNELS, nclasses_per_group=NCLASSES_PER_GROUP):
        super().__init__()
        self.groups = groups
        self.group_channels = group_channels
        self.nclasses_per_group = list(nclasses_per_group)
        self.nclasses = sum(self.nclasses_per_group)
        self.reduce_conv = BasicConv(in_planes=in_channels, out_planes=group_channels, kernel_size=1)
        self.attention_convs = nn.ModuleList(
            [Parallel_AttentionBottleneck(group_channels, group_channels // 2) for _ in range(groups)])
        self.gmp = nn.AdaptiveMaxPool2d(1)
        self.class_fcs = nn.ModuleList(
            [nn.Linear(group_channels, class_channels) for _ in range(self.nclasses)])
        self.fcs = nn.ModuleList(
            [nn.Linear(in_features=class_channels, out_features=1) for _ in range(self.nclasses)])

    def forward(self, x):
        # [B, 256, 14, 14] -> [B, group_channels, 14, 14]
        x = self.reduce_conv(x)

        # the seed's repeated-concat residual: [B, groups * group_channels, 14, 14]
        for group_idx in range(self.groups):
            if group_idx == 0:
                residual = x
            else:
                residual = torch.cat((residual, x), dim=1)

        # serial branches, concatenated along channels, plus the repeated residual
        branches = [self.attention_convs[i](x) for i in range(self.groups)]
        y = torch.cat(branches, dim=1) + residual

        # per-group global max pooling, stacked: [B, groups, group_channels]
        temp = []
        for y_i in torch.split(y, self.group_channels, dim=1):
            y_i = self.gmp(y_i).view(y_i.size(0), y_i.size(1))
            temp.append(y_i)
        x = torch.stack(temp, dim=1)

        # per-class FCs over the groups, unequal classes per group: [B, nclasses, class_channels]
        count = 0
        outside = []
        for i in range(self.groups):
            inside = []
            for j in range(self.nclasses_per_group[i]):
                inside.append(self.class_fcs[count](x[:, i, :]))  # [B, C]
                count += 1
            inside = torch.stack(inside, dim=1)  # [B, N, C]
            outside.append(inside)
        h = torch.cat(outside, dim=1)  # [B, nclasses, class_channels]

        # one scalar per class: [B, nclasses]
        return torch.cat([self.fcs[i](h[:, i, :]) for i in range(self.nclasses)], dim=1)


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
    module = GroupAttentionHead()
    _randomize_batchnorm(module)
    return module.eval(), example_inputs()
