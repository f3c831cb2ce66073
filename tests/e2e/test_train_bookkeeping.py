"""What a run records about itself across limits and resumes: the best score in the checkpoint
of the last update, early stopping's count, the validation metric, the time budget and the
log's rows (each found by review; "Before:" says what happened)."""

from __future__ import annotations

import csv
import logging
import math

import pytest
import torch

from xinda.checkpoint import list_checkpoints, load_state
from xinda.config import load_config
from xinda.data.batching import make_batches
from xinda.data.manifest import load_split
from xinda.errors import XindaError
from xinda.train.trainer import Progress, Trainer


def run(prepared, out, resume: bool = False, valid_bleu=None, valid_bleu_setting="false",
        **train):
    """Train (in this process) into ``out``; ``valid_bleu`` scores validations by BLEU."""
    overrides = [f"train.out_dir={out}", f"train.valid_bleu={valid_bleu_setting}",
                 "train.log_every=1", *(f"train.{k}={v}" for k, v in train.items())]
    cfg = load_config(prepared.config, overrides)
    return Trainer(cfg, prepared.data_dir, valid_bleu=valid_bleu).train(resume=resume)


def newest_progress(out) -> dict:
    return load_state(list_checkpoints(out)[-1])["progress"]


def rows(out) -> list[dict]:
    with (out / "log.csv").open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def per_epoch(prepared) -> int:
    src, tgt = load_split(prepared.data_dir, "train")
    return len(make_batches(src.lengths, tgt.lengths, 500, 1, 1))


def test_the_last_checkpoint_records_the_final_validation(prepared, tmp_path):
    """Before: when max_steps fell on a save_every step, the checkpoint was written before the
    final validation and kept best = -inf, so a worse later validation replaced best.safetensors
    after --resume."""
    progress = run(prepared, tmp_path, max_steps=4, save_every=4)
    saved = newest_progress(tmp_path)
    assert saved["step"] == 4 and saved["best"] == progress.best
    assert math.isfinite(saved["best"])
    assert saved["best_metric"].startswith("loss (label smoothing 0.1) on valid ")


def test_a_limit_on_an_epoch_s_last_update_ends_the_epoch_once(prepared, tmp_path, per_epoch):
    """Before: the epoch's validation was skipped, so --resume validated the same weights
    again, counted a bad epoch and (patience 1) stopped without training."""
    run(prepared, tmp_path, max_steps=per_epoch, patience=1)
    saved = newest_progress(tmp_path)
    assert (saved["epoch"], saved["batch"], saved["bad_epochs"]) == (2, 0, 0)
    progress = run(prepared, tmp_path, resume=True, max_steps=per_epoch + 3, patience=1)
    assert progress.step == per_epoch + 3
    validated = [int(r["step"]) for r in rows(tmp_path) if r["valid_loss"]]
    assert validated == [per_epoch, per_epoch + 3]


def test_a_limit_s_validation_inside_an_epoch_does_not_move_early_stopping(
        prepared, tmp_path, per_epoch, monkeypatch):
    """Before: the validation of a run that max_steps stopped inside an epoch became the score
    that early stopping compared with, so after --resume the run stopped an epoch before an
    uninterrupted one (found by review). Here update 3 scores best, and every epoch's end
    worse than the last: patience 1 stops after epoch 2 either way."""
    def validate(trainer) -> dict:
        loss = 1.0 if trainer.progress.step == 3 else 2.0 + trainer.progress.step / 100
        return {"loss": loss, "nll": loss}
    monkeypatch.setattr(Trainer, "validate", validate)
    whole = run(prepared, tmp_path / "whole", patience=1, max_epochs=4)
    assert whole.step == 2 * per_epoch
    run(prepared, tmp_path / "parts", patience=1, max_epochs=4, max_steps=3)
    parts = run(prepared, tmp_path / "parts", resume=True, patience=1, max_epochs=4)
    assert parts.step == whole.step and parts.epoch_best == whole.epoch_best
    assert parts.best == -1.0  # best.safetensors: the best weights validated, update 3's


