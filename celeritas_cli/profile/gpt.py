"""A GPT-style decoder for the zoo (imports torch): the model family of
Megatron-LM's scaling studies, the kind of model placement exists for.

Layout (GPT-2 / GPT-3, Radford et al. 2019, Brown et al. 2020 section 2.1;
Megatron-LM, Shoeybi et al. 2019 section 3 and Narayanan et al. 2021
section 5.1): token and learned position embeddings, ``layers`` pre-LayerNorm
blocks (LayerNorm -> fused QKV projection -> causal self-attention -> output
projection -> dropout -> residual; LayerNorm -> Linear 4h -> GELU -> Linear h
-> dropout -> residual), a final LayerNorm and the output layer **tied** to
the token embedding (GPT-2/3 and Megatron's default,
``share_embeddings_and_output_weights``), per-token cross-entropy.
Attention is ``scaled_dot_product_attention(is_causal=True)``, the fused
(flash) kernel such models are trained with: no ``s x s`` score matrix is
kept; hidden dropout 0.1 as Megatron, no attention dropout (a fused kernel
with dropout has no CPU trace).

Sizes (GPT-3 Table 2.1; vocabulary 51,200 and sequence 2048 as Megatron-LM's
scaling table, Narayanan et al. 2021 Table 1):

=========  ======  ======  =====  ================
size       layers  hidden  heads  parameters
=========  ======  ======  =====  ================
``1.3b``   24      2048    16     1.32 B (GPT-3 XL)
``6.7b``   32      4096    32     6.66 B
=========  ======  ======  =====  ================

Model FLOPs of one training step (Narayanan et al. 2021, section 5.1, Eq. 3
without recomputation: forward + backward = 3 forward passes)::

    F = 72 B s l h^2 (1 + s / (6 h) + V / (12 l h))

Example (not run: needs torch)::

    model = GPT(size="1.3b")          # or GPT(layers=2, d_model=64, heads=4, vocab=128, seq=16)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: The configurations of the zoo: ``(layers, d_model, heads)``.
SIZES = {"1.3b": (24, 2048, 16), "6.7b": (32, 4096, 32)}
#: A tiny configuration for tests (the zoo's ``small``).
GPT_SMALL = {"layers": 2, "d_model": 32, "heads": 4, "vocab": 64, "seq": 16}


def model_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Model FLOPs of one training step without recomputation (module docstring).

    Example
    -------
    >>> f"{model_flops(8, 2048, 24, 2048, 51200):.3e}"
    '1.488e+14'
    """
    return 72.0 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (12 * layers * hidden))


class Block(nn.Module):
    """One pre-LayerNorm decoder block."""

    def __init__(self, d: int, heads: int, ff: int, dropout: float):
        super().__init__()
        self.h, self.p = heads, dropout
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, ff)
        self.fc2 = nn.Linear(ff, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + F.dropout(self.proj(a.transpose(1, 2).reshape(b, s, d)), self.p, self.training)
        return x + F.dropout(self.fc2(F.gelu(self.fc(self.ln2(x)))), self.p, self.training)


class GPT(nn.Module):
    """GPT-style decoder (module docstring).

    Parameters
    ----------
    size : ``1.3b`` or ``6.7b`` (:data:`SIZES`); ``layers``, ``d_model``, ``heads`` override it.
    vocab, seq : vocabulary and sequence length (51,200 and 2048).
    d_ff : MLP width (4 x d_model).
    dropout : hidden dropout (0.1).
    tied : output layer shares the token embedding's weight (True).
    """

    def __init__(self, size: str = "1.3b", layers: int | None = None, d_model: int | None = None,
                 heads: int | None = None, vocab: int = 51200, seq: int = 2048, d_ff: int | None = None,
                 dropout: float = 0.1, tied: bool = True):
        super().__init__()
        if size not in SIZES:
            raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
        l0, d0, h0 = SIZES[size]
        layers, d_model, heads = layers or l0, d_model or d0, heads or h0
        if d_model % heads:
            raise ValueError(f"d_model {d_model} is not a multiple of heads {heads}")
        self.vocab, self.seq, self.p = vocab, seq, dropout
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, d_ff or 4 * d_model, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = None if tied else nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx):
        x = F.dropout(self.wte(idx) + self.wpe(torch.arange(idx.shape[1])), self.p, self.training)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        return F.linear(x, self.wte.weight) if self.head is None else self.head(x)

    def example_inputs(self, batch: int):
        return (torch.zeros(batch, self.seq, dtype=torch.long),)

    def example_target(self, batch: int):
        return torch.zeros(batch, self.seq, dtype=torch.long)

    def loss(self, output, target):
        return F.cross_entropy(output.reshape(-1, self.vocab), target.reshape(-1))
