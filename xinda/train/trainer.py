"""The training loop: token batches, label-smoothed loss, scheduled Adam/SGD, checkpoints that
resume exactly, validation loss and score (BLEU, by a callable the caller passes in:
``xinda.evaluate.validation``), early stopping, progress bar, CSV log and curves.

Stopping: SIGINT (Ctrl-C) or SIGTERM asks training to stop. The update under way (or the
validation and checkpoint after it) finishes, a checkpoint of that update boundary is
written, and KeyboardInterrupt is raised (``xinda train`` prints "interrupted", exit code 130);
``--resume`` then continues exactly as if training had not stopped. A second signal stops at
once, keeping the checkpoints already written (handlers: ``xinda.train.signals``). Under
torchrun all ranks agree on when to stop, and a signal repeated within a second counts once
(torchrun passes on the Ctrl-C its ranks already got from the terminal).
"""

from __future__ import annotations

import logging
import math
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from xinda import checkpoint as ckpt
from xinda.config import ExperimentConfig, save_config
from xinda.data.batching import collate, make_batches
from xinda.data.manifest import data_fingerprint, load_manifest, load_split, load_vocabularies
from xinda.device import pick_precision, tune_training_memory
from xinda.models.base import Seq2SeqModel
from xinda.models.registry import build_model
from xinda.train.curves import CsvLog, plot_curves
from xinda.train.distributed import Ranks, lost_contact, settings_fingerprint
from xinda.train.loss import LossSetup, batch_loss, corpus_loss
from xinda.train.progress import Progress, beats, validation_metric, warn_nothing_left
from xinda.train.run_dir import (
    apply_hyperparameters,
    check_batches_per_update,
    check_output_dir,
    check_splits,
    checked_model,
    experiment_config,
    nonfinite_loss,
    retire_shadowing,
    warn_data_fit,
    warn_validation_settings,
    write_stats,
)
from xinda.train.saved_state import checked_state
from xinda.train.schedule import learning_rate, make_optimizer, optimizer_step, set_lr, warn_warmup
from xinda.train.signals import StopSignals
from xinda.utils import atomic_path, os_errors_named

log = logging.getLogger("xinda")

ValidBleu = Callable[[Seq2SeqModel], float]  # model -> BLEU of its validation translations


