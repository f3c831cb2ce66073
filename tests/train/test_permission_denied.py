"""A folder that denies writing (EACCES) is a one-line XindaError naming the file, also as root.

tests/test_checkpoint_errors.py and tests/e2e/test_train_faults.py make read-only folders with
chmod, which root writes into anyway (those tests skip there). Here the creation of files in the
folder fails as it would in a read-only one: tempfile.mkstemp, by which every xinda write
starts (``xinda.utils.atomic_path``), raises PermissionError."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest
import torch
from tiny_experiment import number_words_experiment

from xinda.checkpoint import list_checkpoints, load_state, save_checkpoint
from xinda.config import ExperimentConfig
from xinda.errors import XindaError
from xinda.train.trainer import Trainer

DENIED = f"cannot write: {os.strerror(errno.EACCES)}"  # "Permission denied"


def deny_writing_in(monkeypatch, folder: Path) -> None:
    """Creating a file anywhere under ``folder`` fails with EACCES (a read-only folder)."""
    real = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).resolve().is_relative_to(folder.resolve()):
            tmp = Path(dir) / f"{kwargs.get('prefix', '')}x{kwargs.get('suffix', '')}"
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(tmp))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


@pytest.mark.parametrize("step", [3, 2], ids=["new-step", "step-again"])
def test_a_checkpoint_folder_denying_writes_is_one_line_and_loses_nothing(tmp_path, monkeypatch,
                                                                          step):
    """The message names the checkpoint's weights file; steps 1 and 2 stay complete."""
    model = torch.nn.Linear(3, 2)
    for saved in (1, 2):
        save_checkpoint(tmp_path, saved, model, {"progress": {"step": saved}}, keep_last=5)
    folder = tmp_path / "checkpoints"
    before = sorted(p.name for p in folder.iterdir())
    deny_writing_in(monkeypatch, folder)
    with pytest.raises(XindaError) as err:
        save_checkpoint(tmp_path, step, model, {"progress": {"step": step}}, keep_last=5)
    assert str(err.value) == f"{folder / f'step_000000{step}.safetensors'}: {DENIED}"
    monkeypatch.undo()
    assert sorted(p.name for p in folder.iterdir()) == before
    assert [load_state(c)["progress"]["step"] for c in list_checkpoints(tmp_path)] == [1, 2]


@pytest.fixture
def cfg(tmp_path, monkeypatch) -> ExperimentConfig:
    """A prepared 20-pair number-words corpus and a tiny Transformer's training config."""
    return number_words_experiment(tmp_path, 20, max_steps=1)


def test_training_into_a_model_dir_denying_writes_is_one_line(cfg, monkeypatch):
    """The first file training writes there (its config) is named, on one line, and nothing
    is left in the folder; nothing was trained."""
    out = Path(cfg.train.out_dir)
    out.mkdir()
    deny_writing_in(monkeypatch, out)
    trainer = Trainer(cfg)
    with pytest.raises(XindaError) as err:
        trainer.train()
    assert str(err.value) == f"{out / 'config.yaml'}: {DENIED}"
    assert trainer.progress.step == 0
    assert list(out.iterdir()) == []
