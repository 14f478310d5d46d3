"""The worked example of docs/rules.md: `k - Conv(x)`, which no built-in rule folds.

    convexport optimize docs/examples/k_minus_conv.py --rules docs/examples/my_rules.yaml
"""

import torch
from torch import nn


class KMinusConv(nn.Module):
    def __init__(self, per_channel: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.k = nn.Parameter(torch.randn(1, 4, 1, 1) if per_channel else torch.randn(1, 4, 6, 6))

    def forward(self, x):
        return torch.relu(self.k - self.conv(x))


def build():
    torch.manual_seed(0)
    return KMinusConv().eval(), (torch.randn(1, 3, 6, 6),)


def build_full_map():
    """k of the output's whole shape, not one value per channel: the rule must leave it alone."""
    torch.manual_seed(0)
    return KMinusConv(per_channel=False).eval(), (torch.randn(1, 3, 6, 6),)