def test_a_bleu_tie_at_a_lower_loss_is_an_improvement(prepared, tmp_path, per_epoch,
                                                     monkeypatch):
    """Before: BLEU 0.0 in every early epoch never beat the first 0.0, so patience 1 stopped
    after epoch 2 while the loss still fell, and best.safetensors kept epoch 1's weights."""
    def validate(trainer) -> dict:
        loss = 5.0 - trainer.progress.step / per_epoch
        return {"loss": loss, "nll": loss, "bleu": 0.0}
    monkeypatch.setattr(Trainer, "validate", validate)
    progress = run(prepared, tmp_path, patience=1, max_epochs=3)
    assert progress.step == 3 * per_epoch and progress.bad_epochs == 0
    assert (progress.best, progress.best_loss) == (0.0, 2.0)


def test_training_time_counts_each_epoch_s_checkpoint(prepared, tmp_path, monkeypatch):
    """Before: train_seconds (and so tokens/s) left out the checkpoint at each epoch's end,
    which train.max_seconds counted (found by review)."""
    import time

    save = Trainer.save

    def slow_save(trainer, off_grid: bool = False) -> None:
        time.sleep(0.25)
        save(trainer, off_grid)
    monkeypatch.setattr(Trainer, "save", slow_save)
    progress = run(prepared, tmp_path, max_epochs=3, run_validation="false")
    assert progress.epoch == 4 and progress.train_seconds >= 3 * 0.25


def test_a_log_row_s_time_counts_its_own_update(prepared, tmp_path, monkeypatch):
    """Before: elapsed_s was written before the row's last update was counted, one behind."""
    import time

    update = Trainer.update

    def slow_update(trainer, group):
        time.sleep(0.2)
        return update(trainer, group)
    monkeypatch.setattr(Trainer, "update", slow_update)
    run(prepared, tmp_path, max_steps=2, run_validation="false")
    elapsed = [float(r["elapsed_s"]) for r in rows(tmp_path)]
    assert len(elapsed) == 2 and elapsed[0] >= 0.2 and elapsed[1] >= 0.4


def test_resuming_a_finished_run_validates_nothing_again(prepared, tmp_path, caplog):
    """Before: each --resume of a run stopped inside an epoch added the same validation row;
    and a resume that trained nothing said "trained 3 updates" without a word."""
    run(prepared, tmp_path, max_steps=3)
    before = rows(tmp_path)
    assert "nothing left to train" not in caplog.text
    run(prepared, tmp_path, resume=True, max_steps=3)
    assert rows(tmp_path) == before
    assert ("--resume: nothing left to train: the run had reached train.max_steps 3 at update 3"
            in caplog.text)
    caplog.clear()
    run(prepared, tmp_path, resume=True, max_steps=4)
    assert "nothing left to train" not in caplog.text


def test_a_resume_after_the_last_epoch_says_so(prepared, tmp_path, per_epoch, caplog):
    run(prepared, tmp_path, max_epochs=1, run_validation="false")
    run(prepared, tmp_path, resume=True, max_epochs=1, run_validation="false")
    assert f"reached train.max_epochs 1 at update {per_epoch}; raise it" in caplog.text


def test_a_resume_names_every_limit_reached(prepared, tmp_path, per_epoch, caplog):
    """Raising one of two limits reached together trains nothing (found by review)."""
    run(prepared, tmp_path, max_epochs=1, max_steps=per_epoch, run_validation="false")
    run(prepared, tmp_path, resume=True, max_epochs=1, max_steps=per_epoch,
        run_validation="false")
    assert (f"reached train.max_steps {per_epoch} and train.max_epochs 1 at update "
            f"{per_epoch}; raise them") in caplog.text


@pytest.mark.parametrize("first_by_bleu", [False, True])
def test_a_changed_validation_metric_starts_best_and_patience_over(prepared, tmp_path, per_epoch,
                                                                  first_by_bleu):
    """Before: BLEU (>= 0) was compared with -loss (< 0): from BLEU to loss nothing ever
    improved (early stopping fired while the loss fell); from loss to BLEU everything did."""
    def by(bleu: bool) -> dict:
        return {"valid_bleu": (lambda _model: 0.5) if bleu else None,
                "valid_bleu_setting": "true" if bleu else "false"}

    first, then = by(first_by_bleu), by(not first_by_bleu)
    run(prepared, tmp_path, max_steps=per_epoch, patience=2, **first)
    assert newest_progress(tmp_path)["best_metric"].split()[0] == ("bleu" if first_by_bleu
                                                                  else "loss")
    progress = run(prepared, tmp_path, resume=True, max_steps=2 * per_epoch, patience=2, **then)
    assert progress.best_metric.split()[0] == ("loss" if first_by_bleu else "bleu")
    assert progress.bad_epochs == 0 and (progress.best < 0) == first_by_bleu


