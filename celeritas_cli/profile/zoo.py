"""The model zoo of Celeritas 6.2.1, in plain torch (imports torch).

Every model is an ``nn.Module`` with three extra methods the capture uses:
``example_inputs(batch) -> tuple`` (the forward arguments), ``example_target
(batch)`` and ``loss(output, target)``.  Inputs are created inside the
capture's fake-tensor mode, so they cost no memory at any batch size.

=================  =========================================================  ===========
name               model (Celeritas 6.2.1)                                    paper batch
=================  =========================================================  ===========
inception_v3       Inception-V3 (Szegedy et al. 2016), 299x299, 1000 classes  512
nmt                GNMT-like seq2seq: 4-layer LSTM encoder and decoder,        512
                   2048 hidden units, additive attention, unrolled
transformer        Transformer, 12 layers (6 encoder + 6 decoder), 16 heads,  256
                   2048 hidden units, FFN 4x
tensor_holography  30 conv layers x 24 filters (Shi et al. 2021), RGB-D in    32
resnet50           ResNet-50 (He et al. 2016), 224x224, 1000 classes          256 (ours)
gpt_1.3b, _6.7b    GPT decoders (:mod:`.gpt`), sequence 2048, bf16 (not Celeritas) 8, 16 (ours)
=================  =========================================================  ===========

Readings chosen where the paper is silent: the Transformer's "12 layers"
are 6 encoder + 6 decoder layers (the base/big Transformer layout doubled in
width), sequences of 64 tokens and a 32k vocabulary; NMT sequences of 32
tokens, a 32k vocabulary and the first encoder layer unidirectional;
Tensor Holography at 384x384 (its training resolution) with BatchNorm and
ReLU after every conv but the last.  Attention is written as matmul +
softmax + matmul (TensorFlow 1.12, which Celeritas used, had no fused
kernel); ``Transformer(fused=True)`` uses ``scaled_dot_product_attention``.
Every constructor takes size arguments, so tests capture tiny variants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .gpt import GPT, GPT_SMALL


class ZooModel(nn.Module):
    """Classification defaults: integer class targets, cross-entropy loss."""

    num_classes = 1000

    def example_target(self, batch: int):
        return torch.zeros(batch, dtype=torch.long)

    def loss(self, output, target):
        return F.cross_entropy(output, target)


# ----------------------------------------------------------------- Inception
class BasicConv(nn.Module):
    def __init__(self, cin: int, cout: int, **kw):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, bias=False, **kw)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class InceptionA(nn.Module):
    def __init__(self, cin, pool, w):
        super().__init__()
        self.b1 = BasicConv(cin, w(64), kernel_size=1)
        self.b5_1 = BasicConv(cin, w(48), kernel_size=1)
        self.b5_2 = BasicConv(w(48), w(64), kernel_size=5, padding=2)
        self.b3_1 = BasicConv(cin, w(64), kernel_size=1)
        self.b3_2 = BasicConv(w(64), w(96), kernel_size=3, padding=1)
        self.b3_3 = BasicConv(w(96), w(96), kernel_size=3, padding=1)
        self.bp = BasicConv(cin, pool, kernel_size=1)
        self.out = w(64) + w(64) + w(96) + pool

    def forward(self, x):
        p = self.bp(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat([self.b1(x), self.b5_2(self.b5_1(x)), self.b3_3(self.b3_2(self.b3_1(x))), p], 1)


class InceptionB(nn.Module):
    def __init__(self, cin, w):
        super().__init__()
        self.b3 = BasicConv(cin, w(384), kernel_size=3, stride=2)
        self.d1 = BasicConv(cin, w(64), kernel_size=1)
        self.d2 = BasicConv(w(64), w(96), kernel_size=3, padding=1)
        self.d3 = BasicConv(w(96), w(96), kernel_size=3, stride=2)
        self.out = w(384) + w(96) + cin

    def forward(self, x):
        return torch.cat([self.b3(x), self.d3(self.d2(self.d1(x))), F.max_pool2d(x, 3, stride=2)], 1)


class InceptionC(nn.Module):
    def __init__(self, cin, c7, w):
        super().__init__()
        self.b1 = BasicConv(cin, w(192), kernel_size=1)
        self.s1 = BasicConv(cin, c7, kernel_size=1)
        self.s2 = BasicConv(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.s3 = BasicConv(c7, w(192), kernel_size=(7, 1), padding=(3, 0))
        self.d1 = BasicConv(cin, c7, kernel_size=1)
        self.d2 = BasicConv(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.d3 = BasicConv(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.d4 = BasicConv(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.d5 = BasicConv(c7, w(192), kernel_size=(1, 7), padding=(0, 3))
        self.bp = BasicConv(cin, w(192), kernel_size=1)
        self.out = 4 * w(192)

    def forward(self, x):
        s = self.s3(self.s2(self.s1(x)))
        d = self.d5(self.d4(self.d3(self.d2(self.d1(x)))))
        p = self.bp(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat([self.b1(x), s, d, p], 1)


class InceptionD(nn.Module):
    def __init__(self, cin, w):
        super().__init__()
        self.a1 = BasicConv(cin, w(192), kernel_size=1)
        self.a2 = BasicConv(w(192), w(320), kernel_size=3, stride=2)
        self.b1 = BasicConv(cin, w(192), kernel_size=1)
        self.b2 = BasicConv(w(192), w(192), kernel_size=(1, 7), padding=(0, 3))
        self.b3 = BasicConv(w(192), w(192), kernel_size=(7, 1), padding=(3, 0))
        self.b4 = BasicConv(w(192), w(192), kernel_size=3, stride=2)
        self.out = w(320) + w(192) + cin

    def forward(self, x):
        return torch.cat([self.a2(self.a1(x)), self.b4(self.b3(self.b2(self.b1(x)))),
                          F.max_pool2d(x, 3, stride=2)], 1)


class InceptionE(nn.Module):
    def __init__(self, cin, w):
        super().__init__()
        self.b1 = BasicConv(cin, w(320), kernel_size=1)
        self.a1 = BasicConv(cin, w(384), kernel_size=1)
        self.a2a = BasicConv(w(384), w(384), kernel_size=(1, 3), padding=(0, 1))
        self.a2b = BasicConv(w(384), w(384), kernel_size=(3, 1), padding=(1, 0))
        self.d1 = BasicConv(cin, w(448), kernel_size=1)
        self.d2 = BasicConv(w(448), w(384), kernel_size=3, padding=1)
        self.d3a = BasicConv(w(384), w(384), kernel_size=(1, 3), padding=(0, 1))
        self.d3b = BasicConv(w(384), w(384), kernel_size=(3, 1), padding=(1, 0))
        self.bp = BasicConv(cin, w(192), kernel_size=1)
        self.out = w(320) + 4 * w(384) + w(192)

    def forward(self, x):
        a = self.a1(x)
        d = self.d2(self.d1(x))
        p = self.bp(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat([self.b1(x), self.a2a(a), self.a2b(a), self.d3a(d), self.d3b(d), p], 1)


class InceptionV3(ZooModel):
    """Inception-V3 without the auxiliary head (torchvision's layout).

    Parameters
    ----------
    width : channel multiplier (1.0 = the real model).
    image : input side in pixels (299 in the paper).
    num_classes : classifier outputs.
    """

    def __init__(self, width: float = 1.0, image: int = 299, num_classes: int = 1000):
        super().__init__()
        self.image, self.num_classes = image, num_classes

        def w(c: int) -> int:
            return max(1, int(round(c * width)))

        self.stem = nn.Sequential(
            BasicConv(3, w(32), kernel_size=3, stride=2), BasicConv(w(32), w(32), kernel_size=3),
            BasicConv(w(32), w(64), kernel_size=3, padding=1), nn.MaxPool2d(3, stride=2),
            BasicConv(w(64), w(80), kernel_size=1), BasicConv(w(80), w(192), kernel_size=3), nn.MaxPool2d(3, stride=2))
        blocks: list[nn.Module] = []
        c = w(192)
        for pool in (w(32), w(64), w(64)):
            blocks.append(InceptionA(c, pool, w))
            c = blocks[-1].out
        blocks.append(InceptionB(c, w))
        c = blocks[-1].out
        for c7 in (w(128), w(160), w(160), w(192)):
            blocks.append(InceptionC(c, c7, w))
            c = blocks[-1].out
        blocks.append(InceptionD(c, w))
        c = blocks[-1].out
        for _ in range(2):
            blocks.append(InceptionE(c, w))
            c = blocks[-1].out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c, num_classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(F.dropout(x, 0.5, self.training))

    def example_inputs(self, batch: int):
        return (torch.randn(batch, 3, self.image, self.image),)


# ------------------------------------------------------------------- ResNet
class Bottleneck(nn.Module):
    def __init__(self, cin, mid, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, mid, 1, bias=False)
        self.b1 = nn.BatchNorm2d(mid)
        self.c2 = nn.Conv2d(mid, mid, 3, stride=stride, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(mid)
        self.c3 = nn.Conv2d(mid, mid * 4, 1, bias=False)
        self.b3 = nn.BatchNorm2d(mid * 4)
        self.down = None
        if stride != 1 or cin != mid * 4:
            self.down = nn.Sequential(nn.Conv2d(cin, mid * 4, 1, stride=stride, bias=False), nn.BatchNorm2d(mid * 4))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = F.relu(self.b2(self.c2(y)))
        y = self.b3(self.c3(y))
        return F.relu(y + (self.down(x) if self.down is not None else x))


class ResNet50(ZooModel):
    """ResNet-50 (bottleneck blocks 3-4-6-3).

    Parameters
    ----------
    width : base width (64 in the real model).
    layers : blocks per stage.
    image : input side in pixels.
    """

    def __init__(self, width: int = 64, layers=(3, 4, 6, 3), image: int = 224, num_classes: int = 1000):
        super().__init__()
        self.image = image
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1))
        blocks, cin = [], width
        for i, n in enumerate(layers):
            mid = width * 2**i
            for j in range(n):
                blocks.append(Bottleneck(cin, mid, 2 if (j == 0 and i > 0) else 1))
                cin = mid * 4
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    def example_inputs(self, batch: int):
        return (torch.randn(batch, 3, self.image, self.image),)


# -------------------------------------------------------------- Transformer
class Attention(nn.Module):
    def __init__(self, d: int, heads: int, fused: bool):
        super().__init__()
        self.h, self.fused = heads, fused
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.o = nn.Linear(d, d)

    def forward(self, x, mem, causal: bool):
        (b, s, d), t = x.shape, mem.shape[1]
        dh = d // self.h
        q = self.q(x).view(b, s, self.h, dh).transpose(1, 2)
        k = self.k(mem).view(b, t, self.h, dh).transpose(1, 2)
        v = self.v(mem).view(b, t, self.h, dh).transpose(1, 2)
        if self.fused:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        else:
            scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(dh))
            if causal:
                mask = torch.ones(s, t, dtype=torch.bool).triu(1)
                scores = scores.masked_fill(mask, float("-inf"))
            a = torch.matmul(F.dropout(torch.softmax(scores, -1), 0.1, self.training), v)
        return self.o(a.transpose(1, 2).reshape(b, s, d))


class FeedForward(nn.Module):
    def __init__(self, d: int, ff: int):
        super().__init__()
        self.up, self.down = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x):
        return self.down(F.dropout(F.relu(self.up(x)), 0.1, self.training))


class EncoderLayer(nn.Module):
    def __init__(self, d, heads, ff, fused):
        super().__init__()
        self.attn = Attention(d, heads, fused)
        self.n1 = nn.LayerNorm(d)
        self.ff = FeedForward(d, ff)
        self.n2 = nn.LayerNorm(d)

    def forward(self, x):
        x = self.n1(x + F.dropout(self.attn(x, x, False), 0.1, self.training))
        return self.n2(x + F.dropout(self.ff(x), 0.1, self.training))


class DecoderLayer(nn.Module):
    def __init__(self, d, heads, ff, fused):
        super().__init__()
        self.self_attn = Attention(d, heads, fused)
        self.n1 = nn.LayerNorm(d)
        self.cross = Attention(d, heads, fused)
        self.n2 = nn.LayerNorm(d)
        self.ff = FeedForward(d, ff)
        self.n3 = nn.LayerNorm(d)

    def forward(self, x, mem):
        x = self.n1(x + F.dropout(self.self_attn(x, x, True), 0.1, self.training))
        x = self.n2(x + F.dropout(self.cross(x, mem, False), 0.1, self.training))
        return self.n3(x + F.dropout(self.ff(x), 0.1, self.training))


class Seq2SeqModel(ZooModel):
    """Token-id source and target sequences of length ``self.seq``; per-token
    cross-entropy over ``self.vocab`` (Transformer and NMT share these)."""

    def example_inputs(self, batch: int):
        return (torch.zeros(batch, self.seq, dtype=torch.long), torch.zeros(batch, self.seq, dtype=torch.long))

    def example_target(self, batch: int):
        return torch.zeros(batch, self.seq, dtype=torch.long)

    def loss(self, output, target):
        return F.cross_entropy(output.reshape(-1, self.vocab), target.reshape(-1))


class Transformer(Seq2SeqModel):
    """Encoder-decoder Transformer (Vaswani et al. 2017), post-norm.

    Parameters
    ----------
    layers : total layers, split evenly between encoder and decoder.
    d_model, heads, d_ff : hidden units, attention heads, FFN width (4 x d_model by default).
    vocab, seq : vocabulary size and sequence length (source = target).
    fused : use ``scaled_dot_product_attention`` instead of matmul-softmax-matmul.
    """

    def __init__(self, layers: int = 12, d_model: int = 2048, heads: int = 16, d_ff: int | None = None,
                 vocab: int = 32000, seq: int = 64, fused: bool = False):
        super().__init__()
        d_ff = d_ff or 4 * d_model
        self.seq, self.vocab = seq, vocab
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        self.encoder = nn.ModuleList(EncoderLayer(d_model, heads, d_ff, fused) for _ in range(layers - layers // 2))
        self.decoder = nn.ModuleList(DecoderLayer(d_model, heads, d_ff, fused) for _ in range(layers // 2))
        self.out = nn.Linear(d_model, vocab)

    def forward(self, src, tgt):
        pos = torch.arange(self.seq)
        x = self.embed(src) + self.pos(pos)
        for layer in self.encoder:
            x = layer(x)
        y = self.embed(tgt) + self.pos(pos)
        for layer in self.decoder:
            y = layer(y, x)
        return self.out(y)


# ---------------------------------------------------------------------- NMT
class LSTMCell(nn.Module):
    """One LSTM cell written out (gates = x W_ih^T + h W_hh^T + b), so the
    unrolled graph has the per-step ops a TensorFlow LSTM has."""

    def __init__(self, cin: int, hidden: int):
        super().__init__()
        self.ih = nn.Linear(cin, 4 * hidden)
        self.hh = nn.Linear(hidden, 4 * hidden, bias=False)

    def forward(self, x, h, c):
        i, f, g, o = (self.ih(x) + self.hh(h)).chunk(4, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c


class NMT(Seq2SeqModel):
    """GNMT-like seq2seq (Wu et al. 2016): stacked LSTM encoder and decoder with
    residual connections from layer 3 on, additive (Bahdanau) attention on
    the top encoder layer, unrolled over ``seq`` steps.

    Parameters
    ----------
    layers : LSTM layers in the encoder and in the decoder.
    hidden : units per LSTM (2048 in Celeritas 6.2.1).
    vocab, seq : vocabulary and sentence length.
    """

    def __init__(self, layers: int = 4, hidden: int = 2048, vocab: int = 32000, seq: int = 32):
        super().__init__()
        self.layers, self.hidden, self.vocab, self.seq = layers, hidden, vocab, seq
        self.src_embed = nn.Embedding(vocab, hidden)
        self.tgt_embed = nn.Embedding(vocab, hidden)
        self.enc = nn.ModuleList(LSTMCell(hidden, hidden) for _ in range(layers))
        self.dec = nn.ModuleList(LSTMCell(2 * hidden if i == 0 else hidden, hidden) for i in range(layers))
        self.att_q, self.att_k = nn.Linear(hidden, hidden, bias=False), nn.Linear(hidden, hidden, bias=False)
        self.att_v = nn.Linear(hidden, 1, bias=False)
        self.out = nn.Linear(hidden, vocab)

    def _run(self, cells, inputs, first_extra=None):
        b = inputs[0].shape[0]
        state = [(torch.zeros(b, self.hidden), torch.zeros(b, self.hidden)) for _ in cells]
        outs = []
        for x in inputs:
            for i, cell in enumerate(cells):
                inp = torch.cat([x, first_extra(state[-1][0])], 1) if (i == 0 and first_extra) else x
                h, c = cell(inp, *state[i])
                state[i] = (h, c)
                x = h + x if i >= 2 else h
            outs.append(x)
        return outs

    def forward(self, src, tgt):
        enc = self._run(self.enc, list(self.src_embed(src).unbind(1)))
        mem = torch.stack(enc, 1)                      # b, s, h
        keys = self.att_k(mem)

        def attend(query):
            e = self.att_v(torch.tanh(keys + self.att_q(query).unsqueeze(1))).squeeze(2)
            return torch.bmm(torch.softmax(e, 1).unsqueeze(1), mem).squeeze(1)

        dec = self._run(self.dec, list(self.tgt_embed(tgt).unbind(1)), first_extra=attend)
        return self.out(torch.stack(dec, 1))


# -------------------------------------------------------- Tensor Holography
class TensorHolography(ZooModel):
    """Tensor Holography's CNN (Shi et al. 2021): ``convs`` 3x3 convolutions of
    ``filters`` channels from an RGB-D image to amplitude and phase, trained
    with a mean-squared error.

    Parameters
    ----------
    convs, filters : 30 and 24 in the paper.
    image : input side in pixels (384).
    """

    def __init__(self, convs: int = 30, filters: int = 24, image: int = 384):
        super().__init__()
        self.image = image
        layers: list[nn.Module] = []
        cin = 4
        for _ in range(convs - 1):
            layers += [nn.Conv2d(cin, filters, 3, padding=1, bias=False), nn.BatchNorm2d(filters), nn.ReLU()]
            cin = filters
        layers.append(nn.Conv2d(cin, 2, 3, padding=1))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return torch.tanh(self.net(x))

    def example_inputs(self, batch: int):
        return (torch.randn(batch, 4, self.image, self.image),)

    def example_target(self, batch: int):
        return torch.randn(batch, 2, self.image, self.image)

    def loss(self, output, target):
        return F.mse_loss(output, target)


# ---------------------------------------------------------------- registry
@dataclass(frozen=True)
class ZooEntry:
    """One model of the zoo: factory, the paper's batch size, a tiny config for tests, default precision."""

    factory: Callable[..., nn.Module]
    paper_batch: int
    summary: str
    small: dict = field(default_factory=dict)
    table2_nodes: int | None = None
    precision: str = "fp32"


ZOO: dict[str, ZooEntry] = {
    "inception_v3": ZooEntry(InceptionV3, 512, "Inception-V3, 299x299 (Celeritas 6.2.1: batch 512)",
                             {"width": 0.125, "image": 75, "num_classes": 10}, 6332),
    "nmt": ZooEntry(NMT, 512, "GNMT-like 4-layer LSTM seq2seq, 2048 hidden (batch 512)",
                    {"layers": 2, "hidden": 16, "vocab": 50, "seq": 3}, 25463),
    "transformer": ZooEntry(Transformer, 256, "Transformer, 12 layers, 16 heads, 2048 hidden (batch 256)",
                            {"layers": 2, "d_model": 32, "heads": 4, "vocab": 50, "seq": 8}, 36352),
    "tensor_holography": ZooEntry(TensorHolography, 32, "Tensor Holography, 30 conv x 24 filters (batch 32)",
                                  {"convs": 4, "filters": 4, "image": 16}, 3810),
    "resnet50": ZooEntry(ResNet50, 256, "ResNet-50, 224x224 (batch 256)",
                         {"width": 4, "layers": (1, 1, 1, 1), "image": 32, "num_classes": 10}, None),
    "gpt_1.3b": ZooEntry(partial(GPT, "1.3b"), 8, "GPT 1.3B: 24 layers, hidden 2048, 16 heads, sequence 2048, bf16 "
                         "(batch 8)", GPT_SMALL, precision="bf16"),
    "gpt_6.7b": ZooEntry(partial(GPT, "6.7b"), 16, "GPT 6.7B: 32 layers, hidden 4096, 32 heads, sequence 2048, bf16 "
                         "(batch 16)", GPT_SMALL, precision="bf16"),
}
