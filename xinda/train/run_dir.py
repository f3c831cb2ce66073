"""The model directory when training starts: what it may already hold, what ``--resume`` may
change, and the checks of the data against the model, all before anything is written.

* Without ``--resume`` a directory with checkpoints is refused, and so is one holding another
  run's weights (``best``/``averaged.safetensors``) without a checkpoint to continue from.
  A run starting afresh does not write into a prepared dataset or over a file of its own
  names that it did not write (a user's commented config.yaml): ``check_new_run_dir``.
* With it, the run continues update for update. The model may change only in its dropout
  rates: any other change (width, depth, norm position, fusion...) would load the weights into
  another network. The data must be the prepared data the run started on: the same
  sentencepiece model(s) (the ids mean the same pieces) and the same training split. The
  batches of an epoch depend on ``train.seed``, ``max_tokens`` and ``update_freq``, and the
  saved optimizer state on ``train.optimizer``: none of them may change. Everything else
  (limits, logging, threads, checkpointing, learning-rate settings) may; Adam's betas and eps,
  weight decay and momentum come from the config, not from the saved optimizer state
  (``apply_hyperparameters``).
* A sentence longer than the model's position table, or an id outside the vocabulary (a
  damaged array), is refused before the first update.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch
import yaml
from pydantic import BaseModel

from xinda import checkpoint as ckpt
from xinda.config import ExperimentConfig, TrainConfig, load_config
from xinda.config_yaml import config_source
from xinda.data.manifest import load_split
from xinda.data.vocab import VocabInfo
from xinda.errors import XindaError
from xinda.models.registry import resolve
from xinda.train.curves import FIELDS, plot_curves, read_rows
from xinda.train.progress import Progress
from xinda.train.schedule import noam_min_lr_problem, noam_peak
from xinda.utils import atomic_write_text

log = logging.getLogger("xinda")

MODEL_WIDTH = ("model.preset", "model.arch", "model.d_model", "model.hidden_dim")
FIXED_TRAIN = ("seed", "max_tokens", "optimizer")  # (and the batches per update, below)


def experiment_config(cfg: object) -> ExperimentConfig:
    """``cfg``, or a XindaError when it is not an ExperimentConfig (a path, a dict)."""
    if not isinstance(cfg, ExperimentConfig):
        raise XindaError(f"expected an ExperimentConfig (xinda.config.load_config(path)), got "
                         f"{type(cfg).__name__}")
    return cfg


def checked_model(cfg: ExperimentConfig, source: Path | str = "config",
                  overrides: list[str] = ()) -> BaseModel:
    """The model config of ``cfg`` once its model section (a dict that ``load_config`` does
    not check) is valid and the sections agree; errors name ``source`` (and ``overrides``)."""
    def where(key: str | tuple[str, ...], problem: str = "") -> str:
        return config_source(source, list(overrides), key, problem)

    model = resolve(cfg.model, where("model"))
    for unused in model.unused_settings():  # (refusing them would strand saved models)
        log.warning("%s: model: %s: it has no effect", where("model"), unused)
    if problem := noam_min_lr_problem(cfg.train, model.model_dim):  # (d_model: any of these)
        raise XindaError(f"{where(('train', *MODEL_WIDTH), problem)}: {problem}")
    if cfg.train.schedule == "noam" and (peak := noam_peak(cfg.train, model.model_dim)) < 1e-5:
        log.warning("%s: train.lr %g is noam's scale, not its peak: the rate peaks at %.3g "
                    "(the Transformer paper's scale is 1; lr 2 gives %.3g here)",
                    where("train.lr"), cfg.train.lr, peak, peak * 2 / cfg.train.lr)
    if Path(cfg.train.out_dir).resolve() == Path(cfg.data.out_dir).resolve():
        raise XindaError(f"{where('train.out_dir')}: train.out_dir and data.out_dir are both "
                         f"{cfg.data.out_dir!r}: a new prepare would replace the vocabulary "
                         "under the trained model; use two folders")
    if cfg.decode.coverage > 0 and not model.has_attention:
        raise XindaError(f"{where('decode.coverage')}: decode.coverage: the coverage penalty "
                         "needs a model that attends to the source; this one has "
                         "model.attention none")
    return model


def trained_weights(out: Path) -> list[str]:
    """The files of a trained model's weights in ``out`` (checkpoints aside)."""
    return [n for n in ("best.safetensors", "averaged.safetensors") if (out / n).is_file()]


