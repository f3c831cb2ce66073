"""``Progress``, the training loop's (``xinda.train.trainer``) record of where a run stands."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from xinda.config import ExperimentConfig, TrainConfig

log = logging.getLogger("xinda")


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint so a resumed run continues exactly."""

    step: int = 0  # updates done
    epoch: int = 1  # current epoch (1-based)
    batch: int = 0  # next batch of the current epoch (of all ranks' batches)
    tgt_tokens: int = 0  # target tokens trained on (incl. EOS), all ranks
    # wall clock of the training loop but its validations: updates, batching, checkpoints
    train_seconds: float = 0.0
    wall_seconds: float = 0.0  # wall clock of the training loops, validation included
    best: float = -math.inf  # best validation score (BLEU, or -loss): best.safetensors'
    best_loss: float = math.inf  # its validation loss, which breaks BLEU ties (see ``beats``)
    best_metric: str = ""  # what ``best`` measures (``validation_metric``; before: bleu, loss)
    # the best score of an epoch's end, which early stopping compares with (the validation
    # of a run that a limit stopped inside an epoch may set ``best``, not this: a resumed run
    # stops where an uninterrupted one would); None in checkpoints from before it: ``best``
    epoch_best: float | None = None
    epoch_best_loss: float = math.inf
    bad_epochs: int = 0  # epochs since the best one
    # the update after which the run last validated (an epoch end, ``train.valid_every``, or the
    # end of a run stopped inside an epoch); None in checkpoints from before it: ``step``
    validated_step: int | None = None
    # the update after which an epoch's end last counted for early stopping; None in
    # checkpoints from before it: ``validated_step``
    counted_step: int | None = None
    # the score and loss of the validation at ``validated_step``, under ``best_metric``: what
    # an epoch's end counts when fp16 skipped the updates after a mid-epoch validation
    validated_score: list[float] | None = None
    lr_resets: list[int] = field(default_factory=list)  # steps after which the model was grown
    # loss, NLL, target tokens and seconds of the updates since the last log row (across epoch
    # ends and resumes: every update is in exactly one row)
    log_window: list[float] = field(default_factory=lambda: [0.0, 0.0, 0, 0.0])

    def __post_init__(self) -> None:
        if not self.best_metric and math.isfinite(self.best):  # saved before it was recorded
            self.best_metric = "bleu" if self.best >= 0 else "loss"
        if self.epoch_best is None:
            self.epoch_best, self.epoch_best_loss = self.best, self.best_loss
        if self.validated_step is None:
            self.validated_step = self.step
        if self.counted_step is None:
            self.counted_step = self.validated_step

    @contextmanager
    def timed(self) -> Iterator[None]:
        """Count the block's wall clock in ``train_seconds``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.train_seconds += time.perf_counter() - start

    def limits_reached(self, tc: TrainConfig, wall_seconds: float) -> list[str]:
        """The update and time limits (``train.max_steps``, ``max_seconds``) reached."""
        limits = [(tc.max_steps and self.step >= tc.max_steps, f"train.max_steps {tc.max_steps}"),
                  (tc.max_seconds and wall_seconds >= tc.max_seconds,
                   f"train.max_seconds {tc.max_seconds:g}")]
        return [name for hit, name in limits if hit]

    def stopped_early(self, tc: TrainConfig, has_valid: bool) -> bool:
        """Whether early stopping has triggered (without validation patience has no effect)."""
        return bool(tc.patience and tc.run_validation and has_valid
                    and self.bad_epochs >= tc.patience)

    def use_metric(self, metric: str) -> None:
        """Validations score by ``metric`` from now on: another metric than the best score's
        starts the best scores and early stopping's count over."""
        if not same_metric(self.best_metric, metric):
            log.warning("validation now scores by %s, not %s: the best score and early "
                        "stopping's count start over", metric, self.best_metric)
            self.reset_best()
        self.best_metric = metric

    def reset_best(self) -> None:
        """Forget the best scores and early stopping's count (the scores change meaning)."""
        self.best = self.epoch_best = -math.inf
        self.best_loss = self.epoch_best_loss = math.inf
        self.bad_epochs, self.validated_score = 0, None


def beats(score: float, loss: float, best: float, best_loss: float) -> bool:
    """Whether a validation (score, loss) beats the best one: a higher score, or the same
    score at a lower loss (BLEU ties, such as 0.0 in early epochs, would stop a run whose
    loss still falls; with the loss as the score, a tie is a tie)."""
    return (score, -loss) > (best, -best_loss)


ON_VALID = " on valid "  # what validation_metric names the validation set by


def validation_metric(cfg: ExperimentConfig, bleu: bool, valid: dict) -> str:
    """What a validation score measures, with the settings that change it and the validation
    set (``valid``: its manifest entry): a best score or an early-stopping count under other
    ones means nothing (found by review: a resume with another label smoothing stopped at
    once, and froze best.safetensors; another validation set went unnoticed)."""
    on = f"{ON_VALID}{valid.get('pairs')} pairs, {valid.get('tgt_tokens')} target tokens"
    if not bleu:
        return f"loss (label smoothing {cfg.train.label_smoothing:g}){on}"
    d = cfg.decode
    return (f"bleu (beam {cfg.train.valid_beam}, alpha {d.alpha:g}, coverage {d.coverage:g}, "
            f"length {d.max_len_a:g}x+{d.max_len_b}, stop {d.stop}, inputs {d.max_input_len})"
            f"{on}")


def same_metric(saved: str, metric: str) -> bool:
    """Whether a best score saved under ``saved`` still counts under ``metric`` (a checkpoint
    from before the set was named, or before the settings were, names less)."""
    return saved in ("", metric, metric.split()[0], metric.split(ON_VALID)[0])


def warn_nothing_left(tc: TrainConfig, p: Progress, resumed_at: int, wall_seconds: float,
                      stopped_early: bool) -> None:
    """Say which limits a resumed run that trained no update had reached, every one of them
    (raising one alone would train nothing). Its last line counts the run's updates."""
    if not resumed_at or p.step != resumed_at:
        return
    reached = [*p.limits_reached(tc, wall_seconds),
               *([f"train.patience {tc.patience} (early stopping)"] if stopped_early else []),
               *([f"train.max_epochs {tc.max_epochs}"] if p.epoch > tc.max_epochs else [])]
    reached = reached or ["its limits"]
    log.warning("--resume: nothing left to train: the run had reached %s at update %d; raise "
                "%s with --set to train on", " and ".join(reached), p.step,
                "it" if len(reached) == 1 else "them")
