"""The Hierarchical Planner's policy networks (Mirhoseini et al., "A
Hierarchical Model for Device Placement", section 2), in PyTorch.

* :class:`Grouper` - a feed-forward network that maps every operation's
  features (op-type embedding, output sizes and count, adjacency) to a
  softmax over ``G`` groups; a colocation unit's logits are the mean of its
  members' logits, so all nodes of a unit share one grouping decision.
* :class:`Placer` - a sequence-to-sequence model: a bidirectional LSTM
  encoder reads the ``G`` group embeddings one at a time; an LSTM decoder
  with content-based (Bahdanau) attention over the encoder states emits one
  device per group, in the same order as the groups; each device has a
  trainable embedding that is fed as the next decoder input.
* :func:`masked_groups` - the Grouper's draw under memory constraints
  (the planner's ``oom_mode="mask"``).
* :func:`group_embeddings` - the Placer's input: per group the concatenation
  of the mean member type embedding, the mean member size features and the
  intra/inter-group connectivity (a row and a column of the group adjacency
  matrix).

torch is needed to *use* these classes but not to import this module (the
classes derive from ``torch.nn.Module`` only when torch is installed), so the
package and its doctests import without the torch extra.  The training loop
lives in :mod:`celeritas_cli.algorithms.placers.hierarchical.training`.
"""

from __future__ import annotations

try:  # optional extra: pip install -e .[torch]
    import torch
    from torch import nn

    _Module = nn.Module
except ImportError:  # pragma: no cover - exercised only without the extra
    torch = None  # type: ignore[assignment]
    nn = None  # type: ignore[assignment]
    _Module = object  # type: ignore[assignment,misc]

TANH_CONSTANT = 1.0
"""Decoder logits are squashed to ``C * tanh(logits / C)`` (the released
HRL controller's ``tanh_constant``, default 1.0), which bounds how peaked the
device softmax can get and so keeps exploring (with 2 devices no group goes
to one device with probability above 0.88)."""


def add_logits_noise(logits, std: float, generator=None):
    """The released controller's exploration noise (``logits_std_noise``):
    Gaussian noise with standard deviation ``std`` times the RMS of the
    logits (treated as a constant), added before sampling; 0 disables it."""
    if std <= 0:
        return logits
    scale = std * logits.detach().pow(2).mean().sqrt()
    noise = torch.randn(logits.shape, generator=generator, dtype=logits.dtype)
    return logits + scale * noise


class Grouper(_Module):
    """Feed-forward Grouper: ``[type embedding ; numeric features] -> hidden
    (ReLU) -> G logits`` per operation (HRL section 2, "The Grouper is a feed
    forward model").

    Parameters
    ----------
    n_types, type_dim : int
        Number of distinct op types and size of their trainable embedding.
    feat_dim : int
        Size of the numeric per-operation features.
    hidden : int
        Hidden layer width.
    groups : int
        Number of groups ``G`` (the softmax width).
    """

    def __init__(self, n_types: int, type_dim: int, feat_dim: int, hidden: int, groups: int):
        super().__init__()
        self.type_emb = nn.Embedding(max(n_types, 1), type_dim)
        self.ff = nn.Sequential(nn.Linear(type_dim + feat_dim, hidden), nn.ReLU(), nn.Linear(hidden, groups))

    def forward(self, type_idx, feats, unit_of, n_units: int, *, noise: float = 0.0, generator=None):
        """Log-probabilities ``[U, G]`` of every colocation unit's group.

        Node logits are averaged over the nodes of a unit (``unit_of[v]``),
        perturbed by :func:`add_logits_noise` and normalised with
        ``log_softmax``.
        """
        x = torch.cat([self.type_emb(type_idx), feats], dim=1)
        logits = self.ff(x)
        summed = torch.zeros(n_units, logits.shape[1], dtype=logits.dtype).index_add(0, unit_of, logits)
        counts = torch.zeros(n_units, dtype=logits.dtype).index_add(
            0, unit_of, torch.ones_like(unit_of, dtype=logits.dtype))
        logits = add_logits_noise(summed / counts.unsqueeze(1), noise, generator)
        return torch.log_softmax(logits, dim=1)