def check_output_dir(out: Path, resume: bool, cfg: ExperimentConfig, data_dir: Path,
                     manifest: dict, config: str | Path | None = None) -> None:
    """Refuse to train into ``out`` what would overwrite or mix with another run, or files
    not a run's (``config``: the config file read); first finish a checkpoint save that a
    crash interrupted."""
    if out.exists():
        ckpt.finish_resaves(out)
    found = out.exists() and ckpt.list_checkpoints(out)
    if found and not resume:
        raise XindaError(f"{out}: already holds checkpoints; use --resume to continue or "
                         "choose another train.out_dir")
    if not found and out.exists() and (torn := ckpt.torn_checkpoints(out)):
        raise XindaError(f"{out}: holds only incomplete checkpoints ({', '.join(torn[:3])}"
                         f"{', ...' if len(torn) > 3 else ''}), none to continue from: a new "
                         "run would overwrite its log.csv; delete its checkpoints folder to "
                         "start over, or choose another train.out_dir")
    weights = trained_weights(out)
    if weights and not found:  # a new run would overwrite another run's weights
        raise XindaError(f"{out}: holds trained weights ({', '.join(weights)}) but no "
                         "checkpoint to continue from; choose another train.out_dir (or, if "
                         "they are this run's own, its first checkpoint having failed, delete "
                         "them to start it over)")
    if found:
        check_same_run(out, cfg, data_dir, manifest)
    else:
        check_new_run_dir(out, config)
    if (out / "log.csv").is_file():
        read_rows(out / "log.csv")  # (a damaged log fails now, not once files are written)
    check_prepared_as_configured(cfg, data_dir, manifest)


def check_new_run_dir(out: Path, config: str | Path | None) -> None:
    """A run starting afresh writes its config.yaml, manifest.json, sentencepiece models,
    log.csv ... into ``out``: refuse ``out`` if it holds a prepared dataset (whose manifest and
    models these would replace) or a file of such a name that train did not write (a user's
    commented ``config``, say); a run stopped before its first checkpoint is started over, as
    before. Other files and folders (the user's own config under another name, a data folder)
    are let be: nothing writes over them."""
    names = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if arrays := [n for n in names if n.endswith((".ids.npy", ".offsets.npy"))]:
        raise XindaError(f"{out}: holds a prepared dataset ({arrays[0]}): a run there would "
                         "replace its manifest.json and sentencepiece model; choose another "
                         "train.out_dir")
    for name in (n for n in names if n in _RUN_FILES):  # (an empty file holds nothing to lose)
        path = out / name
        if path.is_file() and path.stat().st_size and not _RUN_FILES[name](path):
            read = config is not None and Path(config).resolve() == path.resolve()
            raise XindaError(f"{path}: {'the config file read, ' * read}not a file that xinda "
                             "train wrote (a new run would write over it): choose another "
                             "train.out_dir (a new or empty folder)")


def written_by_xinda(config: Path) -> bool:
    """Whether ``config`` is as ``save_config`` writes (a YAML dump: no comments, keys in the
    order written), not a user's file."""
    try:
        text = config.read_text(encoding="utf-8")
        tree = yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError):  # (UnicodeDecodeError is a ValueError)
        return False
    return isinstance(tree, dict) and "train" in tree \
        and yaml.safe_dump(tree, sort_keys=False) == text


def _starts(path: Path, *heads: bytes, within: int = 256) -> bool:
    """Whether ``path``'s first ``within`` bytes begin with ``heads[0]`` and hold the rest."""
    with path.open("rb") as f:
        head = f.read(within)
    return head.startswith(heads[0]) and all(h in head for h in heads[1:])


def _json_with(path: Path, *keys: str) -> bool:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and all(k in found for k in keys)


# what train writes in a model directory, and how to tell that a file of the name is its own
_RUN_FILES = {
    "config.yaml": written_by_xinda,
    "manifest.json": lambda p: _json_with(p, "spm", "splits"),
    "log.csv": lambda p: _starts(p, ",".join(FIELDS).encode() + b"\r\n")
    or _starts(p, ",".join(FIELDS).encode() + b"\n"),
    "curves.png": lambda p: _starts(p, b"\x89PNG\r\n\x1a\n", b"Matplotlib"),
    "train_stats.json": lambda p: _json_with(p, "steps", "tgt_tokens"),
    **dict.fromkeys(("spm.model", "spm.src.model", "spm.tgt.model"), lambda p: True),
}


# data settings that do not change what ``prepare`` writes (out_dir: a caller's data_dir wins)
_DATA_HOW = ("out_dir", "chunk_size", "workers")
_DATA_FILES = ("train", "valid", "test", "spm_model")  # may have moved since: a warning


