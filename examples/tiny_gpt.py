"""A small GPT of your own for `placer profile --model examples/tiny_gpt.py:TinyGPT`, the model
to try tensor parallelism and TP x PP plans on (`placer place --algo megatron -p tp=2 -p pp=2`).

The conventions of examples/tiny_mlp.py: a callable returning an ``nn.Module`` with
``example_inputs(batch)``, ``example_target(batch)`` and ``loss(output, target)``;
``--config layers=8`` becomes ``TinyGPT(layers=8)``.

The layout is GPT-2's (Radford et al. 2019; Megatron-LM, Shoeybi et al. 2019 section 3): token
and position embeddings, pre-LayerNorm blocks (a fused QKV projection, causal
``scaled_dot_product_attention``, an output projection; an MLP of width 4h with GELU), a final
LayerNorm and an output layer of its own (not tied to the embedding), per-token cross entropy.
Two choices make its tensor-parallel step match the unplaced one (`placer run`, rtol 1e-4): no
dropout (the split step draws other masks) and no QKV bias (a key bias's gradient is zero in
exact arithmetic - softmax ignores a constant added to every key - and Adam's first step turns its
rounding noise, which any other order of the same sums changes, into an update of up to lr).
"""

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """LayerNorm -> fused QKV -> causal attention -> projection -> residual; LayerNorm -> MLP -> residual."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    """tokens[b, seq] -> embeddings -> ``layers`` blocks -> LayerNorm -> logits[b, seq, vocab] -> cross-entropy."""

    def __init__(self, layers: int = 4, d_model: int = 64, heads: int = 4, vocab: int = 256, seq: int = 32):
        super().__init__()
        self.vocab, self.seq = vocab, seq
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def example_inputs(self, batch):
        return (torch.randint(0, self.vocab, (batch, self.seq)),)

    def example_target(self, batch):
        return torch.randint(0, self.vocab, (batch, self.seq))

    def loss(self, output, target):
        return F.cross_entropy(output.reshape(-1, self.vocab), target.reshape(-1))