def group_embeddings(node_group, type_vec, size_feats, unit_src, unit_dst, unit_w, groups: int):
    """Group embeddings for ``S`` sampled groupings (HRL section 2).

    Parameters
    ----------
    node_group : LongTensor ``[S, n]``
        Group of every node in each sample.
    type_vec : Tensor ``[n, T]``
        Type embedding of every node (may carry gradient).
    size_feats : Tensor ``[n, F]``
        Per-node size features (output sizes, output count, compute, memory,
        topological position) averaged per group.
    unit_src, unit_dst : LongTensor ``[E']``; unit_w : Tensor ``[E']``
        Node-level edges (source node, destination node, normalised bytes).
    groups : int
        ``G``.

    Returns
    -------
    Tensor ``[S, G, T + F + 1 + 2G]``
        ``[mean type embedding ; mean size features ; member share ;
        adjacency row ; adjacency column]``: the adjacency matrix
        ``A[g, h]`` sums the (normalised) bytes of edges from group g to
        group h, its diagonal is the intra-group connectivity; each group's
        row+column block is divided by its largest entry (the released
        controller divides the group embedding by its max + 1).  Empty groups
        get zeros.
    """
    S, n = node_group.shape
    G = groups
    dt = size_feats.dtype
    out = []
    ones = torch.ones(n, dtype=dt)
    for s in range(S):
        g = node_group[s]
        cnt = torch.zeros(G, dtype=dt).index_add(0, g, ones)
        denom = cnt.clamp(min=1.0).unsqueeze(1)
        mean_type = torch.zeros(G, type_vec.shape[1], dtype=dt).index_add(0, g, type_vec) / denom
        mean_size = torch.zeros(G, size_feats.shape[1], dtype=dt).index_add(0, g, size_feats) / denom
        adj = torch.zeros(G * G, dtype=dt)
        if unit_src.numel():
            adj = adj.index_add(0, g[unit_src] * G + g[unit_dst], unit_w)
        adj = adj.view(G, G)
        conn = torch.cat([adj, adj.t()], dim=1)
        conn = conn / conn.amax(dim=1, keepdim=True).clamp(min=1e-12)
        out.append(torch.cat([mean_type, mean_size, (cnt / max(n, 1)).unsqueeze(1), conn], dim=1))
    return torch.stack(out)


def masked_groups(logp_unit, unit_mem, cap: float, samples: int, greedy: bool, gen):
    """Sample (or take the argmax of) a group per unit from the Grouper's
    ``logp_unit`` ``[U, M]``, units in index order, never putting a unit in
    a group it would make larger than the largest device (``oom_mode="mask"``;
    when no group has room, the lightest group).  Returns ``(g_unit [S, U],
    log_prob [S])``, the log-probability of the masked draws (differentiable
    with respect to ``logp_unit``).

    The draws run in numpy (inverse CDF of ``torch.rand`` numbers from
    *gen*, so a seed repeats); only units with memory are drawn one after
    the other, then the masked log-probabilities are one tensor operation.
    """
    import numpy as np

    U, M = logp_unit.shape
    S = samples
    probs = logp_unit.detach().exp().to(torch.float64).numpy()  # [U, M]
    draws = torch.rand(S, U, generator=gen, dtype=torch.float64).numpy()
    mem = [float(x) for x in unit_mem]
    g_unit = np.zeros((S, U), dtype=np.int64)
    mask = np.ones((S, U, M), dtype=bool)
    free = [u for u in range(U) if mem[u] <= 0.0]
    if free:  # no memory: cannot make a group overflow, drawn together
        if greedy:
            g_unit[:, free] = probs[free].argmax(axis=1)[None, :]
        else:
            cdf = np.cumsum(probs[free], axis=1)  # [F, M]
            thr = draws[:, free, None] * cdf[None, :, -1:]  # [S, F, 1]
            g_unit[:, free] = np.minimum((cdf[None, :, :] <= thr).sum(axis=2), M - 1)
    load = np.zeros((S, M))
    rows = np.arange(S)
    for u in range(U):
        if mem[u] <= 0.0:
            continue
        room = load + mem[u] <= cap  # [S, M]
        none = ~room.any(axis=1)
        if none.any():
            room[none] = False
            room[none, load[none].argmin(axis=1)] = True
        mask[:, u] = room
        p = probs[u][None, :] * room
        if greedy:
            a = p.argmax(axis=1)
        else:
            cdf = np.cumsum(p, axis=1)
            a = np.minimum((cdf <= draws[:, u:u + 1] * cdf[:, -1:]).sum(axis=1), M - 1)
        g_unit[:, u] = a
        load[rows, a] += mem[u]
    g = torch.from_numpy(g_unit)
    masked = logp_unit.unsqueeze(0).expand(S, U, M).masked_fill(~torch.from_numpy(mask), float("-inf"))
    lp = torch.log_softmax(masked, dim=2).gather(2, g.unsqueeze(2)).squeeze(2).sum(dim=1)
    return g, lp