def test_checkpoints_saved_before_the_metric_was_recorded_get_it_from_the_score():
    assert Progress(best=12.3).epoch_best == 12.3  # and early stopping compares with best
    assert Progress(best=12.3).best_metric == "bleu"
    assert Progress(best=-2.5).best_metric == "loss"
    assert Progress().best_metric == ""


def test_the_time_budget_counts_the_runs_before_a_resume(prepared, tmp_path):
    """Before: train.max_seconds started from zero at every --resume, so a finished run
    resumed trained a full budget again."""
    first = run(prepared, tmp_path, max_seconds=0.3)
    assert newest_progress(tmp_path)["wall_seconds"] >= 0.3
    again = run(prepared, tmp_path, resume=True, max_seconds=0.3)
    assert again.step == first.step


@pytest.mark.parametrize(("save_every", "validation", "valid_every"),
                         [(0, "true", 0), (1, "false", 0), (0, "true", 2)])
def test_the_last_checkpoint_of_a_run_out_of_time_records_the_time(prepared, tmp_path,
                                                                  monkeypatch, save_every,
                                                                  validation, valid_every):
    """Before: an epoch's checkpoint (or a save_every one, or the first one after a
    valid_every validation: found by review) was written before the time check that followed
    it, so a budget that ran out while it saved was recorded as not spent, and --resume
    trained on (the cause of a flaky test). Here saving takes 1 s of a 0.5 s budget."""
    clock = [0.0]
    save = Trainer.save

    def slow_save(trainer, off_grid: bool = False) -> None:
        save(trainer, off_grid)
        clock[0] += 1.0
    with monkeypatch.context() as patched:
        patched.setattr(Trainer, "save", slow_save)
        patched.setattr(Trainer, "wall_seconds", lambda trainer: clock[0])
        first = run(prepared, tmp_path, max_seconds=0.5, save_every=save_every,
                    run_validation=validation, valid_every=valid_every)
    assert newest_progress(tmp_path)["wall_seconds"] >= 0.5
    again = run(prepared, tmp_path, resume=True, max_seconds=0.5, run_validation=validation,
                valid_every=valid_every)
    assert again.step == first.step


