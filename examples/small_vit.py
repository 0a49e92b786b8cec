"""A small Vision Transformer, a model placer's zoo does not have (issue 25's calibration models).

``placer profile --model examples/small_vit.py:SmallViT -b 8``.  Images ``[b, 3, 32, 32]`` are cut
into 4x4 patches (a strided convolution), a class token and learned position embeddings are added,
``depth`` pre-norm Transformer blocks (multi-head self-attention written out as matmul + softmax,
GELU MLP, dropout) follow, and the class token is classified with cross-entropy.
``--config depth=2 --config dim=64`` changes the size; the constructor is deterministic under
``torch.manual_seed`` (``placer run`` builds it in every process).

References
----------
Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021 (ViT).
"""

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """Pre-norm block: x + MHSA(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, dim: int, heads: int, mlp: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.n1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.n2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp)
        self.fc2 = nn.Linear(mlp, dim)
        self.p = dropout

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.n1(x)).reshape(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
        att = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * (d // h) ** -0.5, dim=-1)
        a = torch.matmul(F.dropout(att, self.p, self.training), v).transpose(1, 2).reshape(b, t, d)
        x = x + F.dropout(self.proj(a), self.p, self.training)
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.n2(x)))), self.p, self.training)


class SmallViT(nn.Module):
    """ViT on 32x32 images: 4x4 patches (64 tokens + a class token), ``depth`` blocks of width ``dim``."""

    def __init__(self, depth: int = 4, dim: int = 96, heads: int = 4, mlp: int = 192, classes: int = 10,
                 dropout: float = 0.1, image: int = 32, patch: int = 4):
        super().__init__()
        self.classes, self.image = classes, image
        self.embed = nn.Conv2d(3, dim, patch, stride=patch)
        tokens = (image // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, tokens + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads, mlp, dropout) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x[:, 0]))

    def example_inputs(self, batch):
        return (torch.randn(batch, 3, self.image, self.image),)

    def example_target(self, batch):
        return torch.arange(batch) % self.classes

    def loss(self, output, target):
        return F.cross_entropy(output, target)
