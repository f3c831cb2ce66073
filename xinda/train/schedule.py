"""Optimisers and learning-rate schedules, built from ``TrainConfig``."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch

from xinda.config import TrainConfig
from xinda.errors import XindaError

log = logging.getLogger("xinda")

# About fairseq's --min-loss-scale 1e-4 (a power of two, as the scales are): an fp16 scale
# halved below it by overflow after overflow means the loss itself is not finite in fp16
MIN_LOSS_SCALE = 2.0**-13


def learning_rate(cfg: TrainConfig, step: int, d_model: int,
                  resets: Sequence[int] = ()) -> float:
    """Learning rate at update ``step`` (1-based) for the configured schedule; from the end of
    the warm-up on, at least ``min_lr``.

    - inverse_sqrt: linear warm-up 0 -> lr over ``warmup_steps``, then lr * sqrt(warmup / step)
      (fairseq's ``inverse_sqrt``);
    - noam: lr * d^-0.5 * min(step^-0.5, step * warmup^-1.5) (Vaswani eq. 3, with ``lr`` as
      the scale factor);
    - step: a linear warm-up, then lr * decay_factor^((step - warmup) // decay_every): the
      peak lr is reached at the end of the warm-up (update 1 without one) and held for
      ``decay_every`` updates, and the decays count from there;
    - constant: lr after a linear warm-up.

    ``resets``: the update counts after which the model was grown (``xinda grow``). After the
    latest reset r, every schedule restarts at its peak: update r + 1 + k runs at the rate of
    update warmup + k (warmup >= 1), the end of the warm-up followed by the schedule's own
    decay counted from the reset, so a constant rate stays constant.
    """
    step = max(step, 1)
    warm = cfg.warmup_steps
    if (last := max((r for r in resets if r < step), default=None)) is not None:
        # Learning-rate restart of shallow-to-deep training (Li et al. 2020)
        step = step - last - 1 + max(warm, 1)
    if cfg.schedule == "noam":
        if problem := noam_min_lr_problem(cfg, d_model):
            raise XindaError(problem)
        rate = cfg.lr * d_model**-0.5 * min(step**-0.5, step * max(warm, 1) ** -1.5)
    else:
        warmup = step / warm if warm and step < warm else 1.0
        if cfg.schedule == "inverse_sqrt":
            decay = math.sqrt(warm / step) if warm and step >= warm else 1.0
        elif cfg.schedule == "step":
            decay = cfg.decay_factor ** (max(step - max(warm, 1), 0) // cfg.decay_every)
        else:
            decay = 1.0
        rate = cfg.lr * warmup * decay
    return rate if step < warm else max(rate, cfg.min_lr)  # the floor holds after the warm-up


def warn_warmup(cfg: TrainConfig, resets: Sequence[int]) -> None:
    """Warn when ``max_steps`` ends the run inside its warm-up (not after a growth: the rate
    restarted at its peak)."""
    if 0 < cfg.max_steps < cfg.warmup_steps and not resets:
        log.warning("train.warmup_steps %d is more than train.max_steps %d: the learning rate "
                    "stops at %.3g of its peak", cfg.warmup_steps, cfg.max_steps,
                    cfg.max_steps / cfg.warmup_steps)


def noam_peak(cfg: TrainConfig, d_model: int) -> float:
    """The noam schedule's peak rate (Vaswani et al. 2017, eq. 3, at the warm-up's end)."""
    return cfg.lr * d_model**-0.5 * max(cfg.warmup_steps, 1) ** -0.5


def noam_min_lr_problem(cfg: TrainConfig, d_model: int) -> str | None:
    """What is wrong when noam's peak rate is below ``min_lr`` (config.py checks the other
    schedules, whose peak is ``lr``; noam's depends on the model's width)."""
    peak = noam_peak(cfg, d_model)
    if cfg.schedule == "noam" and cfg.min_lr > peak:
        return (f"train.min_lr {cfg.min_lr:g} is above noam's peak rate {peak:.3g} (lr x "
                f"d_model^-0.5 x warmup_steps^-0.5, d_model {d_model}): the rate would jump "
                "up after the warm-up")
    return None


def make_optimizer(cfg: TrainConfig, params) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                                weight_decay=cfg.weight_decay, fused=True)
    sgd = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum,
                          weight_decay=cfg.weight_decay, fused=True)
    if cfg.momentum:  # fused SGD's first step makes its buffers with torch.empty, then skips an
        for p in params:  # fp16 overflow: uninitialised momentum. Zeros: torch's first step
            sgd.state[p]["momentum_buffer"] = torch.zeros_like(p)
    return sgd


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def optimizer_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                   update: int, clip_norm: float = 0.0) -> bool:
    """Take update ``update``'s step through the loss scaler (fp16; a no-op one otherwise),
    after clipping the gradients' norm to ``clip_norm`` (0: no clipping). False when fp16
    gradients overflowed: the scaler skipped the step and halved its scale, and the update does
    not count (as in fairseq). A scale below ``MIN_LOSS_SCALE`` is a XindaError (before, the
    updates were skipped silently forever)."""
    scaler.unscale_(optimizer)
    if clip_norm:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, clip_norm)
    scaler.step(optimizer)  # syncs with the device to read whether the gradients overflowed
    scale = scaler.get_scale() if scaler.is_enabled() else 0.0  # step keeps it; update halves it
    scaler.update()
    if not scaler.is_enabled() or (new_scale := scaler.get_scale()) >= scale:
        return True
    if new_scale < MIN_LOSS_SCALE:
        raise XindaError(f"update {update}: fp16 overflowed at every update down to loss "
                         f"scale {new_scale:.3g}: the loss is not finite in fp16 (the training "
                         "diverged); lower train.lr, set train.clip_norm, or use precision "
                         "bf16 or fp32")
    log.info("update %d: the fp16 gradients overflowed: skipped, loss scale now %g", update,
             new_scale)
    return False
