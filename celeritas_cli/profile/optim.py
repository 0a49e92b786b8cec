"""The optimizer update placer executes and times: one Adam step with the
arithmetic of ``torch.optim.Adam(foreach=False)``.  ``placer profile
--measure`` times it for ``optim.adam`` nodes and ``placer run`` executes it
(:mod:`celeritas_cli.run.executor`), so both use the same arithmetic."""

from __future__ import annotations


def adam_update(param, grad, exp_avg, exp_avg_sq, step: int, lr: float = 1.0e-3, betas=(0.9, 0.999),
                eps: float = 1.0e-8):
    """One Adam step (Kingma & Ba 2015, Algorithm 1) with the arithmetic of
    ``torch.optim.Adam(foreach=False)``; moments in place, parameter out of place.

    Returns
    -------
    The updated parameter (a new tensor).

    Example
    -------
    >>> import torch
    >>> p, g = torch.ones(2), torch.tensor([0.5, -2.0])
    >>> adam_update(p, g, torch.zeros(2), torch.zeros(2), 1, lr=0.1)
    tensor([0.9000, 1.1000])
    """
    beta1, beta2 = betas
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(eps)
    return param.addcdiv(exp_avg, denom, value=-(lr / bias_correction1))