class Placer(_Module):
    """Sequence-to-sequence Placer (HRL section 2): bidirectional LSTM
    encoder over the group embeddings, LSTM decoder with content-based
    attention [Bahdanau et al. 2015] emitting one device per group, trainable
    device embeddings fed back as the next decoder input (a trainable "go"
    embedding at the first step).

    Parameters
    ----------
    emb_dim : int
        Size of a group embedding.
    hidden : int
        Decoder / attention width (the encoder has ``hidden // 2`` per
        direction, as in the released controller's ``bi_lstm``).
    devices : int
        Number of devices ``k``.
    """

    def __init__(self, emb_dim: int, hidden: int, devices: int):
        super().__init__()
        half = max(hidden // 2, 1)
        hidden = 2 * half
        self.hidden = hidden
        self.encoder = nn.LSTM(emb_dim, half, batch_first=True, bidirectional=True)
        self.decoder = nn.LSTMCell(hidden, hidden)
        self.device_emb = nn.Embedding(devices, hidden)
        self.go = nn.Parameter(torch.zeros(hidden).uniform_(-0.1, 0.1))
        self.attn_w1 = nn.Linear(hidden, hidden, bias=False)
        self.attn_w2 = nn.Linear(hidden, hidden, bias=False)
        self.attn_v = nn.Linear(hidden, 1, bias=False)
        self.out = nn.Linear(2 * hidden, devices)

    def forward(self, emb, *, generator=None, greedy: bool = False, noise: float = 0.0, group_mem=None,
                capacity=None):
        """Sample (or, with ``greedy``, take the argmax of) one device per
        group for each of the ``S`` rows of ``emb`` ``[S, G, E]``.

        ``noise`` is :func:`add_logits_noise`'s ``std``.  With ``group_mem``
        (``[S, G]`` bytes of every group, float64) and ``capacity`` (``[k]``
        bytes per device, float64) the decoder masks the devices a group no
        longer fits on, given the groups placed before it (a deviation from
        HRL, see the planner's ``oom_mode="mask"``); when it fits nowhere,
        only the device with the most free memory is left (best effort).
        The log-probability is that of the masked distribution.
        Returns ``(devices [S, G] long, log_prob [S])``.
        """
        S, G, _ = emb.shape
        enc, (h_n, c_n) = self.encoder(emb)
        # final states of both directions -> decoder's initial state
        h = torch.cat([h_n[0], h_n[1]], dim=1)
        c = torch.cat([c_n[0], c_n[1]], dim=1)
        mem = self.attn_w1(enc)  # [S, G, H]
        x = self.go.unsqueeze(0).expand(S, -1)
        actions = []
        logp = torch.zeros(S, dtype=emb.dtype)
        load = None if group_mem is None else torch.zeros(S, capacity.shape[0], dtype=torch.float64)
        for g in range(G):
            h, c = self.decoder(x, (h, c))
            score = self.attn_v(torch.tanh(self.attn_w2(h).unsqueeze(1) + mem)).squeeze(2)  # [S, G]
            ctx = (torch.softmax(score, dim=1).unsqueeze(2) * mem).sum(dim=1)
            logits = self.out(torch.cat([h, ctx], dim=1))
            logits = TANH_CONSTANT * torch.tanh(logits / TANH_CONSTANT)
            logits = add_logits_noise(logits, noise, generator)
            if load is not None:
                need = group_mem[:, g].unsqueeze(1)  # [S, 1]
                room = load + need <= capacity  # [S, k]
                most_free = torch.nn.functional.one_hot((capacity - load).argmax(dim=1), capacity.shape[0]).bool()
                room = torch.where(room.any(dim=1, keepdim=True), room, most_free)
                logits = logits.masked_fill(~room, float("-inf"))
            lp = torch.log_softmax(logits, dim=1)
            if greedy:
                a = lp.argmax(dim=1)
            else:
                a = torch.multinomial(lp.exp(), 1, generator=generator).squeeze(1)
            logp = logp + lp.gather(1, a.unsqueeze(1)).squeeze(1)
            actions.append(a)
            if load is not None:
                load = load + need * torch.nn.functional.one_hot(a, capacity.shape[0]).to(torch.float64)
            x = self.device_emb(a)
        return torch.stack(actions, dim=1), logp
