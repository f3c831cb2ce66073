"""Gradient accumulation (``train.update_freq``): fewer, larger updates over the same data."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import torch

from xinda.config import load_config
from xinda.data.batching import make_batches
from xinda.train.trainer import Trainer

MAX_TOKENS = 500


def train_one_epoch(config, out_dir, update_freq: int) -> dict:
    cfg = load_config(config, [f"train.update_freq={update_freq}", f"train.out_dir={out_dir}",
                               "train.max_epochs=1", "train.max_steps=0", "train.log_every=1",
                               "train.run_validation=false", f"train.max_tokens={MAX_TOKENS}"])
    progress = Trainer(cfg).train()
    stats = json.loads((out_dir / "train_stats.json").read_text(encoding="utf-8"))
    assert stats["steps"] == progress.step
    with (out_dir / "log.csv").open(newline="") as f:
        stats["logged_steps"] = [int(row["step"]) for row in csv.DictReader(f) if row["lr"]]
    return stats


def test_update_freq_2_halves_updates_per_epoch(prepared, tmp_path):
    from xinda.data.manifest import load_split

    src, tgt = load_split(prepared.data_dir, "train")
    batches = len(make_batches(src.lengths, tgt.lengths, MAX_TOKENS, 1, 1))
    assert batches >= 3

    one = train_one_epoch(prepared.config, tmp_path / "uf1", 1)
    two = train_one_epoch(prepared.config, tmp_path / "uf2", 2)
    assert one["steps"] == batches
    assert two["steps"] == math.ceil(batches / 2)
    assert one["logged_steps"] == list(range(1, one["steps"] + 1))
    assert two["logged_steps"] == list(range(1, two["steps"] + 1))
    # the same epoch of data either way: every target token trained on exactly once
    assert one["tgt_tokens"] == two["tgt_tokens"] == int(tgt.lengths.sum() + len(tgt))
    assert one["epochs_done"] == two["epochs_done"] == 1


def test_accumulated_update_equals_one_big_batch(prepared, tmp_path):
    """update([b1, b2]) == update([b1 + b2]): gradients are normalised by the group's target
    tokens, so accumulating two batches is one batch of their union (no dropout, fp32, SGD)."""
    overrides = ["model.dropout=0", "model.attention_dropout=0", "model.activation_dropout=0",
                 "train.precision=fp32", "train.optimizer=sgd", "train.lr=1.0",
                 "train.schedule=constant", "train.warmup_steps=0", "train.label_smoothing=0.1",
                 f"train.out_dir={tmp_path}"]
    cfg = load_config(prepared.config, overrides)
    accumulated, single, first_only = Trainer(cfg), Trainer(cfg), Trainer(cfg)
    start = {k: v.clone() for k, v in accumulated.model.state_dict().items()}
    for trainer in (single, first_only):  # same seed -> same initial weights
        for name, tensor in trainer.model.state_dict().items():
            assert torch.equal(tensor, start[name])

    b1, b2 = make_batches(accumulated.train_src.lengths, accumulated.train_tgt.lengths,
                          MAX_TOKENS, 1, 1)[:2]
    loss_acc, _, ntok_acc = accumulated.update([b1, b2])
    loss_one, _, ntok_one = single.update([np.concatenate([b1, b2])])
    first_only.update([b1])
    assert ntok_acc == ntok_one
    assert math.isclose(loss_acc, loss_one, rel_tol=1e-5)

    after_acc = accumulated.model.state_dict()
    after_one = single.model.state_dict()
    after_first = first_only.model.state_dict()
    moved = differs_from_first = False
    for name, tensor in after_acc.items():
        torch.testing.assert_close(tensor, after_one[name], rtol=1e-4, atol=1e-6)
        moved |= not torch.equal(tensor, start[name])
        differs_from_first |= not torch.allclose(tensor, after_first[name], atol=1e-6)
    assert moved and differs_from_first