def check_prepared_as_configured(cfg: ExperimentConfig, data_dir: Path, manifest: dict) -> None:
    """Refuse data that ``prepare`` made with other data settings than the config's (before, a
    run whose ``xinda prepare`` with a new vocab_size failed trained on the old data, saying
    the new size); other input files are a warning. Settings the manifest predates pass."""
    saved = manifest.get("config") or {}
    now = cfg.data.model_dump(mode="json")
    changed = [k for k in now if k in saved and k not in _DATA_HOW and saved[k] != now[k]]
    if settings := [f"data.{k} {saved[k]!r} -> {now[k]!r}" for k in changed
                    if k not in _DATA_FILES]:
        raise XindaError(f"{data_dir}: prepared with other data settings than the config's "
                         f"({', '.join(settings)}): run xinda prepare again, or train with the "
                         "settings it was prepared with")
    if changed:
        log.warning("%s: prepared from other files than the config names (%s)", data_dir,
                    ", ".join(f"data.{k} {saved[k]!r}, now {now[k]!r}" for k in changed))


def check_batches_per_update(out: Path, state: dict, world: int, update_freq: int) -> None:
    """Refuse to resume with other batches per update (ranks x ``train.update_freq``) than the
    newest checkpoint's ``state`` was trained with: its learning-rate schedule counts updates.
    Checkpoints record the product; older ones, their ranks with the saved config's
    ``update_freq``."""
    was, how = state.get("batches_per_update"), ""
    if was is None:
        saved = out / "config.yaml"
        if not saved.is_file():
            return
        was_world = (state.get("ranks") or {}).get("world_size", 1)
        was_freq = load_config(saved).train.update_freq
        was, how = was_world * was_freq, f" ({was_world} rank(s) x train.update_freq {was_freq})"
    now = world * update_freq
    if was != now:
        keep = (f"train.update_freq={was // world} keeps it" if was % world == 0 else
                f"no train.update_freq keeps it with {world} ranks")
        raise XindaError(f"{out}: the run took {was} batches per update{how}, this job {now} "
                         f"({world} x {update_freq}): {keep}; or train into another "
                         "train.out_dir")


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
        try:
            was = json.loads(old_manifest.read_text(encoding="utf-8"))["splits"].get("train")
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise XindaError(f"{old_manifest}: not a readable manifest ({type(err).__name__}: "
                             f"{err}); if the run used {data_dir}, copy its manifest.json "
                             "there") from None
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


def retire_shadowing(out: Path, step: int, validating: bool) -> None:
    """An ``averaged.safetensors`` of earlier checkpoints, and without ``validating`` a
    ``best.safetensors`` an earlier validation chose, would shadow the newer weights of
    ``step`` (``translate`` prefers them): renamed aside, not deleted."""
    why = {"averaged": "it averaged older checkpoints (run xinda average again)",
           "best": "an earlier validation chose it, and this run does not validate"}
    for name in ("averaged",) if validating else ("averaged", "best"):
        if (old := out / f"{name}.safetensors").is_file():
            aside = old.with_name(f"{name}-before-step_{step:07d}.safetensors")
            old.replace(aside)
            log.warning("%s: renamed to %s: %s", old, aside.name, why[name])


def check_splits(data_dir: Path, train: tuple, has_valid: bool, max_positions: int,
                 vocab: VocabInfo) -> None:
    """The checks of ``check_lengths`` and ``check_ids`` on the ``train`` arrays (source,
    target) and on the valid split if there is one."""
    for split, pair in [("train", train), *([("valid", load_split(data_dir, "valid"))]
                                            if has_valid else [])]:
        check_lengths(data_dir, split, pair, max_positions)
        check_ids(data_dir, split, pair, vocab)


def check_ids(data_dir: Path, split: str, pair: tuple, vocab: VocabInfo) -> None:
    """Refuse, before training, a split whose arrays hold an id outside the vocabulary (a
    damaged or foreign array: the embedding failed with an IndexError at its batch). One pass
    over the ids, in chunks of a memory-mapped file."""
    for side, arrays, size in zip(("src", "tgt"), pair, (vocab.src_size, vocab.tgt_size)):
        ids, low, high = arrays.ids, 0, 0
        for start in range(0, len(ids), 1 << 24):
            chunk = ids[start:start + (1 << 24)]
            low, high = min(low, int(chunk.min())), max(high, int(chunk.max()))
        if low < 0 or high >= size:
            raise XindaError(f"{data_dir / f'{split}.{side}.ids.npy'}: holds token id "
                             f"{low if low < 0 else high}, outside the vocabulary of {size} "
                             f"pieces (ids 0 to {size - 1}): a damaged array? re-run xinda "
                             "prepare")


