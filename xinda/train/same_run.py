"""What ``xinda train --resume`` may change, checked before anything in the model directory is
written: resuming continues the same run, update for update.

* The model may change only in its dropout rates: any other change (width, depth, norm
  position, fusion...) would load the weights into another network.
* The data must be the prepared data the run started on: the same sentencepiece model(s) (the
  ids mean the same pieces) and the same training split.
* The batches of an epoch depend on ``train.seed``, ``max_tokens`` and ``update_freq``, and the
  saved optimizer state on ``train.optimizer``: none of them may change.
* Everything else (limits, logging, threads, checkpointing, learning-rate settings) may.
  Adam's betas and eps, and weight decay and momentum, come from the config, not from the saved
  optimizer state (``apply_hyperparameters``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from xinda.config import ExperimentConfig, TrainConfig, load_config
from xinda.errors import XindaError
from xinda.models.registry import resolve

FIXED_TRAIN = ("seed", "max_tokens", "update_freq", "optimizer")


def check_same_run(out: Path, cfg: ExperimentConfig, data_dir: Path, manifest: dict) -> None:
    """Refuse to resume the run in ``out`` with a config or data it was not trained with."""
    saved = out / "config.yaml"
    if saved.is_file():
        _check_config(saved, load_config(saved), cfg)
    _check_data(out, data_dir, manifest)


def _check_config(saved: Path, old: ExperimentConfig, new: ExperimentConfig) -> None:
    for key in FIXED_TRAIN:
        was, now = getattr(old.train, key), getattr(new.train, key)
        if was != now:
            raise XindaError(f"{saved}: the run was trained with train.{key}={was}, not {now}: "
                             "resuming continues the same batches; train into another "
                             "train.out_dir to change it")
    was, now = _model_fields(old), _model_fields(new)
    for key in sorted(was.keys() | now.keys()):
        if was.get(key) != now.get(key):
            raise XindaError(f"{saved}: the run's model has model.{key}={was.get(key)}, not "
                             f"{now.get(key)}: only dropout rates may change on --resume")


def _model_fields(cfg: ExperimentConfig) -> dict:
    fields = resolve(cfg.model).model_dump(mode="json")
    return {k: v for k, v in fields.items() if "dropout" not in k}


def _check_data(out: Path, data_dir: Path, manifest: dict) -> None:
    """The vocabularies and the training split of ``data_dir`` are those of the run (as copied
    into ``out`` when it started)."""
    for name in sorted(set(manifest["spm"].values())):
        kept = out / name
        if kept.is_file() and kept.resolve() != (data_dir / name).resolve() \
                and kept.read_bytes() != (data_dir / name).read_bytes():
            raise XindaError(f"{data_dir / name}: not the sentencepiece model the run was "
                             f"trained with ({kept}): resume with the data it was prepared from")
    old_manifest = out / "manifest.json"
    if old_manifest.is_file() and old_manifest.resolve() != (data_dir / "manifest.json").resolve():
        was = json.loads(old_manifest.read_text(encoding="utf-8"))["splits"].get("train")
        if was is not None and was != manifest["splits"].get("train"):
            raise XindaError(f"{data_dir}: its training split ({manifest['splits'].get('train')}) "
                             f"is not the run's ({was}, {old_manifest}): resume with the same "
                             "prepared data")


def apply_hyperparameters(optimizer: torch.optim.Optimizer, tc: TrainConfig) -> None:
    """Put the config's optimizer settings into a restored optimizer (``load_state_dict``
    brings back the saved ones; the learning rate is set at every update anyway)."""
    values = ({"betas": tuple(tc.betas), "eps": tc.eps} if tc.optimizer == "adam"
              else {"momentum": tc.momentum})
    for group in optimizer.param_groups:
        group.update(values, weight_decay=tc.weight_decay)
