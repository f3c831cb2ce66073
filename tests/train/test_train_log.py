"""The training log's rows: every update in exactly one row, across epoch ends, and the NLL
averaged like the loss; the logged NLL carries no gradient on either loss path."""

from __future__ import annotations

import types

import pytest
import torch

from xinda.config import TrainConfig
from xinda.train.curves import CsvLog
from xinda.train.distributed import Ranks
from xinda.train.loss import chunked_output_loss, label_smoothed_nll
from xinda.train.signals import StopSignals
from xinda.train.trainer import Progress, Trainer


def test_log_rows_average_every_update_since_the_previous_row_across_epochs():
    """6 updates per epoch, a row every 4: update s has per-token loss s and NLL s / 10.
    Before: the window was dropped at each epoch end (row 2: 7.5) and the NLL was the last
    update's (0.4, 0.8, 1.2)."""
    rows = []
    t = Trainer.__new__(Trainer)
    t.cfg = types.SimpleNamespace(train=TrainConfig(log_every=4, progress=False))
    t.progress, t.ranks, t.signals, t.lr = Progress(), Ranks(), StopSignals(), 1.0
    t._clock, t._wall_base = 0.0, 0.0
    t.csv = types.SimpleNamespace(write_window=lambda p, lr: CsvLog.write_window(
        types.SimpleNamespace(write=lambda **r: rows.append(r)), p, lr))

    def update(group):
        t.progress.step += 1
        return 10.0 * t.progress.step, 1.0 * t.progress.step, 10
    t.update = update
    for epoch in (1, 2):
        t.progress.epoch, t.progress.batch = epoch, 0
        t.train_epoch(list(range(6)))
    assert [r["train_loss"] for r in rows] == pytest.approx([2.5, 6.5, 10.5])
    assert [r["train_nll"] for r in rows] == pytest.approx([0.25, 0.65, 1.05])


def test_the_logged_nll_carries_no_gradient_on_either_loss_path():
    """Before: the fused path's NLL required grad (and backpropagated zeros); the chunked one's
    did not."""
    hidden, target = torch.randn(1, 3, 4, requires_grad=True), torch.tensor([[1, 2, 0]])
    output = torch.nn.Linear(4, 5)
    _, fused = label_smoothed_nll(output(hidden), target, 0.1, 0)
    _, chunked = chunked_output_loss(hidden, output, target, 0.1, 0, 2)
    assert not fused.requires_grad and not chunked.requires_grad
    assert fused.item() == pytest.approx(chunked.item(), rel=1e-5)