def check_lengths(data_dir: Path, split: str, pair: tuple, max_positions: int) -> None:
    """Refuse, before training, a split (``pair``: its source and target arrays) with a
    sentence longer than the model's position table (with the BOS or EOS it gets): it would
    stop training with an error at its batch."""
    for side, arrays in zip(("source", "target"), pair):
        if not len(arrays):
            continue
        longest = int(arrays.lengths.argmax())
        n = int(arrays.lengths[longest])
        if n + 1 > max_positions:
            which = (f"pair {longest + 1} of those kept (filtered: not a corpus line)"
                     if split == "train" else f"sentence {longest + 1}")
            raise XindaError(
                f"{data_dir}: {split} {side} {which} has {n} pieces, but "
                f"model.max_positions {max_positions} takes at most {max_positions - 1}: raise "
                "it, or prepare with a smaller data.max_len (data.long_pairs: truncate for valid)")


def warn_validation_settings(tc: TrainConfig, has_valid: bool, has_scorer: bool) -> None:
    """Warn about validation settings that will have no effect."""
    for name, value in (("patience", tc.patience), ("valid_every", tc.valid_every)):
        if value and not (tc.run_validation and has_valid):
            log.warning("train.%s %d has no effect: %s", name, value,
                        "train.run_validation is off" if has_valid
                        else "the prepared data has no valid split")
    if tc.min_lr and tc.schedule == "constant":  # (not refused: saved runs would not load)
        log.warning("train.min_lr %g has no effect: the constant schedule never decays",
                    tc.min_lr)
    if tc.valid_beam > 1 and not (tc.valid_bleu and tc.run_validation and has_valid):
        log.warning("train.valid_beam %d has no effect: validation BLEU is off (%s)",
                    tc.valid_beam, "train.run_validation false" if not tc.run_validation
                    else "train.valid_bleu false" if not tc.valid_bleu
                    else "the prepared data has no valid split")
    if tc.valid_bleu and tc.run_validation and has_valid and not has_scorer:
        log.warning("train.valid_bleu is on but no BLEU scorer was given: validating by loss "
                    "(xinda.evaluate.validation.validation_bleu builds one)")


def warn_data_fit(cfg: ExperimentConfig, src, tgt, vocab: VocabInfo) -> None:
    """Warnings about how the prepared data fits the run: pairs longer than the batch budget
    (``warn_oversized``), and model.share_embeddings given for separate vocabularies, where
    it has no effect (before: silently)."""
    warn_oversized(src, tgt, cfg.train.max_tokens)
    if cfg.model.get("share_embeddings") is True and not vocab.joint:
        log.warning("model.share_embeddings has no effect: the data was prepared with separate "
                    "source and target vocabularies (data.joint_vocab false), so each side "
                    "keeps its own embedding table")


def warn_oversized(src, tgt, max_tokens: int) -> None:
    """Warn about training pairs (source and target arrays) longer than ``max_tokens`` (with
    EOS): each becomes a batch of its own, above the budget (memory follows the longest)."""
    size = np.maximum(src.lengths, tgt.lengths) + 1
    over = int((size > max_tokens).sum())
    if over:
        log.warning("%d training pairs are longer than train.max_tokens %d (up to %d tokens): "
                    "each is a batch of its own, above the budget", over, max_tokens,
                    int(size.max()))


def write_stats(out: Path, p: Progress, **facts) -> None:
    """train_stats.json (updates, epochs, target tokens, training time and tokens/s, and
    ``facts``) and the run's final curves.png."""
    stats = {"steps": p.step, "epochs_done": p.epoch - 1, "tgt_tokens": p.tgt_tokens,
             "train_seconds": p.train_seconds,
             "tgt_tok_per_s": p.tgt_tokens / max(p.train_seconds, 1e-9), **facts}
    atomic_write_text(out / "train_stats.json", json.dumps(stats, indent=1))
    if (out / "log.csv").exists():
        plot_curves(out / "log.csv", out / "curves.png", str(out.name))


def nonfinite_loss(step: int, loss: float, out: Path) -> XindaError:
    """The error of an update whose training loss is not finite (the weights are unchanged)."""
    kept = (f"checkpoints kept in {ckpt.checkpoint_dir(out)}" if ckpt.list_checkpoints(out)
            else "no checkpoint written yet")
    return XindaError(f"update {step}: the training loss is {loss}; stopped before the weights "
                      f"changed ({kept}); lower train.lr or set train.clip_norm")
