"""A small U-Net, a model placer's zoo does not have (issue 25's calibration models).

``placer profile --model examples/small_unet.py:SmallUNet -b 8``.  Images ``[b, 3, 32, 32]`` go
through ``levels`` encoder stages (two 3x3 convolutions with BatchNorm and ReLU, then 2x2 max
pooling, doubling the channels), a bottleneck, and as many decoder stages (a transposed 2x2
convolution, concatenation with the encoder's skip tensor, two convolutions); a 1x1 convolution
predicts one channel, trained with the mean squared error against a target image.  The skip
connections give the graph long edges, which makes it a placement problem unlike a chain.

References
----------
Ronneberger, Fischer and Brox, "U-Net", MICCAI 2015.
"""

import torch
import torch.nn.functional as F
from torch import nn


def double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


class SmallUNet(nn.Module):
    """U-Net with ``levels`` down/up stages starting at ``width`` channels, on ``image`` x ``image`` inputs."""

    def __init__(self, levels: int = 2, width: int = 16, image: int = 32):
        super().__init__()
        self.image = image
        chans = [width * 2**i for i in range(levels + 1)]
        self.down = nn.ModuleList(double_conv(3 if i == 0 else chans[i - 1], chans[i]) for i in range(levels))
        self.mid = double_conv(chans[levels - 1], chans[levels])
        self.up = nn.ModuleList(nn.ConvTranspose2d(chans[i + 1], chans[i], 2, stride=2)
                                for i in reversed(range(levels)))
        self.dec = nn.ModuleList(double_conv(2 * chans[i], chans[i]) for i in reversed(range(levels)))
        self.out = nn.Conv2d(chans[0], 1, 1)

    def forward(self, x):
        skips = []
        for stage in self.down:
            x = stage(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.mid(x)
        for up, dec, skip in zip(self.up, self.dec, reversed(skips)):
            x = dec(torch.cat([up(x), skip], dim=1))
        return self.out(x)

    def example_inputs(self, batch):
        return (torch.randn(batch, 3, self.image, self.image),)

    def example_target(self, batch):
        return torch.rand(batch, 1, self.image, self.image)

    def loss(self, output, target):
        return F.mse_loss(output, target)