class Trainer:
    """Trains ``cfg.model`` on the prepared data in ``data_dir`` (default ``cfg.data.out_dir``).
    ``valid_bleu`` (``xinda.evaluate.validation.validation_bleu(cfg)``, built by the caller:
    training imports no scoring) adds BLEU to each validation; else the loss picks the best.
    ``config``: the file ``cfg`` was read from (a new run will not write over it)."""

    def __init__(self, cfg: ExperimentConfig, data_dir: str | Path | None = None,
                 valid_bleu: ValidBleu | None = None, config: str | Path | None = None):
        tc = experiment_config(cfg).train  # (a path given for the config: a one-line error)
        self.cfg, self.out, self.config = cfg, Path(tc.out_dir), config
        self.data_dir = Path(data_dir or cfg.data.out_dir)
        if tc.threads:
            torch.set_num_threads(tc.threads)
        tune_training_memory(tc.onednn_cache, tc.keep_heap)
        self.ranks = Ranks.from_env(tc.device, tc.dist_timeout)
        torch.manual_seed(tc.seed)
        self.device = self.ranks.device
        self.precision = pick_precision(tc.precision, self.device)
        self.manifest = load_manifest(self.data_dir)
        self.vocab = load_vocabularies(self.data_dir, self.manifest).info
        self.model_cfg = checked_model(cfg)  # (what `xinda train` checks before any work)
        self.model = build_model(self.model_cfg, self.vocab).to(self.device)
        self.net = self.model  # what trains: in DistributedDataParallel with several ranks
        self.ranks.seed_rank(tc.seed)
        # DDP finds unused weights from the forward outputs: an untied output layer applied
        # outside forward (chunked loss) would look unused, so that case keeps the full logits
        self.find_unused = getattr(self.model_cfg, "layer_dropout", 0) > 0
        chunk = 0 if self.ranks.enabled and self.find_unused else tc.loss_chunk
        self.loss_setup = LossSetup(tc.label_smoothing, self.vocab.pad, chunk, self.precision,
                                    self.device)
        self.optimizer = make_optimizer(tc, self.model.parameters())
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        self.train_src, self.train_tgt = load_split(self.data_dir, "train")
        self.has_valid = "valid" in self.manifest["splits"]
        check_splits(self.data_dir, (self.train_src, self.train_tgt), self.has_valid,
                     self.model_cfg.max_positions, self.vocab)
        if self.ranks.is_main:
            warn_data_fit(cfg, self.train_src, self.train_tgt, self.vocab)
        self.progress, self.valid_bleu = Progress(), valid_bleu
        self.metric = validation_metric(cfg, valid_bleu is not None,  # what validations score
                                        self.manifest["splits"].get("valid", {}))
        self.signals = StopSignals(self.ranks.enabled)  # SIGINT/SIGTERM while training
        self.saved_step: int | None = None  # the update of the newest checkpoint
        self._clock, self._wall_base = time.perf_counter(), 0.0  # see ``wall_seconds``
        warn_validation_settings(tc, self.has_valid, valid_bleu is not None)
        self.start_rng = self.ranks.rng_state()  # what train() draws from (not resumed)

    # ------------------------------------------------------------------ set-up and resume
    def write_output_dir(self) -> None:
        """Make the model directory self-contained: config, manifest, sentencepiece models
        (rank 0, once the newest checkpoint has loaded)."""
        self.out.mkdir(parents=True, exist_ok=True)
        save_config(self.cfg, self.out / "config.yaml", self.model_cfg)
        for name in {*self.manifest["spm"].values(), "manifest.json"}:
            if (self.data_dir / name).resolve() != (self.out / name).resolve():
                with atomic_path(self.out / name) as tmp:
                    shutil.copyfile(self.data_dir / name, tmp)
        self.csv = CsvLog(self.out / "log.csv")
        # rows after the checkpoint, or at it but unlogged in it, come again (fresh run: all)
        p, step = self.progress, self.saved_step or 0
        self.csv.truncate_after(step, not p.log_window[2], p.validated_step == step)

    def resume(self) -> None:
        """Continue from the newest checkpoint: rank 0 reads it and sends it to the others."""
        if (state := self.ranks.state_from_main(self.read_newest)) is None:
            return
        if state["optimizer"] is not None:  # None after `xinda grow`: fresh Adam moments
            self.optimizer.load_state_dict(state["optimizer"])
            apply_hyperparameters(self.optimizer, self.cfg.train)
        if state["scaler"]:  # empty when saved by a disabled (non-fp16) scaler
            self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress(**state["progress"])
        self.ranks.restore_rng(state.get("ranks"), state["rng"], self.cfg.train.seed,
                               self.progress.step)
        self.saved_step = self.progress.step

    def read_newest(self) -> dict | None:
        """Rank 0: the newest checkpoint's state, its weights loaded into the model."""
        found = ckpt.list_checkpoints(self.out)
        if not found:
            log.warning("--resume: no checkpoint in %s, starting from scratch", self.out)
            return None
        state = checked_state(ckpt.load_state(found[-1]), ckpt.state_json(found[-1]),
                              self.optimizer)
        check_batches_per_update(self.out, state, self.ranks.world, self.cfg.train.update_freq)
        ckpt.load_weights(self.model, found[-1])
        if state["optimizer"] is None:
            log.info("%s has no optimizer state: starting a fresh optimizer", found[-1].name)
        log.info("resumed from %s (update %d, epoch %d, batch %d)", found[-1].name,
                 *(state["progress"][k] for k in ("step", "epoch", "batch")))
        return state

    def save(self, off_grid: bool = False) -> None:
        """Checkpoint (all ranks call it: their random states are collected; rank 0 writes);
        ``off_grid``: where the run stopped (a signal, a limit) or an epoch's end between
        save_every steps, not on the grid of checkpoints kept (``ckpt.save_checkpoint``)."""
        ranks = self.ranks.save_rng()
        self.ranks.main_only(lambda: self.write_checkpoint(ranks, off_grid))  # error: all's
        self.saved_step = self.progress.step

    def write_checkpoint(self, ranks: dict | None, off_grid: bool = False) -> None:
        self.progress.wall_seconds = self.wall_seconds()
        state = {"optimizer": self.optimizer.state_dict(), "scaler": self.scaler.state_dict(),
                 "rng": torch.get_rng_state(), "progress": asdict(self.progress),
                 "batches_per_update": self.ranks.world * self.cfg.train.update_freq}
        if ranks:
            state["ranks"] = ranks  # {"world_size": W, "rng": [each rank's generators]}
        ckpt.save_checkpoint(self.out, self.progress.step, self.model, state,
                             self.cfg.train.keep_last, off_grid)
        retire_shadowing(self.out, self.progress.step,
                         self.cfg.train.run_validation and self.has_valid)

    def save_unless_saved(self, off_grid: bool = False) -> None:
        """Checkpoint the current update unless the newest checkpoint already holds it."""
        if self.saved_step != self.progress.step:
            self.save(off_grid)

    # ------------------------------------------------------------------ the loop
    def train(self, resume: bool = False) -> Progress:
        with lost_contact(self.ranks.rank), os_errors_named(self.out):
            self.ranks.check_same({
                "prepared data": data_fingerprint(self.data_dir, self.manifest),
                "model or train settings": settings_fingerprint(self.model_cfg, self.cfg.train)})
            self.ranks.main_only(lambda: check_output_dir(
                self.out, resume, self.cfg, self.data_dir, self.manifest, self.config))
            self.ranks.set_rng_state(self.start_rng)  # (another Trainer built since reseeds)
            if resume:
                self.resume()
            self.ranks.main_only(self.write_output_dir)
            self.net = self.ranks.wrap(self.model, self.find_unused)
            with self.signals.installed():
                progress = self._train()
            self.ranks.close()  # (its barrier too: a rank that failed at the end is lost contact)
        return progress

    def _train(self) -> Progress:
        tc, p, resumed_at = self.cfg.train, self.progress, self.progress.step
        log.info("model %s: %s parameters, %s, %s", self.model_cfg.arch,
                 f"{self.model.num_parameters():,}", self.device, self.precision)
        warn_warmup(tc, p.lr_resets)  # (a grown run restarted at the peak rate)
        if self.ranks.enabled:
            log.info("data-parallel: %d ranks; batch per update: that many x %d tokens x %d "
                     "(update_freq)", self.ranks.world, tc.max_tokens, tc.update_freq)
        self._clock, self._wall_base = time.perf_counter(), p.wall_seconds
        # resumed from a finished run, maybe owing the epoch end or the last validation that
        # a kill interrupted (all ranks decide alike: the clock is each rank's)
        stop = self.ranks.any(self.limit_reached() or self.stopped_early())[0]
        while p.epoch <= tc.max_epochs and (not stop or p.batch):
            with p.timed():
                batches = make_batches(self.train_src.lengths, self.train_tgt.lengths,
                                       tc.max_tokens, tc.seed, p.epoch)
            stop = stop or self.train_epoch(batches)
            if p.batch < len(batches):
                break  # a limit stopped training inside the epoch
            stop = self.end_of_epoch() or stop
            if not stop and p.epoch <= tc.max_epochs:  # (a finished run ends as without it)
                self.stop_if_asked(*self.ranks.any(self.signals.received is not None))
        if self.ranks.is_main and p.log_window[2]:  # the updates since the last row (kept in
            self.csv.write_window(p, learning_rate(  # the window: logged again after a resume)
                tc, p.step, self.model_cfg.model_dim, p.lr_resets))
        if p.batch and p.validated_step != p.step and self.validate_in_epoch():  # stopped there
            self.save(off_grid=not (tc.save_every and p.step % tc.save_every == 0))
        self.save_unless_saved(off_grid=True)
        if self.ranks.is_main:
            warn_nothing_left(tc, p, resumed_at, self.wall_seconds(), self.stopped_early())
            write_stats(self.out, p, precision=self.precision, device=str(self.device),
                        parameters=self.model.num_parameters())
        return p

    # ------------------------------------------------------------------ SIGINT and SIGTERM
    def stop_if_asked(self, asked: bool) -> None:
        """At an update boundary, ``asked`` (a signal came, to any rank): checkpoint and raise
        KeyboardInterrupt."""
        if not asked:
            return
        self.save_unless_saved(off_grid=True)
        if self.ranks.is_main:
            name = signal.Signals(self.signals.received or signal.SIGTERM).name
            log.warning("stopped by %s after update %d: checkpoint step_%07d saved in %s; continue "
                        "with --resume", name, self.progress.step, self.progress.step,
                        ckpt.checkpoint_dir(self.out))
        raise KeyboardInterrupt

    def train_epoch(self, batches: list) -> bool:
        """Run the epoch's remaining batches; True when a step/time limit stops training.
        An update takes the next ``update_freq x ranks`` batches, shared out by the ranks."""
        tc, p = self.cfg.train, self.progress
        per_update = tc.update_freq * self.ranks.world
        updates = math.ceil(len(batches) / per_update)
        bar = tqdm(total=updates, initial=p.batch // per_update,
                   disable=not (tc.progress and self.ranks.is_main),
                   desc=f"epoch {p.epoch}", unit="upd", dynamic_ncols=True, leave=False,
                   mininterval=0.5 if sys.stderr.isatty() else 30.0)
        for start in range(p.batch, len(batches), per_update):
            t0 = time.perf_counter()
            done = self.update(batches[start:start + per_update])
            seconds = time.perf_counter() - t0
            p.batch = start + per_update
            if done is None:  # fp16 overflow: skipped, not an update
                p.train_seconds += seconds
                continue
            loss, nll, ntok = done
            p.tgt_tokens += ntok
            window = p.log_window
            window[:] = [window[0] + loss, window[1] + nll, window[2] + ntok, window[3] + seconds]
            bar.update(1)
            bar.set_postfix(loss=f"{loss / ntok:.3f}", tok_s=f"{ntok / seconds:.0f}",
                            lr=f"{self.lr:.2e}", refresh=False)
            # the limits first: a checkpoint written after them records the time they saw
            asked, limit = self.ranks.any(self.signals.received is not None, self.limit_reached())
            p.train_seconds += time.perf_counter() - t0  # the update's wall clock (in its row)
            if p.step % tc.log_every == 0:
                if self.ranks.is_main:
                    self.csv.write_window(p, self.lr)
                window[:] = [0.0, 0.0, 0, 0.0]
            if (tc.valid_every and p.step % tc.valid_every == 0 and p.batch < len(batches)
                    and self.validate_in_epoch()):  # (an epoch's last update: end_of_epoch's)
                asked, limit = self.ranks.any(asked or self.signals.received is not None,
                                              limit or self.limit_reached())  # (after it)
                if self.saved_step is None:  # best.safetensors needs a checkpoint to resume
                    with p.timed():  # (a limit or signal meanwhile stops after the next update)
                        self.save(off_grid=True)
            if tc.save_every and p.step % tc.save_every == 0:
                with p.timed():  # (recorded in the next checkpoint)
                    self.save()  # and a signal that came meanwhile stops here, not an update on
                asked = asked or self.ranks.any(self.signals.received is not None)[0]
            if asked or limit:
                bar.close()
            if limit:  # the run is over: validated and saved as without the signal
                return True
            self.stop_if_asked(asked)
        bar.close()
        return False

    def stopped_early(self) -> bool:
        return self.progress.stopped_early(self.cfg.train, self.has_valid)

    def limit_reached(self) -> bool:
        return bool(self.progress.limits_reached(self.cfg.train, self.wall_seconds()))

    def wall_seconds(self) -> float:
        """Wall clock of the training loops so far, validation included, over this run and
        the runs it resumes (what ``train.max_seconds`` limits)."""
        return self._wall_base + time.perf_counter() - self._clock

    def update(self, group: list) -> tuple[float, float, int] | None:
        """One optimiser update over the batches ``group`` (gradient accumulation; with several
        ranks each trains on its share, see ``Ranks.share``): the summed loss, NLL and target
        tokens of the whole group, which normalise the gradients; None if fp16 skipped it."""
        tc = self.cfg.train
        self.net.train()
        self.lr = learning_rate(tc, self.progress.step + 1, self.model_cfg.model_dim,
                                self.progress.lr_resets)
        set_lr(self.optimizer, self.lr)
        ntokens = int(sum((self.train_tgt.lengths[idx] + 1).sum() for idx in group))
        mine, weight = self.ranks.share(group)
        src, tgt, v = self.train_src, self.train_tgt, self.vocab
        batches = [collate(i, src, tgt, v.pad, v.bos, v.eos).to(self.device) for i in mine]
        loss_sum = nll_sum = 0.0
        for i, batch in enumerate(batches):
            with self.ranks.no_sync(self.net, sync=i + 1 == len(batches)):
                loss, nll = batch_loss(self.net, self.model, batch, self.loss_setup)
                self.scaler.scale(loss * weight / ntokens).backward()
            loss_sum += float(loss.detach()) * bool(weight)
            nll_sum += float(nll.detach()) * bool(weight)
        loss_sum, nll_sum = self.ranks.sum(loss_sum, nll_sum)
        if not math.isfinite(loss_sum) and not self.scaler.is_enabled():  # fp16: it skips
            raise nonfinite_loss(self.progress.step + 1, loss_sum, self.out)
        stepped = optimizer_step(self.optimizer, self.scaler, self.progress.step + 1, tc.clip_norm)
        self.optimizer.zero_grad(set_to_none=True)
        self.progress.step += stepped
        return (loss_sum, nll_sum, ntokens) if stepped else None

    # ------------------------------------------------------------------ validation
    def end_of_epoch(self) -> bool:
        """Validate and keep the best weights, then checkpoint at the start of the next epoch
        (validation draws no random numbers, so resuming stays exact). True when early
        stopping triggers, or a limit (the validation's time counted) before the checkpoint,
        which then records the time spent: a resumed run stops at once."""
        p = self.progress
        # rank 0 counts the epoch (not weights an epoch's end counted already: an epoch whose
        # fp16 updates all overflowed); the others follow its decision, and fail with its error
        stop = (self.cfg.train.run_validation and self.has_valid and p.counted_step != p.step
                and self.ranks.main_only(self.validate_epoch))
        stop = self.ranks.any(self.limit_reached())[0] or stop
        p.epoch, p.batch, p.validated_step, p.counted_step = p.epoch + 1, 0, p.step, p.step
        with p.timed():  # the epoch's checkpoint counts as training time, its validation not
            self.save(off_grid=p.step % (self.cfg.train.save_every or 1) != 0)
        return stop

    def validate_in_epoch(self) -> bool:
        """Validate between updates (``train.valid_every``, a stop in an epoch); False: none."""
        if not (self.cfg.train.run_validation and self.has_valid):
            return False
        self.ranks.main_only(self.validate_and_keep_best)
        self.progress.validated_step = self.progress.step  # (all ranks: checkpoints record it)
        return True

    def validate_epoch(self) -> bool:
        """Count the epoch for early stopping (by this update's validation if any); True to stop."""
        p = self.progress
        score, loss = (p.validated_score if p.validated_step == p.step and p.validated_score
                       and p.best_metric == self.metric else self.validate_and_keep_best())
        if improved := beats(score, loss, p.epoch_best, p.epoch_best_loss):
            p.epoch_best, p.epoch_best_loss = score, loss
        p.bad_epochs = 0 if improved else p.bad_epochs + 1
        if self.stopped_early():
            log.info("early stopping: no improvement for %d epochs", self.cfg.train.patience)
        return self.stopped_early()

    def validate_and_keep_best(self) -> tuple[float, float]:
        """Validate, log, keep best.safetensors; the score (BLEU, or -loss) and the loss."""
        scores = self.validate()
        p = self.progress
        self.csv.write(step=p.step, epoch=p.epoch, elapsed_s=p.train_seconds,
                       valid_loss=scores["loss"], valid_ppl=math.exp(min(scores["nll"], 50)),
                       valid_bleu=scores.get("bleu"))
        plot_curves(self.out / "log.csv", self.out / "curves.png", str(self.out.name))
        score = scores.get("bleu", -scores["loss"])
        p.use_metric(self.metric)
        log.info("valid after update %d: loss %.3f ppl %.2f%s", p.step, scores["loss"],
                 math.exp(min(scores["nll"], 50)),
                 f" BLEU {scores['bleu']:.2f}" if "bleu" in scores else "")
        if beats(score, scores["loss"], p.best, p.best_loss):
            ckpt.save_weights(self.model, self.out / "best.safetensors")
            p.best, p.best_loss = score, scores["loss"]
        p.validated_score = [score, scores["loss"]]
        return score, scores["loss"]

    def validate(self) -> dict[str, float]:
        """Per-token validation loss/NLL and, with a ``valid_bleu`` scorer, BLEU."""
        self.model.eval()
        scores = corpus_loss(self.model, load_split(self.data_dir, "valid"),
                             self.cfg.train.max_tokens, self.loss_setup, self.vocab)
        if self.valid_bleu is not None:
            with torch.no_grad():  # (the scorer decodes in fp32)
                scores["bleu"] = self.valid_bleu(self.model)
        return scores