def test_a_fresh_run_drops_the_log_of_a_run_that_failed_before_its_first_checkpoint(
        prepared, tmp_path):
    """Before: the new run's rows were appended to the failed run's."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "log.csv").write_text("step,epoch,lr,train_loss,train_nll,tok_per_s,elapsed_s,"
                                      "valid_loss,valid_ppl,valid_bleu\n1,1,1000000.0,4.4,,,,,,"
                                      "\n", encoding="utf-8")
    run(prepared, tmp_path, max_steps=2)
    assert [(r["step"], r["lr"] != "1000000.0") for r in rows(tmp_path) if r["train_loss"]] == [
        ("1", True), ("2", True)]


def test_log_rows_after_a_resume_equal_the_uninterrupted_run_s(prepared, tmp_path):
    """Before: the updates between the last row and the checkpoint were in no row after a
    resume (the row's window was not saved)."""
    run(prepared, tmp_path / "a", max_steps=10, log_every=5)
    run(prepared, tmp_path / "b", max_steps=7, log_every=5)
    run(prepared, tmp_path / "b", resume=True, max_steps=10, log_every=5)

    def train_rows(out):
        return [(r["step"], r["train_loss"], r["train_nll"]) for r in rows(out)
                if r["train_loss"]]
    assert train_rows(tmp_path / "b") == train_rows(tmp_path / "a")
    assert [r[0] for r in train_rows(tmp_path / "a")] == ["5", "10"]


def test_patience_without_validation_is_named(prepared, tmp_path, caplog):
    run(prepared, tmp_path, max_steps=1, patience=2, run_validation="false")
    assert "train.patience 2 has no effect: train.run_validation is off" in caplog.text



def test_a_torn_manifest_copy_is_named_on_resume(prepared, tmp_path):
    """Before: a JSONDecodeError traceback at every --resume (the copies into the model
    directory were not written atomically, so a full disk could leave one torn)."""
    run(prepared, tmp_path, max_steps=1)
    (tmp_path / "manifest.json").write_text('{"splits": {"tra', encoding="utf-8")
    with pytest.raises(XindaError, match="manifest.json: not a readable manifest"):
        run(prepared, tmp_path, resume=True, max_steps=2)


def test_a_signal_on_the_update_that_reaches_the_limit_still_validates_it(prepared, tmp_path,
                                                                         per_epoch):
    """Before: SIGTERM during the last update saved a checkpoint and raised before the final
    validation, and --resume (the limit reached) validated nothing: the last weights were never
    scored or considered for best.safetensors (found by review)."""
    import signal

    last = per_epoch + 2  # inside an epoch
    cfg = load_config(prepared.config, [f"train.out_dir={tmp_path}", "train.valid_bleu=false",
                                        "train.log_every=1", f"train.max_steps={last}"])
    trainer = Trainer(cfg, prepared.data_dir)
    update = trainer.update

    def update_then_signal(group):
        out = update(group)
        if trainer.progress.step == last:
            trainer.signals.received = signal.SIGTERM  # as if it came during this update
        return out

    trainer.update = update_then_signal
    try:
        progress = trainer.train()
    except KeyboardInterrupt:
        pytest.fail("the signal ended the finished run before its final validation")
    assert progress.step == last
    validated = [int(r["step"]) for r in rows(tmp_path) if r["valid_loss"]]
    assert validated == [per_epoch, last]
    assert newest_progress(tmp_path)["step"] == last


@pytest.mark.parametrize("end", ["max_epochs", "patience"])
def test_a_signal_during_the_last_validation_ends_the_run_as_finished(prepared, tmp_path,
                                                                      monkeypatch, end):
    """Before: a signal during the validation of the last epoch (max_epochs, or early
    stopping) made the finished run exit as interrupted ("continue with --resume"), without
    its stats, last log row and curves (found by review)."""
    import signal

    validate, losses = Trainer.validate, [3.0, 4.0]  # patience 1: the second one stops
    last = 1 if end == "max_epochs" else 2

    def validate_then_signal(trainer) -> dict:
        done = len(rows(tmp_path)) and sum(bool(r["valid_loss"]) for r in rows(tmp_path))
        if done + 1 == last:
            trainer.signals.received = signal.SIGTERM  # as if it came during the validation
        return {**validate(trainer), "loss": losses[done]}
    monkeypatch.setattr(Trainer, "validate", validate_then_signal)
    limits = {"max_epochs": 1} if end == "max_epochs" else {"patience": 1}
    try:
        progress = run(prepared, tmp_path, **limits)
    except KeyboardInterrupt:
        pytest.fail("the signal ended a finished run as interrupted")
    assert progress.epoch == last + 1 and (tmp_path / "train_stats.json").is_file()


def test_batches_per_update_are_checked_against_the_checkpoint_not_the_config(prepared,
                                                                               tmp_path):
    """Before: the check read update_freq from out/config.yaml, which an accepted resume
    rewrites before it saves anything: after 2 ranks x 1 resumed as 1 x 2 without a new
    checkpoint (its limit reached), the next 1 x 2 resume was refused as 4 batches per update
    (found by review). Here the config says update_freq 2 and the checkpoint 1 batch."""
    import yaml

    run(prepared, tmp_path, max_steps=2)
    assert load_state(list_checkpoints(tmp_path)[-1])["batches_per_update"] == 1
    saved = tmp_path / "config.yaml"
    tree = yaml.safe_load(saved.read_text())
    tree["train"]["update_freq"] = 2
    saved.write_text(yaml.safe_dump(tree))
    assert run(prepared, tmp_path, resume=True, max_steps=3).step == 3
    with pytest.raises(XindaError, match=r"took 1 batches per update, this job 2 \(1 x 2\): "
                                         r"train.update_freq=1 keeps it"):
        run(prepared, tmp_path, resume=True, max_steps=4, update_freq=2)


def test_fp16_on_the_cpu_scales_the_loss(prepared, tmp_path):
    """Before: GradScaler() meant a CUDA scaler, which torch turns off on a CPU-only machine
    (a warning only), and the NaN guard trusted that scaler: an inf loss went straight into
    the weights (found by review)."""
    cfg = load_config(prepared.config, [f"train.out_dir={tmp_path}", "train.valid_bleu=false",
                                        "train.precision=fp16", "train.max_steps=2"])
    trainer = Trainer(cfg, prepared.data_dir)
    assert trainer.scaler.is_enabled()
    assert trainer.train().step == 2
    assert trainer.scaler.get_scale() > 0


def test_fp16_updates_skipped_for_overflow_are_not_counted(prepared, tmp_path, caplog):
    """A scale of 2^40 overflows the fp16 gradients until it has halved enough: those steps
    are skipped and, as in fairseq, not counted. Before: each counted as an update, so
    max_steps=3 ended after fewer than 3 optimiser steps (here none)."""
    cfg = load_config(prepared.config, [f"train.out_dir={tmp_path}", "train.valid_bleu=false",
                                        "train.precision=fp16", "train.max_steps=3"])
    trainer = Trainer(cfg, prepared.data_dir)
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)
    with caplog.at_level(logging.INFO, logger="xinda"):
        assert trainer.train().step == 3
    skipped = [r.message for r in caplog.records if "overflowed: skipped" in r.message]
    assert skipped and skipped[0].startswith("update 1: the fp16 gradients overflowed")
    adam_steps = {int(s["step"]) for s in trainer.optimizer.state.values()}
    assert adam_steps == {3} and trainer.scaler.get_scale() < 2.0**40


