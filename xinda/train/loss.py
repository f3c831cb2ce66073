"""Label-smoothed cross-entropy (Szegedy et al. 2016), summed over non-pad target tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from xinda.data.batching import Batch, collate, make_batches
from xinda.device import autocast
from xinda.models.base import Seq2SeqModel


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
        nll_sum = nll.masked_fill(~real, 0.0).sum()
        ctx.mark_non_differentiable(nll_sum)  # logged only, like the chunked path's
        return loss.sum(), nll_sum

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


class _ChunkedOutputLoss(torch.autograd.Function):
    """Output projection + label-smoothed loss over chunks of target positions: the same
    values and gradients as ``output(hidden)`` followed by ``label_smoothed_nll``, but no
    (N, V) tensor of the whole batch is ever alive. The gradients w.r.t. hidden states and
    output weights are computed chunk by chunk during the forward pass (for a loss gradient
    of 1) and only those, (N, D) and (V, D), are kept for backward, which scales them.

    hidden (N, D) non-pad rows only, weight (V, D), bias (V,) or None, target (N,); matmuls
    run in ``dtype`` (the autocast dtype, as ``nn.Linear`` would), softmax in float32."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor,
                epsilon: float, chunk: int, dtype: torch.dtype, grads: bool):
        w = weight.to(dtype)
        b = None if bias is None else bias.to(dtype)
        loss = hidden.new_zeros((), dtype=torch.float32)
        nll = loss.clone()
        grad_h = torch.empty_like(hidden, dtype=torch.float32) if grads else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if grads else None
        grad_b = None if bias is None or not grads else torch.zeros_like(bias, dtype=torch.float32)
        for start in range(0, hidden.size(0), chunk):
            h, y = hidden[start:start + chunk].to(dtype), target[start:start + chunk]
            logits = h @ w.t() if b is None else torch.addmm(b, h, w.t())  # z = h W^T + b
            loss_c, nll_c, g = _chunk_loss(logits, y, epsilon, grads)
            loss, nll = loss + loss_c, nll + nll_c
            if grads:
                g = g.to(dtype)
                grad_h[start:start + chunk] = g @ w  # d loss / d h = (p - q) W
                grad_w += g.t() @ h  # d loss / d W = (p - q)^T h
                if grad_b is not None:
                    grad_b += g.sum(0, dtype=torch.float32)  # d loss / d b = sum of (p - q)
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.dtypes = hidden.dtype, weight.dtype
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        h_dtype, w_dtype = ctx.dtypes
        grad_b = None if grad_b is None else (grad_b * grad_loss).to(w_dtype)
        return ((grad_h * grad_loss).to(h_dtype), (grad_w * grad_loss).to(w_dtype), grad_b,
                None, None, None, None, None)


def _chunk_loss(logits: Tensor, target: Tensor, epsilon: float,
                grads: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """Summed smoothed loss and NLL of the rows of ``logits`` (n, V), and d loss / d logits
    (float32, in the memory of the softmax) when ``grads``."""
    z = logits.float()
    p = torch.softmax(z, dim=-1)  # p = softmax(z)
    # logsumexp(z) = max(z) - log max(p), exact and safe: the largest probability is >= 1 / V
    lse = z.amax(dim=-1) - p.amax(dim=-1).log()
    nll = (lse - z.gather(-1, target.unsqueeze(-1)).squeeze(-1)).sum()  # -log p_y = lse - z_y
    # loss = (1 - eps) * (-log p_y) + eps * mean_v(-log p_v), mean_v(-log p_v) = lse - mean(z)
    loss = (1.0 - epsilon) * nll + epsilon * (lse - z.mean(dim=-1)).sum()
    if not grads:
        return loss, nll, None
    # d loss / d z = p - q, q = (1 - eps) * onehot(y) + eps / V
    p.scatter_add_(-1, target.unsqueeze(-1), torch.full_like(p[:, :1], -(1.0 - epsilon)))
    return loss, nll, p.sub_(epsilon / p.size(-1))


def chunked_output_loss(hidden: Tensor, output: torch.nn.Linear, target: Tensor,
                        epsilon: float, pad: int, chunk: int) -> tuple[Tensor, Tensor]:
    """``label_smoothed_nll(output(hidden), target, ...)`` computed ``chunk`` target positions
    at a time (``_ChunkedOutputLoss``); pad positions are skipped. hidden (B, T, D), target
    (B, T). Under autocast the projection runs in the autocast dtype, like ``output``."""
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else (
        output.weight.dtype)
    flat, target = hidden.reshape(-1, hidden.size(-1)), target.reshape(-1)
    real = target.ne(pad).nonzero().squeeze(-1)  # rows that count
    grads = torch.is_grad_enabled() and (hidden.requires_grad or output.weight.requires_grad)
    return _ChunkedOutputLoss.apply(flat.index_select(0, real), output.weight, output.bias,
                                    target.index_select(0, real), epsilon, chunk, dtype, grads)


@dataclass(frozen=True)
class LossSetup:
    """How a batch's loss is computed: label smoothing, pad id, ``train.loss_chunk`` (0 = the
    full logits) and the autocast precision/device."""

    epsilon: float
    pad: int
    chunk: int
    precision: str
    device: torch.device


def batch_loss(net: torch.nn.Module, model: Seq2SeqModel, batch: Batch,
               setup: LossSetup) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss and NLL of ``batch`` under ``net`` (``model``, or it wrapped
    in DistributedDataParallel): chunk by chunk from the decoder states when ``setup.chunk``
    and the model (``has_hidden``) allow it, else from the full logits."""
    with autocast(setup.precision, setup.device):
        if setup.chunk and model.has_hidden:
            hidden = net(batch.src, batch.prev, hidden=True)
            return chunked_output_loss(hidden, model.output, batch.target, setup.epsilon,
                                       setup.pad, setup.chunk)
        logits = net(batch.src, batch.prev)
    return label_smoothed_nll(logits, batch.target, setup.epsilon, setup.pad)


@torch.no_grad()
def corpus_loss(model: Seq2SeqModel, split: tuple, max_tokens: int, setup: LossSetup,
                vocab) -> dict[str, float]:
    """Per-token smoothed loss and NLL of ``model`` (in eval mode) on the (source, target)
    ``TokenArrays`` of ``split``, in length-sorted batches of ``max_tokens``."""
    src, tgt = split
    loss_sum = nll_sum = tokens = 0
    for idx in make_batches(src.lengths, tgt.lengths, max_tokens, 0, 0, shuffle=False):
        b = collate(idx, src, tgt, vocab.pad, vocab.bos, vocab.eos).to(setup.device)
        loss, nll = batch_loss(model, model, b, setup)
        loss_sum, nll_sum, tokens = loss_sum + float(loss), nll_sum + float(nll), tokens + b.ntokens
    return {"loss": loss_sum / tokens, "nll": nll_sum / tokens}
