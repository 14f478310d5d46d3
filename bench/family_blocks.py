"""Small networks from eight re-parameterisable families, written from their papers' block
diagrams for bench/families.py (no code of timm or the authors' repositories).

Each network is built in its training form: BatchNorm after every conv or linear that has one in
the family, the parallel branches the family trains with, random non-trivial BatchNorm
statistics and affine parameters (a BatchNorm at its initial values folds to nothing and proves
nothing), in eval mode. `reparameterized(model)` gives the hand-fused inference form, built in
torch the way each family's own deploy code does it: conv+BN fused, parallel branches summed
into one kernel, identity branches as centred identity kernels, BN1d folded into the Linear
beside it. Where a family's deploy code leaves a conv+BN pair alone (FastViT's ConvFFN, GhostNet,
EfficientViT, which rely on the runtime to fuse it), the hand form fuses it too, as
torch.nn.utils.fuse_conv_bn_eval would: the strongest hand form, not the weakest.

Every factory returns (model, example_inputs) like the factories convexport loads, at
1x3x64x64.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

INPUT_SHAPE = (1, 3, 64, 64)
CLASSES = 10


# ---------------------------------------------------------------------------------------------
# Algebra shared by the families: every branch as a (kernel, bias) pair of a plain conv.


def bn_scale_shift(bn: nn.BatchNorm1d | nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """The eval-mode BN as y = x * scale + shift, per channel."""
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    return scale, bn.bias - bn.running_mean * scale


def fold_bn(kernel: torch.Tensor, bias: torch.Tensor | None, bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """The conv (kernel, bias) followed by `bn`, as one conv's (kernel, bias)."""
    scale, shift = bn_scale_shift(bn)
    bias = torch.zeros_like(shift) if bias is None else bias
    return kernel * scale.reshape(-1, 1, 1, 1), bias * scale + shift