def test_an_epoch_whose_fp16_updates_all_overflowed_is_not_validated_again(prepared, tmp_path):
    """A loss scale of 2^60 halves once per skipped update: the first epochs take no update.
    Before: each validated the untrained weights again at update 0 and counted as a bad
    epoch for patience (found by review)."""
    cfg = load_config(prepared.config, [f"train.out_dir={tmp_path}", "train.valid_bleu=false",
                                        "train.precision=fp16", "train.max_epochs=2",
                                        "train.patience=1"])
    trainer = Trainer(cfg, prepared.data_dir)
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**60)
    progress = trainer.train()
    assert progress.step == 0 and progress.bad_epochs == 0  # (every update skipped)
    assert not [r for r in rows(tmp_path) if r["valid_loss"]]


def test_a_run_ending_at_an_epoch_end_logs_its_last_row_in_that_epoch(prepared, tmp_path,
                                                                       per_epoch):
    """Before: the row of the updates left after the last full window carried the next epoch
    (3 of a 2-epoch run), already counted up by the epoch's end."""
    run(prepared, tmp_path, max_epochs=2, log_every=10**6)
    train_rows = [r for r in rows(tmp_path) if r["train_loss"]]
    assert [(r["step"], r["epoch"]) for r in train_rows] == [(str(2 * per_epoch), "2")]


def test_the_updates_after_the_last_full_window_get_a_row_logged_once(prepared, tmp_path):
    """Before: updates 6-7 of a 7-update run with a row every 5 were in no row of log.csv. The
    final row is logged again, not twice, when the run is resumed."""
    run(prepared, tmp_path, max_steps=7, log_every=5)
    def logged():  # (elapsed_s: the resumed run's clock; a row's order at a step)
        return sorted((r["step"], r["valid_loss"], r["train_loss"], r["train_nll"], r["lr"])
                      for r in rows(tmp_path))

    assert [r["step"] for r in rows(tmp_path) if r["train_loss"]] == ["5", "7"]
    before = logged()
    run(prepared, tmp_path, resume=True, max_steps=7, log_every=5)
    assert logged() == before


def test_a_validation_row_whose_checkpoint_never_came_is_not_logged_twice(
        prepared, tmp_path, per_epoch, monkeypatch):
    """A run dies after logging its epoch-end validation but before that epoch's checkpoint,
    while a save_every checkpoint holds the same update. Before: --resume validated it again
    and log.csv had two rows for it."""
    from xinda.train import trainer

    def die(*args, **kwargs):
        raise RuntimeError("killed")

    monkeypatch.setattr(trainer, "plot_curves", die)  # right after the row is written
    with pytest.raises(RuntimeError, match="killed"):
        run(prepared, tmp_path, max_steps=per_epoch, save_every=per_epoch)
    assert newest_progress(tmp_path)["validated_step"] < per_epoch
    monkeypatch.undo()
    run(prepared, tmp_path, resume=True, max_steps=per_epoch, save_every=per_epoch)
    assert [r["step"] for r in rows(tmp_path) if r["valid_loss"]] == [str(per_epoch)]


@pytest.mark.parametrize("change", ["train.label_smoothing=0.4", "train.valid_beam=2",
                                    "decode.max_len_b=3"])
