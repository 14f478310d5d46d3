"""Networks whose exports carry shape arithmetic, written from their papers' block diagrams for
bench/export_routes.py (no code of timm or the authors' repositories): what the TorchScript
exporter turns `x.shape`, `view`, `chunk` and `flatten` into when it is not told to fold
constants, and what dynamo writes for the same Python.

- EfficientViT-M (MSRA): cascaded group attention, each head fed the previous head's output
  plus its own chunk, q through a depthwise conv, every reshape computed from `x.shape`; the
  attention runs in local windows, partitioned with `view`/`permute` from `x.shape` too; a
  BN1d -> Linear head.
- GhostNetV3: ghost modules whose primary and cheap convs each train as several conv-BN
  branches plus a BN identity and a 1x1 scale branch (re-parameterised to one conv each).
- ShuffleNetV2: channel split, a conv-BN branch, concatenation and the channel shuffle
  (`view(B, 2, C/2, H, W).transpose(1, 2).reshape(B, C, H, W)` from `x.shape`).

Every factory returns (model, example_inputs) at 1x3x64x64, in eval mode with random BN
statistics; `family_blocks.reparameterized(model)` gives the hand-fused form.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from family_blocks import (
    CLASSES,
    BNLinear,
    ConvBN,
    Reparameterizable,
    built,
    conv_with,
    identity_bn_kernel,
    summed,
)

# ---------------------------------------------------------------------------------------------
# EfficientViT-M


class CascadedGroupAttention(nn.Module):
    """Heads in a cascade: head i reads its chunk of the channels plus head i-1's output."""

    def __init__(self, dim: int, key_dim: int, heads: int, resolution: int):
        super().__init__()
        self.heads, self.key_dim, self.value_dim = heads, key_dim, dim // heads
        self.scale = key_dim**-0.5
        self.qkvs = nn.ModuleList(ConvBN(dim // heads, 2 * key_dim + self.value_dim, 1) for _ in range(heads))
        self.dws = nn.ModuleList(ConvBN(key_dim, key_dim, 5, groups=key_dim) for _ in range(heads))
        self.proj = nn.Sequential(nn.ReLU(), ConvBN(self.value_dim * heads, dim, 1))
        self.attention_bias = nn.Parameter(torch.randn(heads, resolution**2, resolution**2) * 0.1)

    def forward(self, x):
        batch, _, height, width = x.shape
        chunks = x.chunk(self.heads, dim=1)
        outputs, feature = [], chunks[0]
        for index, (qkv, dw) in enumerate(zip(self.qkvs, self.dws)):
            if index > 0:
                feature = feature + chunks[index]
            feature = qkv(feature)
            q, k, v = feature.view(batch, -1, height, width).split([self.key_dim, self.key_dim, self.value_dim], dim=1)
            q, k, v = dw(q).flatten(2), k.flatten(2), v.flatten(2)
            attention = (q.transpose(-2, -1) @ k) * self.scale + self.attention_bias[index]
            feature = (v @ attention.softmax(dim=-1).transpose(-2, -1)).view(batch, self.value_dim, height, width)
            outputs.append(feature)
        return self.proj(torch.cat(outputs, dim=1))


class LocalWindowAttention(nn.Module):
    """The attention inside windows of `window` x `window` tokens: partitioned from x.shape."""

    def __init__(self, dim: int, key_dim: int, heads: int, window: int):
        super().__init__()
        self.window = window
        self.attention = CascadedGroupAttention(dim, key_dim, heads, window)

    def forward(self, x):
        batch, channels, height, width = x.shape
        w = self.window
        rows, cols = height // w, width // w
        windows = x.permute(0, 2, 3, 1).view(batch, rows, w, cols, w, channels).transpose(2, 3)
        windows = windows.reshape(batch * rows * cols, w, w, channels).permute(0, 3, 1, 2)
        out = self.attention(windows).permute(0, 2, 3, 1).view(batch, rows, cols, w, w, channels)
        return out.transpose(2, 3).reshape(batch, height, width, channels).permute(0, 3, 1, 2)


class Residual(nn.Module):
    def __init__(self, body: nn.Module):
        super().__init__()
        self.body = body

    def forward(self, x):
        return x + self.body(x)


def ffn(dim: int, hidden: int) -> nn.Module:
    return Residual(nn.Sequential(ConvBN(dim, hidden, 1), nn.ReLU(), ConvBN(hidden, dim, 1)))


class EfficientViTBlock(nn.Sequential):
    """Depthwise conv-BN residual, FFN, local window attention, depthwise conv-BN residual, FFN."""

    def __init__(self, dim: int, key_dim: int, heads: int, window: int):
        super().__init__(
            Residual(ConvBN(dim, dim, 3, groups=dim)),
            ffn(dim, 2 * dim),
            Residual(LocalWindowAttention(dim, key_dim, heads, window)),
            Residual(ConvBN(dim, dim, 3, groups=dim)),
            ffn(dim, 2 * dim),
        )


class PooledBNLinear(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.head = BNLinear(channels, CLASSES)

    def forward(self, x):
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def efficientvit_m():
    torch.manual_seed(9)
    stem = [ConvBN(3, 16, 3, 2), nn.ReLU(), ConvBN(16, 32, 3, 2), nn.ReLU(), ConvBN(32, 64, 3, 2)]
    blocks = [EfficientViTBlock(64, 16, 4, window=4), EfficientViTBlock(64, 16, 4, window=4)]
    return built(nn.Sequential(*stem, *blocks, PooledBNLinear(64)), seed=9)


# ---------------------------------------------------------------------------------------------
# GhostNetV3


class RepConvBN(Reparameterizable):
    """`branches` conv-BN of one kernel size, a 1x1 conv-BN scale branch (for kernels over 1)
    and a BN identity (where the shape allows), summed: GhostNetV3's re-parameterisable conv."""

    def __init__(self, cin: int, cout: int, size: int, groups: int = 1, branches: int = 3):
        super().__init__()
        self.convs = nn.ModuleList(ConvBN(cin, cout, size, groups=groups) for _ in range(branches))
        self.scale = ConvBN(cin, cout, 1, groups=groups) if size > 1 else None
        self.skip = nn.BatchNorm2d(cin) if cin == cout else None
        self.size, self.groups = size, groups

    def train_forward(self, x):
        y = sum(conv(x) for conv in self.convs)
        if self.scale is not None:
            y = y + self.scale(x)
        return y + self.skip(x) if self.skip is not None else y

    def fuse(self) -> nn.Module:
        pairs = [conv.kernel_bias() for conv in self.convs]
        if self.scale is not None:
            kernel, bias = self.scale.kernel_bias()
            pad = self.size // 2
            pairs.append((F.pad(kernel, (pad, pad, pad, pad)), bias))
        if self.skip is not None:
            pairs.append(identity_bn_kernel(self.skip, self.groups, self.size))
        return conv_with(self.convs[0].conv, *summed(pairs))


class GhostModuleV3(nn.Module):
    """Primary 1x1 RepConvBN (ReLU), cheap depthwise 3x3 RepConvBN of it (ReLU), concatenated."""

    def __init__(self, cin: int, cout: int, relu: bool):
        super().__init__()
        width = cout // 2
        self.primary = RepConvBN(cin, width, 1)
        self.cheap = RepConvBN(width, width, 3, groups=width)
        self.act = nn.ReLU() if relu else nn.Identity()

    def forward(self, x):
        primary = self.act(self.primary(x))
        return torch.cat([primary, self.act(self.cheap(primary))], dim=1)


class GhostBottleneckV3(nn.Module):
    def __init__(self, cin: int, mid: int, cout: int, stride: int):
        super().__init__()
        self.ghost1 = GhostModuleV3(cin, mid, relu=True)
        self.down = RepConvBN(mid, mid, 3, groups=mid) if stride == 1 else ConvBN(mid, mid, 3, stride, groups=mid)
        self.ghost2 = GhostModuleV3(mid, cout, relu=False)
        self.shortcut = (nn.Identity() if cin == cout and stride == 1 else
                         nn.Sequential(ConvBN(cin, cin, 3, stride, groups=cin), ConvBN(cin, cout, 1)))

    def forward(self, x):
        return self.ghost2(self.down(self.ghost1(x))) + self.shortcut(x)


class Classifier(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.linear = nn.Linear(channels, CLASSES)

    def forward(self, x):
        return self.linear(F.adaptive_avg_pool2d(x, 1).flatten(1))


def ghostnet_v3():
    torch.manual_seed(10)
    stem = [ConvBN(3, 16, 3, 2), nn.ReLU()]
    shapes = [(16, 16, 16, 1), (16, 48, 24, 2), (24, 72, 24, 1), (24, 72, 40, 2), (40, 120, 40, 1)]
    return built(nn.Sequential(*stem, *(GhostBottleneckV3(*shape) for shape in shapes), Classifier(40)), seed=10)


# ---------------------------------------------------------------------------------------------
# ShuffleNetV2


def channel_shuffle(x: torch.Tensor, groups: int = 2) -> torch.Tensor:
    batch, channels, height, width = x.shape
    x = x.view(batch, groups, channels // groups, height, width).transpose(1, 2)
    return x.reshape(batch, channels, height, width)


class ShuffleUnit(nn.Module):
    """Stride 1: half the channels pass, the other half through 1x1 / depthwise 3x3 / 1x1
    conv-BN; stride 2: both halves transformed from the whole input. Then the shuffle."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        half = cout // 2
        self.stride = stride
        branch_in = cin if stride > 1 else half
        self.branch = nn.Sequential(ConvBN(branch_in, half, 1), nn.ReLU(), ConvBN(half, half, 3, stride, groups=half),
                                    ConvBN(half, half, 1), nn.ReLU())
        self.down = (nn.Sequential(ConvBN(cin, cin, 3, stride, groups=cin), ConvBN(cin, half, 1), nn.ReLU())
                     if stride > 1 else None)

    def forward(self, x):
        if self.down is None:
            kept, moved = x.chunk(2, dim=1)
            return channel_shuffle(torch.cat([kept, self.branch(moved)], dim=1))
        return channel_shuffle(torch.cat([self.down(x), self.branch(x)], dim=1))


def shufflenet_v2():
    torch.manual_seed(11)
    stem = [ConvBN(3, 24, 3, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    units = [ShuffleUnit(24, 48, 2), ShuffleUnit(48, 48, 1), ShuffleUnit(48, 96, 2), ShuffleUnit(96, 96, 1)]
    return built(nn.Sequential(*stem, *units, ConvBN(96, 128, 1), nn.ReLU(), Classifier(128)), seed=11)


FAMILIES = {
    "EfficientViT-M": efficientvit_m,
    "GhostNetV3": ghostnet_v3,
    "ShuffleNetV2": shufflenet_v2,
}
