"""A model of your own for `placer profile --model examples/tiny_mlp.py:TinyMLP`.

Any callable returning an ``nn.Module`` works (a class or a factory); the
module needs ``example_inputs(batch)`` returning the forward arguments, and
may define ``example_target(batch)`` and ``loss(output, target)`` (default
loss: the mean of the output).  ``--config width=64`` becomes ``TinyMLP(width=64)``.
"""

import torch
import torch.nn.functional as F
from torch import nn


class TinyMLP(nn.Module):
    """x[b, 32] -> Linear -> ReLU -> Linear -> ReLU -> Linear(10) -> cross-entropy."""

    def __init__(self, width: int = 128, classes: int = 10):
        super().__init__()
        self.classes = classes
        self.l1 = nn.Linear(32, width)
        self.l2 = nn.Linear(width, width)
        self.l3 = nn.Linear(width, classes)

    def forward(self, x):
        return self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))

    def example_inputs(self, batch):
        return (torch.randn(batch, 32),)

    def example_target(self, batch):
        return torch.zeros(batch, dtype=torch.long)

    def loss(self, output, target):
        return F.cross_entropy(output, target)