def test_settings_that_change_the_score_start_best_and_patience_over(prepared, tmp_path,
                                                                     per_epoch, change, caplog):
    """Found by review: resumed with another label smoothing (a larger validation loss), a run
    with patience 1 stopped at once, and best.safetensors never changed again; so with the
    decode settings validation BLEU uses."""
    bleu = change != "train.label_smoothing=0.4"
    scorer = {"valid_bleu": (lambda _model: 0.5) if bleu else None,
              "valid_bleu_setting": "true" if bleu else "false"}
    run(prepared, tmp_path, max_steps=per_epoch, patience=1, **scorer)
    key, value = change.split("=")
    section, name = key.split(".")
    overrides = {name: value} if section == "train" else {}
    if section == "decode":
        cfg_path = tmp_path / "changed.yaml"
        cfg_path.write_text(prepared.config.read_text().replace("max_len_b: 16",
                                                                f"max_len_b: {value}"))
        prepared = type(prepared)(prepared.root, prepared.raw, prepared.data_dir, cfg_path,
                                  prepared.result)
    with caplog.at_level(logging.WARNING, logger="xinda"):
        progress = run(prepared, tmp_path, resume=True, max_steps=3 * per_epoch, patience=1,
                       **scorer, **overrides)
    assert "the best score and early stopping's count start over" in caplog.text
    assert progress.step > per_epoch + 1  # not stopped at the first validation


def test_the_metric_names_the_settings_and_the_validation_set(prepared):
    """(Checkpoints from before them say "loss" or "bleu", or name no validation set, which
    the same metric continues.) Before: another validation set on --resume was compared with
    the old set's best score and early-stopping count (found by review)."""
    from xinda.train.progress import same_metric, validation_metric

    cfg, valid = load_config(prepared.config), {"pairs": 40, "tgt_tokens": 200}
    assert validation_metric(cfg, False, valid).split()[0] == "loss"
    metric = validation_metric(cfg, True, valid)
    assert metric == ("bleu (beam 1, alpha 1, coverage 0, length 0x+16, stop beam, inputs 40) "
                      "on valid 40 pairs, 200 target tokens")
    assert same_metric("bleu", metric) and same_metric(metric.split(" on ")[0], metric)
    assert not same_metric(validation_metric(cfg, True, {"pairs": 41, "tgt_tokens": 200}), metric)


def test_a_stop_checkpoint_validated_after_a_resume_stays_off_the_grid(prepared, tmp_path,
                                                                       per_epoch):
    """Found by review: a run stopped off the save_every grid and resumed into its limit was
    validated and saved again as a regular checkpoint, so keep_last kept it where an
    uninterrupted run keeps step 2."""
    assert per_epoch > 5  # (the limits fall inside the first epoch)
    run(prepared, tmp_path, max_steps=3, save_every=2, keep_last=3, run_validation="false")
    run(prepared, tmp_path, resume=True, max_steps=3, save_every=2, keep_last=3)
    run(prepared, tmp_path, resume=True, max_steps=5, save_every=2, keep_last=3)
    assert [p.name[5:12] for p in list_checkpoints(tmp_path)] == ["0000002", "0000004",
                                                                  "0000005"]


def test_a_signal_during_a_save_stops_at_that_update(prepared, tmp_path, monkeypatch):
    """Found by review: the signal was read before the save_every checkpoint, so one that came
    while it was written trained one more update and wrote a second checkpoint."""
    import os
    import signal

    from xinda import checkpoint

    real = checkpoint.save_checkpoint

    def save_and_signal(model_dir, step, *args, **kwargs):
        path = real(model_dir, step, *args, **kwargs)
        if step == 3:  # (SIGTERM: a background job may start with SIGINT ignored)
            os.kill(os.getpid(), signal.SIGTERM)
        return path
    monkeypatch.setattr(checkpoint, "save_checkpoint", save_and_signal)
    with pytest.raises(KeyboardInterrupt):
        run(prepared, tmp_path, max_steps=20, save_every=3, run_validation="false")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000003.safetensors"]


def test_patience_without_validation_does_not_keep_a_run_stopped(prepared, tmp_path,
                                                                  per_epoch):
    """Found by review: resumed with run_validation off, an early-stopped run warned that
    patience had no effect, and stayed stopped by it."""
    scores = iter([0.5, 0.4, 0.3])
    first = run(prepared, tmp_path, max_steps=5 * per_epoch, patience=1,
                valid_bleu=lambda _model: next(scores), valid_bleu_setting="true")
    assert first.step == 2 * per_epoch and first.bad_epochs == 1  # stopped early
    again = run(prepared, tmp_path, resume=True, max_steps=3 * per_epoch, patience=1,
                run_validation="false")
    assert again.step == 3 * per_epoch


