"""Optimisers and learning-rate schedules, built from ``TrainConfig``."""

from __future__ import annotations

import math

import torch

from xinda.config import TrainConfig


def learning_rate(cfg: TrainConfig, step: int, d_model: int = 512) -> float:
    """Learning rate at update ``step`` (1-based) for the configured schedule.

    - inverse_sqrt: linear warm-up 0 -> lr over ``warmup_steps``, then lr * sqrt(warmup / step)
      (fairseq's ``inverse_sqrt``);
    - noam: lr * d^-0.5 * min(step^-0.5, step * warmup^-1.5) (Vaswani eq. 3, with ``lr`` as
      the scale factor);
    - step: lr * decay_factor^(step // decay_every) after a linear warm-up;
    - constant: lr after a linear warm-up.
    """
    step = max(step, 1)
    warm = cfg.warmup_steps
    if cfg.schedule == "noam":
        rate = cfg.lr * d_model**-0.5 * min(step**-0.5, step * max(warm, 1) ** -1.5)
    else:
        warmup = step / warm if warm and step < warm else 1.0
        if cfg.schedule == "inverse_sqrt":
            decay = math.sqrt(warm / step) if warm and step >= warm else 1.0
        elif cfg.schedule == "step":
            decay = cfg.decay_factor ** (step // cfg.decay_every)
        else:
            decay = 1.0
        rate = cfg.lr * warmup * decay
    return max(rate, cfg.min_lr)


def make_optimizer(cfg: TrainConfig, params) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                                weight_decay=cfg.weight_decay, foreach=True)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum,
                           weight_decay=cfg.weight_decay, foreach=True)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