def identity_kernel(channels: int, groups: int, size: int) -> torch.Tensor:
    """The kernel of a grouped `size`x`size` conv that copies its input (a 1 at each channel's
    own position within its group, at the centre)."""
    per_group = channels // groups
    kernel = torch.zeros(channels, per_group, size, size)
    for channel in range(channels):
        kernel[channel, channel % per_group, size // 2, size // 2] = 1.0
    return kernel


def centred(kernel: torch.Tensor, size: int) -> torch.Tensor:
    """A smaller odd kernel zero-padded to `size`x`size` around its centre (same output grid
    when the conv's padding is size // 2)."""
    pad = (size - kernel.shape[-1]) // 2
    return F.pad(kernel, [pad] * 4)


def conv_with(like: nn.Conv2d, kernel: torch.Tensor, bias: torch.Tensor) -> nn.Conv2d:
    """A conv with `like`'s stride and groups, the given kernel and bias, padded to keep the
    output grid of a centred kernel."""
    size = kernel.shape[-1]
    conv = nn.Conv2d(kernel.shape[1] * like.groups, kernel.shape[0], size, like.stride, size // 2, groups=like.groups)
    conv.weight.data, conv.bias.data = kernel.detach().clone(), bias.detach().clone()
    return conv


def summed(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Parallel branches (kernel, bias) as one: kernels centred on the largest and added."""
    size = max(kernel.shape[-1] for kernel, _ in pairs)
    return sum(centred(kernel, size) for kernel, _ in pairs), sum(bias for _, bias in pairs)


def randomize_statistics(model: nn.Module, seed: int) -> nn.Module:
    """Non-trivial statistics and affine parameters in every BatchNorm and random layer scales,
    so that every fold changes numbers; returns the model in eval mode."""
    generator = torch.Generator().manual_seed(seed)

    def uniform(tensor, low, high):
        tensor.data.copy_(torch.rand(tensor.shape, generator=generator) * (high - low) + low)

    for module in model.modules():
        if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
            uniform(module.running_mean, -0.5, 0.5)
            uniform(module.running_var, 0.5, 2.0)
            uniform(module.weight, 0.5, 1.5)
            uniform(module.bias, -0.5, 0.5)
        for name, parameter in module.named_parameters(recurse=False):
            if name.startswith("layer_scale"):  # initialised tiny in training; trained ones are not
                uniform(parameter, 0.1, 1.0)
    return model.eval()


# ---------------------------------------------------------------------------------------------
# The training/inference switch.


class Reparameterizable(nn.Module):
    """A block with a training form (`train_forward`) and a fused inference form (`fuse()`, a
    module computing the whole block). `reparameterize()` swaps one for the other in place and
    drops the training branches, as the families' own deploy code does."""

    def __init__(self):
        super().__init__()
        self.fused = None

    def forward(self, x):
        return self.train_forward(x) if self.fused is None else self.fused(x)

    def train_forward(self, x):
        raise NotImplementedError

    def fuse(self) -> nn.Module:
        raise NotImplementedError

    def reparameterize(self) -> None:
        with torch.no_grad():
            fused = self.fuse()
        for name in list(self._modules) + list(self._parameters):
            delattr(self, name)
        self.fused = fused


def reparameterized(model: nn.Module) -> nn.Module:
    """A copy of `model` in its hand-fused inference form: every outermost Reparameterizable
    block fuses its whole subtree."""
    deploy = copy.deepcopy(model)

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if isinstance(child, Reparameterizable):
                child.reparameterize()
            else:
                visit(child)

    visit(deploy)
    return deploy.eval()


class ConvBN(Reparameterizable):
    """Conv (no bias) then BatchNorm: timm's ConvNormAct without the act, LeViT's Conv2d_BN."""

    def __init__(self, cin: int, cout: int, size: int, stride: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, size, stride, size // 2, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def train_forward(self, x):
        return self.bn(self.conv(x))

    def kernel_bias(self) -> tuple[torch.Tensor, torch.Tensor]:
        return fold_bn(self.conv.weight, None, self.bn)

    def fuse(self) -> nn.Module:
        return conv_with(self.conv, *self.kernel_bias())


def identity_bn_kernel(bn: nn.BatchNorm2d, groups: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An identity branch through `bn` as a grouped conv's (kernel, bias)."""
    return fold_bn(identity_kernel(bn.num_features, groups, size), None, bn)


class LinearBN(Reparameterizable):
    """LeViT's Linear_BN: a bias-free Linear, then BatchNorm1d over the tokens of every image
    (applied on flatten(0, 1), reshaped back)."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.linear = nn.Linear(cin, cout, bias=False)
        self.bn = nn.BatchNorm1d(cout)

    def train_forward(self, x):
        y = self.linear(x)
        return self.bn(y.flatten(0, 1)).reshape_as(y)

    def fuse(self) -> nn.Module:
        scale, shift = bn_scale_shift(self.bn)
        linear = nn.Linear(self.linear.in_features, self.linear.out_features)
        linear.weight.data, linear.bias.data = (self.linear.weight * scale[:, None]).detach(), shift.detach()
        return linear


class BNLinear(Reparameterizable):
    """BatchNorm1d then Linear: the classifier heads of LeViT and RepViT."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.bn = nn.BatchNorm1d(cin)
        self.linear = nn.Linear(cin, cout)

    def train_forward(self, x):
        return self.linear(self.bn(x))

    def weight_bias(self) -> tuple[torch.Tensor, torch.Tensor]:
        scale, shift = bn_scale_shift(self.bn)
        return self.linear.weight * scale[None, :], self.linear.bias + self.linear.weight @ shift

    def fuse(self) -> nn.Module:
        return linear_with(*self.weight_bias())


def linear_with(weight: torch.Tensor, bias: torch.Tensor) -> nn.Linear:
    linear = nn.Linear(weight.shape[1], weight.shape[0])
    linear.weight.data, linear.bias.data = weight.detach().clone(), bias.detach().clone()
    return linear


class Classifier(nn.Module):
    """Global average pool, then a Linear: the plain head of RepVGG, MobileOne, FastViT, the
    Ghost nets."""

    def __init__(self, channels: int):
        super().__init__()
        self.linear = nn.Linear(channels, CLASSES)

    def forward(self, x):
        return self.linear(x.mean(dim=(2, 3)))


def example_inputs() -> tuple[torch.Tensor]:
    return (torch.randn(*INPUT_SHAPE, generator=torch.Generator().manual_seed(7)),)


def built(model: nn.Module, seed: int):
    """The factory's answer: the model with random statistics, in eval mode, and its inputs."""
    return randomize_statistics(model, seed), example_inputs()


# ---------------------------------------------------------------------------------------------
# RepVGG: 3x3 conv-BN + 1x1 conv-BN + identity BN, summed, ReLU.


class RepVGGBlock(Reparameterizable):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.dense = ConvBN(cin, cout, 3, stride)
        self.point = ConvBN(cin, cout, 1, stride)
        self.skip = nn.BatchNorm2d(cin) if cin == cout and stride == 1 else None

    def train_forward(self, x):
        y = self.dense(x) + self.point(x)
        if self.skip is not None:
            y = y + self.skip(x)
        return F.relu(y)

    def fuse(self) -> nn.Module:
        pairs = [self.dense.kernel_bias(), self.point.kernel_bias()]
        if self.skip is not None:
            pairs.append(identity_bn_kernel(self.skip, 1, 3))
        return nn.Sequential(conv_with(self.dense.conv, *summed(pairs)), nn.ReLU())


def repvgg(seed: int = 1):
    torch.manual_seed(seed)
    widths = [(3, 16, 2), (16, 16, 1), (16, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1)]
    blocks = [RepVGGBlock(cin, cout, stride) for cin, cout, stride in widths]
    return built(nn.Sequential(*blocks, Classifier(64)), seed=seed)


# ---------------------------------------------------------------------------------------------
# MobileOne: k over-parameterised conv-BN branches + a 1x1 "scale" conv-BN (for k x k kernels)
# + an identity BN, summed; a depthwise 3x3 block then a pointwise 1x1 block.


class MobileOneBlock(Reparameterizable):
    def __init__(self, cin: int, cout: int, size: int, stride: int = 1, groups: int = 1, branches: int = 1,
                 scale_branch: bool = True, act: nn.Module | None = None):
        super().__init__()
        self.convs = nn.ModuleList(ConvBN(cin, cout, size, stride, groups) for _ in range(branches))
        self.scale = ConvBN(cin, cout, 1, stride, groups) if size > 1 and scale_branch else None
        self.skip = nn.BatchNorm2d(cout) if cin == cout and stride == 1 else None
        self.act = act or nn.Identity()
        self.shape = (cin, cout, size, stride, groups)  # what the fused conv is, with no branch left to ask

    def train_forward(self, x):
        y = sum(conv(x) for conv in self.convs) if len(self.convs) else 0
        if self.scale is not None:
            y = y + self.scale(x)
        if self.skip is not None:
            y = y + self.skip(x)
        return self.act(y)

    def kernel_bias(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The branches (without the activation) as one conv's kernel and bias."""
        _, _, size, _, groups = self.shape
        pairs = [conv.kernel_bias() for conv in self.convs]
        if self.scale is not None:
            pairs.append(self.scale.kernel_bias())
        if self.skip is not None:
            pairs.append(identity_bn_kernel(self.skip, groups, size))
        return summed(pairs)

    def fused_conv(self, kernel: torch.Tensor, bias: torch.Tensor) -> nn.Conv2d:
        cin, cout, size, stride, groups = self.shape
        return conv_with(nn.Conv2d(cin, cout, size, stride, groups=groups), kernel, bias)

    def fuse(self) -> nn.Module:
        return nn.Sequential(self.fused_conv(*self.kernel_bias()), self.act)


def mobileone_stage(cin: int, cout: int, stride: int, branches: int, act: type[nn.Module] = nn.ReLU) -> list[nn.Module]:
    """A depthwise 3x3 MobileOne block, then a pointwise 1x1 one."""
    return [MobileOneBlock(cin, cin, 3, stride, cin, branches, act=act()),
            MobileOneBlock(cin, cout, 1, 1, 1, branches, act=act())]


def mobileone(seed: int = 2):
    torch.manual_seed(seed)
    branches = 4  # MobileOne-S0's k
    layers = [MobileOneBlock(3, 16, 3, 2, 1, branches, act=nn.ReLU())]
    for cin, cout, stride in [(16, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1)]:
        layers += mobileone_stage(cin, cout, stride, branches)
    return built(nn.Sequential(*layers, Classifier(64)), seed=seed)


# ---------------------------------------------------------------------------------------------
# FastViT: RepMixer token mixing x + layer_scale * (mixer(x) - norm(x)), MobileOne-style
# depthwise blocks, a ConvFFN, and a large-kernel patch embedding.


class RepMixer(Reparameterizable):
    """norm: an identity BN alone; mixer: depthwise k x k conv-BN + 1x1 scale conv-BN +
    identity BN. The whole mixer folds to one depthwise conv with the residual as an identity."""

    def __init__(self, dim: int, size: int = 3):
        super().__init__()
        self.norm = MobileOneBlock(dim, dim, size, 1, dim, branches=0, scale_branch=False)
        self.mixer = MobileOneBlock(dim, dim, size, 1, dim, branches=1)
        self.layer_scale = nn.Parameter(torch.full((dim, 1, 1), 1e-5))
        self.dim, self.size = dim, size

    def train_forward(self, x):
        return x + self.layer_scale * (self.mixer(x) - self.norm(x))

    def fuse(self) -> nn.Module:
        mixer_kernel, mixer_bias = self.mixer.kernel_bias()
        norm_kernel, norm_bias = self.norm.kernel_bias()
        scale = self.layer_scale.reshape(-1)
        residual = identity_kernel(self.dim, self.dim, self.size)
        kernel = residual + scale.reshape(-1, 1, 1, 1) * (mixer_kernel - norm_kernel)
        return self.mixer.fused_conv(kernel, scale * (mixer_bias - norm_bias))


class ConvFFN(nn.Module):
    """Depthwise 7x7 conv-BN, 1x1 conv, GELU, 1x1 conv."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.conv = ConvBN(dim, dim, 7, groups=dim)
        self.fc1 = nn.Conv2d(dim, hidden, 1)
        self.fc2 = nn.Conv2d(hidden, dim, 1)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(self.conv(x))))


class RepMixerBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.token_mixer = RepMixer(dim)
        self.mlp = ConvFFN(dim, 3 * dim)
        self.layer_scale = nn.Parameter(torch.full((dim, 1, 1), 1e-5))

    def forward(self, x):
        x = self.token_mixer(x)
        return x + self.layer_scale * self.mlp(x)


class LargeKernelConv(Reparameterizable):
    """FastViT's patch embedding conv: a grouped 7x7 conv-BN beside a 3x3 conv-BN, summed, GELU."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.large = ConvBN(cin, cout, 7, stride, groups=cin)
        self.small = ConvBN(cin, cout, 3, stride, groups=cin)

    def train_forward(self, x):
        return F.gelu(self.large(x) + self.small(x))

    def fuse(self) -> nn.Module:
        return nn.Sequential(conv_with(self.large.conv, *summed([self.large.kernel_bias(), self.small.kernel_bias()])),
                             nn.GELU())


def fastvit(seed: int = 3):
    torch.manual_seed(seed)
    stem = [MobileOneBlock(3, 32, 3, 2, 1, 1, act=nn.GELU()), MobileOneBlock(32, 32, 3, 2, 32, 1, act=nn.GELU()),
            MobileOneBlock(32, 32, 1, 1, 1, 1, act=nn.GELU())]
    embed = [LargeKernelConv(32, 64, 2), MobileOneBlock(64, 64, 1, 1, 1, 1, act=nn.GELU())]
    layers = [*stem, RepMixerBlock(32), RepMixerBlock(32), *embed, RepMixerBlock(64), RepMixerBlock(64)]
    return built(nn.Sequential(*layers, Classifier(64)), seed=seed)


# ---------------------------------------------------------------------------------------------
# GhostNet and RepGhost: a ghost module makes half its features with a cheap depthwise conv.


class GhostModule(nn.Module):
    """GhostNet: primary 1x1 conv-BN(-ReLU), cheap depthwise 3x3 conv-BN(-ReLU) of it, the two
    concatenated (and sliced to the output width, as the family writes it)."""

    def __init__(self, cin: int, cout: int, relu: bool):
        super().__init__()
        width = math.ceil(cout / 2)
        self.primary = ConvBN(cin, width, 1)
        self.cheap = ConvBN(width, width, 3, groups=width)
        self.act = nn.ReLU() if relu else nn.Identity()
        self.cout = cout

    def forward(self, x):
        primary = self.act(self.primary(x))
        return torch.cat([primary, self.act(self.cheap(primary))], dim=1)[:, : self.cout]


class RepGhostModule(Reparameterizable):
    """RepGhost: primary 1x1 conv-BN(-ReLU); a cheap depthwise 3x3 conv-BN and a BN "fusion"
    identity of the primary, added (not concatenated); ReLU."""

    def __init__(self, cin: int, cout: int, relu: bool):
        super().__init__()
        self.primary = ConvBN(cin, cout, 1)
        self.cheap = ConvBN(cout, cout, 3, groups=cout)
        self.fusion = nn.BatchNorm2d(cout)
        self.relu = relu

    def act(self, x):
        return F.relu(x) if self.relu else x

    def train_forward(self, x):
        primary = self.act(self.primary(x))
        return self.act(self.cheap(primary) + self.fusion(primary))

    def fuse(self) -> nn.Module:
        fusion = identity_bn_kernel(self.fusion, self.cheap.conv.groups, 3)
        cheap = conv_with(self.cheap.conv, *summed([self.cheap.kernel_bias(), fusion]))
        act = nn.ReLU if self.relu else nn.Identity
        return nn.Sequential(self.primary.fuse(), act(), cheap, act())


class GhostBottleneck(nn.Module):
    """ghost (ReLU), a depthwise stride-2 conv-BN when downsampling, ghost (linear), plus a
    shortcut: the input, or depthwise conv-BN then 1x1 conv-BN."""

    def __init__(self, module: type[nn.Module], cin: int, mid: int, cout: int, stride: int):
        super().__init__()
        self.ghost1 = module(cin, mid, relu=True)
        self.down = ConvBN(mid, mid, 3, stride, groups=mid) if stride > 1 else nn.Identity()
        self.ghost2 = module(mid, cout, relu=False)
        self.shortcut = (nn.Identity() if cin == cout and stride == 1 else
                         nn.Sequential(ConvBN(cin, cin, 3, stride, groups=cin), ConvBN(cin, cout, 1)))

    def forward(self, x):
        return self.ghost2(self.down(self.ghost1(x))) + self.shortcut(x)


def ghost_network(module: type[nn.Module], seed: int):
    torch.manual_seed(seed)
    stem = [ConvBN(3, 16, 3, 2), nn.ReLU()]
    shapes = [(16, 16, 16, 1), (16, 48, 24, 2), (24, 72, 24, 1), (24, 72, 40, 2), (40, 120, 40, 1)]
    blocks = [GhostBottleneck(module, *shape) for shape in shapes]
    return built(nn.Sequential(*stem, *blocks, Classifier(40)), seed=seed)


def ghostnet():
    return ghost_network(GhostModule, seed=4)


def repghost():
    return ghost_network(RepGhostModule, seed=5)


# ---------------------------------------------------------------------------------------------
# RepViT: RepVGGDW token mixer (BN of depthwise 3x3 conv-BN + depthwise 1x1 conv + identity),
# a 1x1 conv channel mixer, a BN1d -> Linear head with a distillation head.


class RepVGGDW(Reparameterizable):
    def __init__(self, dim: int):
        super().__init__()
        self.conv = ConvBN(dim, dim, 3, groups=dim)
        self.conv1 = nn.Conv2d(dim, dim, 1, groups=dim)
        self.bn = nn.BatchNorm2d(dim)

    def train_forward(self, x):
        return self.bn(self.conv(x) + self.conv1(x) + x)

    def fuse(self) -> nn.Module:
        dim = self.bn.num_features
        kernel, bias = summed([self.conv.kernel_bias(), (self.conv1.weight, self.conv1.bias),
                               (identity_kernel(dim, dim, 1), torch.zeros(dim))])
        return conv_with(self.conv.conv, *fold_bn(kernel, bias, self.bn))


class SqueezeExcite(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.reduce = nn.Conv2d(dim, dim // 4, 1)
        self.expand = nn.Conv2d(dim // 4, dim, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.expand(F.relu(self.reduce(x.mean(dim=(2, 3), keepdim=True)))))


class Residual(nn.Module):
    def __init__(self, *layers: nn.Module):
        super().__init__()
        self.body = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.body(x)


class RepViTBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, se: bool):
        super().__init__()
        excite = [SqueezeExcite(cin)] if se else []
        if stride == 1:
            self.token_mixer = nn.Sequential(RepVGGDW(cin), *excite)
        else:
            self.token_mixer = nn.Sequential(ConvBN(cin, cin, 3, stride, groups=cin), *excite, ConvBN(cin, cout, 1))
        self.channel_mixer = Residual(ConvBN(cout, 2 * cout, 1), nn.GELU(), ConvBN(2 * cout, cout, 1))

    def forward(self, x):
        return self.channel_mixer(self.token_mixer(x))


class DistilledHead(Reparameterizable):
    """A classifier and a distillation classifier (each BN1d -> Linear) averaged, as at eval.
    `merge`: the hand form makes the two one Linear (RepViT's deploy code does, LeViT's does not)."""

    def __init__(self, channels: int, merge: bool):
        super().__init__()
        self.head, self.dist = BNLinear(channels, CLASSES), BNLinear(channels, CLASSES)
        self.merge = merge

    def train_forward(self, x):
        return (self.head(x) + self.dist(x)) / 2

    def fuse(self) -> nn.Module:
        if not self.merge:
            return AveragedHeads(self.head.fuse(), self.dist.fuse())
        (w1, b1), (w2, b2) = self.head.weight_bias(), self.dist.weight_bias()
        return linear_with((w1 + w2) / 2, (b1 + b2) / 2)


class AveragedHeads(nn.Module):
    def __init__(self, head: nn.Module, dist: nn.Module):
        super().__init__()
        self.head, self.dist = head, dist

    def forward(self, x):
        return (self.head(x) + self.dist(x)) / 2


class PooledHead(nn.Module):
    """Global average pool of a feature map (dims 2, 3) or of tokens (dim 1), then `head`."""

    def __init__(self, head: nn.Module, dims: tuple[int, ...]):
        super().__init__()
        self.head, self.dims = head, dims

    def forward(self, x):
        return self.head(x.mean(dim=self.dims))


def repvit():
    torch.manual_seed(6)
    stem = [ConvBN(3, 16, 3, 2), nn.GELU(), ConvBN(16, 32, 3, 2)]
    shapes = [(32, 32, 1, True), (32, 32, 1, False), (32, 64, 2, True), (64, 64, 1, True), (64, 64, 1, False)]
    blocks = [RepViTBlock(*shape) for shape in shapes]
    return built(nn.Sequential(*stem, *blocks, PooledHead(DistilledHead(64, merge=True), (2, 3))), seed=6)


# ---------------------------------------------------------------------------------------------
# LeViT: a conv-BN stem, then tokens through Linear_BN attention and MLP blocks; BN1d -> Linear
# heads.


class LeViTAttention(nn.Module):
    """Multi-head attention whose qkv and projection are Linear_BN, with a learned per-head bias
    over token pairs (the eval-time table LeViT gathers once)."""

    def __init__(self, dim: int, tokens: int, heads: int = 4, key_dim: int = 16, value_dim: int = 32):
        super().__init__()
        self.heads, self.key_dim, self.value_dim = heads, key_dim, value_dim
        self.qkv = LinearBN(dim, heads * (2 * key_dim + value_dim))
        self.proj = nn.Sequential(nn.Hardswish(), LinearBN(heads * value_dim, dim))
        self.attention_bias = nn.Parameter(torch.randn(heads, tokens, tokens) * 0.1)

    def forward(self, x):
        batch, tokens, _ = x.shape
        qkv = self.qkv(x).view(batch, tokens, self.heads, -1)
        q, k, v = (part.permute(0, 2, 1, 3) for part in qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=3))
        attention = (q @ k.transpose(-2, -1)) * self.key_dim**-0.5 + self.attention_bias
        out = (attention.softmax(dim=-1) @ v).transpose(1, 2).reshape(batch, tokens, -1)
        return self.proj(out)


class Tokens(nn.Module):
    """A feature map [B, C, H, W] as tokens [B, H*W, C]."""

    def forward(self, x):
        return x.flatten(2).transpose(1, 2)


def levit():
    torch.manual_seed(7)
    dim, tokens = 64, 64  # 64x64 input, three stride-2 convs: 8x8 tokens
    stem = [ConvBN(3, 16, 3, 2), nn.Hardswish(), ConvBN(16, 32, 3, 2), nn.Hardswish(), ConvBN(32, dim, 3, 2), Tokens()]
    blocks = []
    for _ in range(2):
        blocks += [Residual(LeViTAttention(dim, tokens)),
                   Residual(LinearBN(dim, 2 * dim), nn.Hardswish(), LinearBN(2 * dim, dim))]
    return built(nn.Sequential(*stem, *blocks, PooledHead(DistilledHead(dim, merge=False), (1,))), seed=7)


# ---------------------------------------------------------------------------------------------
# EfficientViT (MIT): conv-BN-hardswish stem, MBConv blocks (biased 1x1 and depthwise convs, a
# BN only after the last 1x1), ReLU linear attention (LiteMLA) with a multi-scale depthwise
# aggregation; head: 1x1 conv-BN-hardswish, pool, Linear -> LayerNorm -> hardswish -> Linear.


class MBConv(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4):
        super().__init__()
        mid = cin * expand
        self.inverted = nn.Conv2d(cin, mid, 1)
        self.depth = nn.Conv2d(mid, mid, 3, stride, 1, groups=mid)
        self.point = ConvBN(mid, cout, 1)

    def forward(self, x):
        return self.point(F.hardswish(self.depth(F.hardswish(self.inverted(x)))))


class DSConv(nn.Module):
    """Depthwise 3x3 conv-BN-hardswish, then 1x1 conv-BN."""

    def __init__(self, dim: int):
        super().__init__()
        self.depth = ConvBN(dim, dim, 3, groups=dim)
        self.point = ConvBN(dim, dim, 1)

    def forward(self, x):
        return self.point(F.hardswish(self.depth(x)))


class LiteMLA(nn.Module):
    """ReLU linear attention over [q, k, v] and their 5x5 multi-scale aggregate."""

    def __init__(self, dim: int, head_dim: int = 16, scale: int = 5, eps: float = 1e-15):
        super().__init__()
        self.head_dim, self.eps = head_dim, eps
        heads = dim // head_dim
        total = 3 * dim
        self.qkv = nn.Conv2d(dim, total, 1, bias=False)
        self.aggregate = nn.Sequential(nn.Conv2d(total, total, scale, 1, scale // 2, groups=total, bias=False),
                                       nn.Conv2d(total, total, 1, groups=3 * heads, bias=False))
        self.proj = ConvBN(2 * dim, dim, 1)

    def forward(self, x):
        batch, _, height, width = x.shape
        qkv = self.qkv(x)
        qkv = torch.cat([qkv, self.aggregate(qkv)], dim=1).reshape(batch, -1, 3 * self.head_dim, height * width)
        q, k, v = qkv.split(self.head_dim, dim=2)
        q, k = F.relu(q), F.relu(k)
        v = F.pad(v, (0, 0, 0, 1), value=1.0)  # a row of ones: the normaliser comes out of the same product
        out = (v @ k.transpose(-1, -2)) @ q
        out = out[:, :, :-1] / (out[:, :, -1:] + self.eps)
        return self.proj(out.reshape(batch, -1, height, width))


def efficientvit():
    torch.manual_seed(8)
    stem = [ConvBN(3, 16, 3, 2), nn.Hardswish(), Residual(DSConv(16))]
    stages = [MBConv(16, 32, 2), Residual(MBConv(32, 32, 1)), MBConv(32, 64, 2), Residual(MBConv(64, 64, 1))]
    attention = [layer for _ in range(2) for layer in (Residual(LiteMLA(64)), Residual(MBConv(64, 64, 1)))]
    head = [ConvBN(64, 128, 1), nn.Hardswish(),
            PooledHead(nn.Sequential(nn.Linear(128, 160, bias=False), nn.LayerNorm(160), nn.Hardswish(),
                                     nn.Linear(160, CLASSES)), (2, 3))]
    return built(nn.Sequential(*stem, *stages, *attention, *head), seed=8)


FAMILIES = {
    "RepVGG": repvgg,
    "MobileOne": mobileone,
    "FastViT": fastvit,
    "RepGhost": repghost,
    "GhostNet": ghostnet,
    "RepViT": repvit,
    "LeViT": levit,
    "EfficientViT": efficientvit,
}