def test_a_limit_on_a_save_every_step_keeps_it_on_the_grid(prepared, tmp_path, per_epoch):
    """Found by review: a run stopped by max_steps on a save_every step, validated there, was
    saved again marked as a stop, and a resumed run then dropped it from keep_last."""
    assert per_epoch > 4  # so that update 4 is inside the first epoch
    settings = {"save_every": 2, "keep_last": 10, "run_validation": "true"}
    run(prepared, tmp_path / "a", max_steps=per_epoch + 3, **settings)
    run(prepared, tmp_path / "b", max_steps=4, **settings)
    run(prepared, tmp_path / "b", resume=True, max_steps=per_epoch + 3, **settings)
    assert [c.name for c in list_checkpoints(tmp_path / "b")] == [
        c.name for c in list_checkpoints(tmp_path / "a")]


def test_with_save_every_the_epoch_ends_between_its_steps_are_not_kept(prepared, tmp_path,
                                                                        per_epoch):
    """The epochs' checkpoints between save_every steps are kept only until the next one (to
    resume from). Before: they took keep_last places and `xinda average --last` slots, next to
    grid checkpoints an update or two away (found by review)."""
    every = next(k for k in range(2, 10) if per_epoch % k)
    steps = every * (per_epoch // every + 3)  # epoch ends at per_epoch, ... are off the grid
    run(prepared, tmp_path, max_steps=steps, save_every=every, keep_last=50)
    kept = [int(c.stem.split("_")[1]) for c in list_checkpoints(tmp_path)]
    assert kept == list(range(every, steps + 1, every))


def test_the_model_folder_records_every_model_field(prepared, tmp_path):
    """Its config.yaml holds the resolved model, not a preset's name: the folder builds the
    same model after a preset or a default changes (found by review); --resume accepts it."""
    import yaml

    from xinda.models.registry import resolve

    cfg = load_config(prepared.config, ["train.max_steps=1", f"train.out_dir={tmp_path}"])
    run(prepared, tmp_path, max_steps=1)
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text(encoding="utf-8"))["model"]
    assert "preset" not in saved and saved == resolve(cfg.model).model_dump(mode="json")
    assert run(prepared, tmp_path, resume=True, max_steps=2).step == 2


def validated_steps(out) -> list[int]:
    return [int(r["step"]) for r in rows(out) if r["valid_loss"]]


def test_valid_every_validates_inside_epochs_and_each_epoch_end_once(prepared, tmp_path,
                                                                    per_epoch, monkeypatch):
    """train.valid_every 4: updates 4, 8, ... and every epoch's end, none twice; the best
    weights may come from inside an epoch, while early stopping counts epoch ends only: here
    update 4 scores best, the other validations inside epochs worst, and the epoch ends
    improve, so patience 1 runs all 3 epochs."""
    ends = {per_epoch, 2 * per_epoch, 3 * per_epoch}

    def validate(trainer) -> dict:
        step = trainer.progress.step
        loss = 1.0 if step == 4 else 3.0 - step / 100 if step in ends else 9.0
        return {"loss": loss, "nll": loss}
    monkeypatch.setattr(Trainer, "validate", validate)
    progress = run(prepared, tmp_path, valid_every=4, patience=1, max_epochs=3)
    assert progress.step == 3 * per_epoch and progress.bad_epochs == 0
    assert validated_steps(tmp_path) == sorted(set(range(4, 3 * per_epoch + 1, 4)) | ends)
    assert progress.best == -1.0  # best.safetensors holds update 4's weights


def test_an_epoch_ending_in_skipped_updates_counts_its_mid_epoch_validation(
        prepared, tmp_path, per_epoch, monkeypatch):
    """valid_every validates update per_epoch - 1, then fp16 skips the epoch's last batch
    (an overflow): the epoch's end counts that validation for early stopping, without a
    second one. A constant loss improves once, then patience 1 stops after epoch 2. Before:
    epoch 1 went uncounted, and a third epoch ran."""
    update = Trainer.update

    def overflow_at_the_end_of_epoch_1(trainer, group):
        p = trainer.progress
        return None if (p.epoch, p.batch) == (1, per_epoch - 1) else update(trainer, group)
    monkeypatch.setattr(Trainer, "update", overflow_at_the_end_of_epoch_1)
    monkeypatch.setattr(Trainer, "validate", lambda trainer: {"loss": 5.0, "nll": 5.0})
    assert per_epoch >= 3
    settings = {"valid_every": per_epoch - 1, "patience": 1, "max_epochs": 3}
    progress = run(prepared, tmp_path / "whole", **settings)
    assert (progress.step, progress.bad_epochs) == (2 * per_epoch - 1, 1)
    steps = [per_epoch - 1, 2 * per_epoch - 2, 2 * per_epoch - 1]
    assert validated_steps(tmp_path / "whole") == steps
    # stopped after that validation and resumed: the checkpoint's score counts, the same rows
    # (before: update per_epoch - 1 validated twice, found by review)
    run(prepared, tmp_path / "parts", max_steps=per_epoch - 1, **settings)
    assert run(prepared, tmp_path / "parts", resume=True, **settings).step == progress.step
    assert validated_steps(tmp_path / "parts") == steps


