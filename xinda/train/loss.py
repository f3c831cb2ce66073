"""Label-smoothed cross-entropy (Szegedy et al. 2016), summed over non-pad target tokens."""

from __future__ import annotations

import torch
from torch import Tensor

from xinda.data.batching import collate, make_batches
from xinda.device import autocast


def label_smoothed_nll_reference(logits: Tensor, target: Tensor, epsilon: float,
                                 pad: int) -> tuple[Tensor, Tensor]:
    """Label smoothing, written out: q = (1 - eps) * onehot(y) + eps / V,
    loss = -sum_v q_v log p_v = (1 - eps) * (-log p_y) + eps * mean_v(-log p_v).

    logits (B, T, V), target (B, T). Returns (smoothed loss, plain NLL), each summed over the
    non-pad tokens, in float32.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T)
    smooth = -logp.mean(dim=-1)  # (B, T)
    loss = (1.0 - epsilon) * nll + epsilon * smooth
    real = target.ne(pad)
    return loss.masked_fill(~real, 0.0).sum(), nll.masked_fill(~real, 0.0).sum()


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Same values as the reference; the backward pass uses the closed form
    d loss / d logits = softmax(logits) - q on non-pad rows (no gather/mean graph), which
    saves one V-wide pass and its temporaries on every training step."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad: int):
        logp = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
        nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (N,)
        real = target.ne(pad)
        loss = ((1.0 - epsilon) * nll + epsilon * -logp.mean(dim=-1)).masked_fill(~real, 0.0)
        ctx.save_for_backward(logp, target, real)
        ctx.epsilon, ctx.dtype = epsilon, logits.dtype
        ctx.mark_non_differentiable(nll)
        return loss.sum(), nll.masked_fill(~real, 0.0).sum()

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        logp, target, real = ctx.saved_tensors
        eps, vocab = ctx.epsilon, logp.size(-1)
        grad = logp.exp_().sub_(eps / vocab)  # softmax - eps / V (reuses logp's memory)
        grad.scatter_add_(-1, target.unsqueeze(-1),
                          torch.full_like(grad[:, :1], -(1.0 - eps)))  # - (1 - eps) at y
        grad.mul_(real.unsqueeze(-1) * grad_loss)
        return grad.to(ctx.dtype), None, None, None


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float,
                       pad: int) -> tuple[Tensor, Tensor]:
    """Label-smoothed loss and NLL (see ``label_smoothed_nll_reference``), summed over non-pad
    tokens. logits (B, T, V), target (B, T)."""
    flat = logits.reshape(-1, logits.size(-1))
    return _SmoothedCrossEntropy.apply(flat, target.reshape(-1), epsilon, pad)


@torch.no_grad()
def corpus_loss(model: torch.nn.Module, split: tuple, vocab, max_tokens: int, epsilon: float,
                precision: str, device: torch.device) -> dict[str, float]:
    """Per-token smoothed loss and NLL of ``model`` (in eval mode) on the (source, target)
    ``TokenArrays`` of ``split``, in length-sorted batches of ``max_tokens``."""
    src, tgt = split
    loss_sum = nll_sum = tokens = 0
    for idx in make_batches(src.lengths, tgt.lengths, max_tokens, 0, 0, shuffle=False):
        b = collate(idx, src, tgt, vocab.pad, vocab.bos, vocab.eos).to(device)
        with autocast(precision, device):
            logits = model(b.src, b.prev)
        loss, nll = label_smoothed_nll(logits, b.target, epsilon, vocab.pad)
        loss_sum, nll_sum, tokens = loss_sum + float(loss), nll_sum + float(nll), tokens + b.ntokens
    return {"loss": loss_sum / tokens, "nll": nll_sum / tokens}
