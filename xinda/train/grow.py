"""``xinda grow``: turn a trained model directory into a deeper-encoder one that training
continues from (progressive, shallow-to-deep training; the copy rule is in
``xinda.models.transformer.grow``).

The new directory is self-contained: its ``config.yaml`` (the explicit model fields with the new
``encoder_layers`` and ``train.out_dir`` = the new directory), the manifest and sentencepiece
models, the training log so far, and one checkpoint at the same update with the grown weights,
no optimizer state (the grown model has new parameters, so ``Trainer.resume`` starts a fresh
optimizer) and the update recorded in ``lr_resets``, so that ``xinda train NEW_DIR/config.yaml
--resume`` restarts the learning rate at its peak (``xinda.train.schedule.learning_rate``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import torch

from xinda import checkpoint as ckpt
from xinda.config import ExperimentConfig, load_config, save_config
from xinda.data.manifest import load_manifest, load_vocabularies
from xinda.errors import XindaError
from xinda.models.registry import build_model, resolve
from xinda.models.transformer.grow import grow_encoder, grown_config
from xinda.train.curves import CsvLog, read_rows
from xinda.train.progress import Progress
from xinda.train.run_dir import trained_weights
from xinda.train.saved_state import checked_state
from xinda.train.schedule import learning_rate
from xinda.utils import atomic_save, check_writable, write_errors

log = logging.getLogger("xinda")


def default_out(model_dir: str | Path, layers: int) -> Path:
    """MODEL_DIR-{layers}l, beside the model directory (also when it is given as "." or
    "..")."""
    path = Path(model_dir)
    if path.name in ("", ".."):
        path = Path(os.path.abspath(path))
    return path.with_name(f"{path.name}-{layers}l")


@contextlib.contextmanager
def removed_on_failure(out: Path) -> Iterator[None]:
    """Remove what the block wrote into ``out`` (new, or empty before) if it fails, so that a
    second ``xinda grow`` after the cause is fixed does not find it not empty."""
    existed = out.is_dir()
    try:
        yield
    except BaseException:
        if out.is_dir():
            for path in out.iterdir():
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            if not existed:
                with contextlib.suppress(OSError):
                    out.rmdir()
        raise


def grown_experiment(cfg: ExperimentConfig, model_cfg, out: Path) -> ExperimentConfig:
    """The experiment config of the grown model: explicit model fields and out_dir = ``out``;
    the schedule stays (it restarts at its peak after the growth, ``learning_rate``)."""
    tree = cfg.model_dump(mode="json")
    tree["model"] = model_cfg.model_dump(mode="json")
    tree["train"]["out_dir"] = str(out)
    return ExperimentConfig.model_validate(tree)


def grow_model_dir(model_dir: str | Path, layers: int, out: str | Path | None = None) -> Path:
    """Grow the newest checkpoint of ``model_dir`` to a ``layers``-layer encoder in ``out``
    (default ``MODEL_DIR-{layers}l``); returns ``out``."""
    model_dir = Path(model_dir)
    out = default_out(model_dir, layers) if out is None else Path(out)
    cfg = load_config(model_dir / "config.yaml")
    old_cfg = resolve(cfg.model, str(model_dir / "config.yaml"))
    if old_cfg.arch != "transformer":
        raise XindaError(f"{model_dir}: only a Transformer encoder can grow, this model is "
                         f"arch {old_cfg.arch!r}")
    new_cfg = grown_config(old_cfg, layers)
    found = ckpt.list_checkpoints(model_dir)
    if not found:
        raise XindaError(f"{model_dir}: no step checkpoint to grow (train it first)")
    if out.resolve() == model_dir.resolve():
        raise XindaError(f"--out {out}: must differ from the model directory")
    if ckpt.list_checkpoints(out):
        raise XindaError(f"{out}: already holds checkpoints; choose another --out")
    if weights := trained_weights(out):  # a model kept without its checkpoints
        raise XindaError(f"{out}: holds trained weights ({', '.join(weights)}); choose "
                         "another --out")
    if out.is_dir() and (kept := sorted(p.name for p in out.iterdir())):
        raise XindaError(f"{out}: not empty ({', '.join(kept[:3])}{', ...' * (len(kept) > 3)})"
                         "; grow writes a new model directory: choose another --out")
    manifest = load_manifest(model_dir)  # (read before the output folder is made)
    vocab = load_vocabularies(model_dir, manifest).info
    old = build_model(old_cfg, vocab)
    ckpt.load_weights(old, found[-1])
    torch.manual_seed(cfg.train.seed)  # the new layers' start (a gate with no source layer)
    new = grow_encoder(old, build_model(new_cfg, vocab))
    state = checked_state(ckpt.load_state(found[-1]), ckpt.state_json(found[-1]))
    progress = Progress(**state["progress"])
    old_lr = learning_rate(cfg.train, progress.step, old_cfg.model_dim, progress.lr_resets)
    progress.reset_best()
    progress.lr_resets = [*progress.lr_resets, progress.step]
    if (model_dir / "log.csv").is_file():
        read_rows(model_dir / "log.csv")  # (a damaged log fails now, before out is written)

    with removed_on_failure(out), write_errors(out):
        check_writable(out, folder=True)
        out.mkdir(parents=True, exist_ok=True)
        save_config(grown_experiment(cfg, new_cfg, out), out / "config.yaml")
        for name in (*sorted(set(manifest["spm"].values())), "manifest.json", "log.csv"):
            if (model_dir / name).is_file():
                atomic_save(out / name,
                            lambda tmp, src=model_dir / name: shutil.copyfile(src, tmp))
        if (out / "log.csv").is_file():  # the old model's unlogged updates get their own row
            csv_log, window = CsvLog(out / "log.csv"), progress.log_window  # (before: merged
            csv_log.truncate_after(progress.step, not window[2])  # into the grown model's first)
            if window[2]:
                csv_log.write_window(progress, old_lr)
        progress.log_window = asdict(Progress())["log_window"]
        new_state = {"optimizer": None, "scaler": torch.amp.GradScaler("cpu").state_dict(),
                     "rng": state["rng"], "progress": asdict(progress),
                     # per-rank RNG, and the batches per update the resume must keep
                     **{k: state[k] for k in ("ranks", "batches_per_update") if k in state}}
        ckpt.save_checkpoint(out, progress.step, new, new_state, cfg.train.keep_last)
    log.info("grew the encoder %d -> %d layers at update %d (%s -> %s parameters)",
             old_cfg.encoder_layers, layers, progress.step, f"{old.num_parameters():,}",
             f"{new.num_parameters():,}")
    tc = cfg.train
    if progress.step < tc.warmup_steps:
        log.warning("the growth comes at update %d, inside the warm-up (%d updates): the "
                    "learning rate restarts at its peak, skipping the rest of the warm-up",
                    progress.step, tc.warmup_steps)
    for setting, limit, reached in (("max_steps", tc.max_steps, progress.step),
                                    ("max_epochs", tc.max_epochs, progress.epoch - 1),
                                    ("max_seconds", tc.max_seconds, progress.wall_seconds)):
        if limit and limit <= reached:  # the grown model would not train at all
            log.warning("train.%s %g is already reached: resume with --set train.%s=N "
                        "(N > %g)", setting, limit, setting, reached)
    return out