def test_valid_every_resumes_exactly(prepared, tmp_path, per_epoch):
    """Stopped after update 6 (between two validations) and resumed: the same validations, at
    the same updates, with the same losses, as one uninterrupted run, and the one where the
    limit stopped it."""
    whole = run(prepared, tmp_path / "whole", valid_every=4, max_epochs=2)
    run(prepared, tmp_path / "parts", valid_every=4, max_epochs=2, max_steps=6)
    parts = run(prepared, tmp_path / "parts", resume=True, valid_every=4, max_epochs=2)
    assert parts.step == whole.step == 2 * per_epoch
    losses = [[(r["step"], r["valid_loss"]) for r in rows(tmp_path / name) if r["valid_loss"]]
              for name in ("whole", "parts")]
    assert [s for s in validated_steps(tmp_path / "whole") if s % per_epoch]  # inside epochs
    assert losses[0] == [x for x in losses[1] if x[0] != "6"]
    assert 6 in validated_steps(tmp_path / "parts")


def test_valid_every_without_validation_warns(prepared, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="xinda"):
        run(prepared, tmp_path, valid_every=2, max_steps=2, run_validation="false")
    assert "train.valid_every 2 has no effect: train.run_validation is off" in caplog.text


def test_a_time_limit_spent_by_a_mid_epoch_validation_stops_there(prepared, tmp_path,
                                                                   monkeypatch):
    """The validation at update 4 uses up train.max_seconds (a clock that only validations
    move). Before: one more update ran and was validated again on the way out (found by
    review)."""
    clock, validate = [0.0], Trainer.validate

    def slow_validate(trainer) -> dict:
        clock[0] += 10.0
        return validate(trainer)
    monkeypatch.setattr(Trainer, "validate", slow_validate)
    monkeypatch.setattr(Trainer, "wall_seconds", lambda trainer: clock[0])
    assert run(prepared, tmp_path, valid_every=4, max_seconds=5).step == 4
    assert validated_steps(tmp_path) == [4]


def test_a_signal_during_a_mid_epoch_validation_stops_after_it(prepared, tmp_path,
                                                               monkeypatch):
    """Before: the stop request was read before the validation, so one more update ran and
    the checkpoint was update 5's (found by review)."""
    import signal

    validate = Trainer.validate

    def validate_then_signal(trainer) -> dict:
        if trainer.progress.step == 4:  # as if SIGTERM came during the validation
            trainer.signals.received = signal.SIGTERM
        return validate(trainer)
    monkeypatch.setattr(Trainer, "validate", validate_then_signal)
    with pytest.raises(KeyboardInterrupt):
        run(prepared, tmp_path, valid_every=4)
    assert newest_progress(tmp_path)["step"] == 4


def test_a_crash_after_the_first_mid_epoch_validation_can_resume(prepared, tmp_path,
                                                                 monkeypatch):
    """The first mid-epoch validation writes best.safetensors and a checkpoint with it. Before:
    a crash before the epoch's end left best.safetensors without a checkpoint, and both a
    new run and --resume were refused (found by review)."""
    update = Trainer.update

    def crash_at_3(trainer, group):
        if trainer.progress.step == 3:
            raise MemoryError("killed")
        return update(trainer, group)
    with monkeypatch.context() as patched:
        patched.setattr(Trainer, "update", crash_at_3)
        with pytest.raises(MemoryError):
            run(prepared, tmp_path, valid_every=2)
    assert newest_progress(tmp_path)["step"] == 2
    assert run(prepared, tmp_path, resume=True, valid_every=2, max_steps=4).step == 4
