"""Label-smoothed cross-entropy (Szegedy et al. 2016), summed over non-pad target tokens."""

from __future__ import annotations

import torch
from torch import Tensor


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float,
                       pad: int) -> tuple[Tensor, Tensor]:
    """Label smoothing: q = (1 - eps) * onehot(y) + eps / V, loss = -sum_v q_v log p_v
    = (1 - eps) * (-log p_y) + eps * mean_v(-log p_v).

    logits (B, T, V), target (B, T). Returns (smoothed loss, plain NLL), each summed over the
    non-pad tokens; log-probabilities are computed in float32 even under bf16 autocast.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T)
    smooth = -logp.mean(dim=-1)  # (B, T)
    loss = (1.0 - epsilon) * nll + epsilon * smooth
    real = target.ne(pad)
    return loss.masked_fill(~real, 0.0).sum(), nll.masked_fill(~real, 0.0).sum()
