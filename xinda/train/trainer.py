"""The training loop: token batches, label-smoothed loss, scheduled Adam/SGD, checkpoints that
resume exactly, validation loss (and a validation score such as BLEU, computed by a callable the
caller passes in: ``xinda.evaluate.validation``), early stopping, progress bar, CSV log and
curves.

Stopping: SIGINT (Ctrl-C) or SIGTERM asks training to stop. The update under way (or the
end-of-epoch validation and checkpoint) finishes, a checkpoint of that update boundary is
written, and KeyboardInterrupt is raised (``xinda train`` prints "interrupted", exit code 130);
``--resume`` then continues exactly as if training had not stopped. A second signal stops at
once, keeping the checkpoints already written. (The handlers are installed by ``Trainer.train``
in the main thread only, and the previous ones restored when it returns.)
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from xinda import checkpoint as ckpt
from xinda.config import ExperimentConfig, save_config
from xinda.data.batching import Batch, collate, make_batches
from xinda.data.manifest import load_manifest, load_split, load_vocabularies
from xinda.device import autocast, pick_device, pick_precision
from xinda.errors import XindaError
from xinda.models.base import Seq2SeqModel
from xinda.models.registry import build_model, resolve
from xinda.train.curves import CsvLog, plot_curves
from xinda.train.loss import label_smoothed_nll
from xinda.train.schedule import learning_rate, make_optimizer, set_lr
from xinda.utils import atomic_write_text

log = logging.getLogger("xinda")

ValidBleu = Callable[[Seq2SeqModel], float]  # model -> BLEU of its validation translations


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint so a resumed run continues exactly."""

    step: int = 0  # updates done
    epoch: int = 1  # current epoch (1-based)
    batch: int = 0  # next batch of the current epoch
    tgt_tokens: int = 0  # target tokens trained on (incl. EOS)
    train_seconds: float = 0.0  # training-loop wall clock
    best: float = -math.inf  # best validation score (BLEU, or -loss)
    bad_epochs: int = 0  # epochs since the best one
    lr_resets: list[int] = field(default_factory=list)  # steps after which the model was grown


class Trainer:
    """Trains ``cfg.model`` on the prepared data in ``data_dir`` (default ``cfg.data.out_dir``).

    ``valid_bleu`` (``xinda.evaluate.validation.validation_bleu(cfg)``, built by the caller so that
    training imports neither decoding nor scoring) scores the model after each validation, beside
    the loss; without it the loss alone picks the best weights and drives early stopping."""

    def __init__(self, cfg: ExperimentConfig, data_dir: str | Path | None = None,
                 valid_bleu: ValidBleu | None = None):
        self.cfg, tc = cfg, cfg.train
        self.out = Path(tc.out_dir)
        self.data_dir = Path(data_dir or cfg.data.out_dir)
        if tc.threads:
            torch.set_num_threads(tc.threads)
        torch.manual_seed(tc.seed)
        self.device = pick_device(tc.device)
        self.precision = pick_precision(tc.precision, self.device)
        self.manifest = load_manifest(self.data_dir)
        self.vocab = load_vocabularies(self.data_dir, self.manifest).info
        self.model_cfg = resolve(cfg.model)
        self.model = build_model(self.model_cfg, self.vocab).to(self.device)
        self.optimizer = make_optimizer(tc, self.model.parameters())
        self.scaler = torch.amp.GradScaler(enabled=self.precision == "fp16")
        self.train_src, self.train_tgt = load_split(self.data_dir, "train")
        self.has_valid = "valid" in self.manifest["splits"]
        self.progress = Progress()
        self.valid_bleu = valid_bleu
        self.stop_signal: int | None = None  # a SIGINT/SIGTERM received while training
        if tc.valid_bleu and tc.run_validation and self.has_valid and valid_bleu is None:
            log.warning("train.valid_bleu is on but no BLEU scorer was given: validating by loss "
                        "(xinda.evaluate.validation.validation_bleu builds one)")

    # ------------------------------------------------------------------ set-up and resume
    def prepare_output_dir(self, resume: bool) -> None:
        """Make the model directory self-contained: config, manifest, sentencepiece models."""
        if self.out.exists() and ckpt.list_checkpoints(self.out) and not resume:
            raise XindaError(f"{self.out}: already holds checkpoints; use --resume to continue "
                             "or choose another train.out_dir")
        self.out.mkdir(parents=True, exist_ok=True)
        save_config(self.cfg, self.out / "config.yaml")
        for name in {*self.manifest["spm"].values(), "manifest.json"}:
            if (self.data_dir / name).resolve() != (self.out / name).resolve():
                shutil.copyfile(self.data_dir / name, self.out / name)
        self.csv = CsvLog(self.out / "log.csv")
        if resume:
            self.resume()

    def resume(self) -> None:
        found = ckpt.list_checkpoints(self.out)
        if not found:
            log.warning("--resume: no checkpoint in %s, starting from scratch", self.out)
            return
        ckpt.load_weights(self.model, found[-1])
        state = ckpt.load_state(found[-1])
        if state["optimizer"] is None:  # `xinda grow`: new parameters, so fresh Adam moments
            log.info("%s has no optimizer state: starting a fresh optimizer", found[-1].name)
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        if state["scaler"]:  # empty when saved by a disabled (non-fp16) scaler
            self.scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng"])
        self.progress = Progress(**state["progress"])
        self.csv.truncate_after(self.progress.step)
        log.info("resumed from %s (update %d, epoch %d, batch %d)", found[-1].name,
                 self.progress.step, self.progress.epoch, self.progress.batch)

    def save(self) -> None:
        state = {"optimizer": self.optimizer.state_dict(), "scaler": self.scaler.state_dict(),
                 "rng": torch.get_rng_state(), "progress": asdict(self.progress)}
        ckpt.save_checkpoint(self.out, self.progress.step, self.model, state,
                             self.cfg.train.keep_last)

    def save_unless_saved(self) -> None:
        """Checkpoint the current update unless the newest checkpoint already holds it."""
        newest = ckpt.list_checkpoints(self.out, verify=False)
        if not newest or newest[-1].name != f"step_{self.progress.step:07d}.safetensors":
            self.save()

    # ------------------------------------------------------------------ the loop
    def train(self, resume: bool = False) -> Progress:
        with _os_errors_named(self.out):
            self.prepare_output_dir(resume)
            with self.stop_on_signals():
                return self._train()

    def _train(self) -> Progress:
        tc, p = self.cfg.train, self.progress
        log.info("model %s: %s parameters, %s, %s", self.model_cfg.arch,
                 f"{self.model.num_parameters():,}", self.device, self.precision)
        self._clock = None
        stop = self.steps_done()  # resumed from a run that had already finished
        while p.epoch <= tc.max_epochs and not stop:
            batches = make_batches(self.train_src.lengths, self.train_tgt.lengths,
                                   tc.max_tokens, tc.seed, p.epoch)
            stop = self.train_epoch(batches)
            if not stop:
                stop = self.end_of_epoch()
                self.stop_if_asked()
        if p.batch and tc.run_validation and self.has_valid:  # stopped inside an epoch
            self.validate_and_keep_best()
        self.save_unless_saved()
        self.write_stats()
        return p

    # ------------------------------------------------------------------ SIGINT and SIGTERM
    @contextmanager
    def stop_on_signals(self) -> Iterator[None]:
        """While training, SIGINT and SIGTERM set ``stop_signal`` (see ``stop_if_asked``);
        a second one raises KeyboardInterrupt at once. Main thread only; a signal that is
        ignored (SIG_IGN, e.g. under nohup) stays ignored."""
        previous, self.stop_signal = {}, None
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                handler = signal.getsignal(sig)
                if handler is not signal.SIG_IGN:
                    previous[sig] = handler
                    signal.signal(sig, self._on_signal)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)

    def _on_signal(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.stop_signal is not None:
            log.warning("%s again: stopping now (the checkpoints written so far are kept)", name)
            raise KeyboardInterrupt
        self.stop_signal = signum
        log.warning("%s: stopping after the current update, with a checkpoint (send it again "
                    "to stop at once)", name)

    def stop_if_asked(self) -> None:
        """At an update boundary: after a signal, checkpoint and raise KeyboardInterrupt."""
        if self.stop_signal is None:
            return
        self.save_unless_saved()
        log.warning("stopped by %s after update %d: checkpoint step_%07d saved in %s; continue "
                    "with --resume", signal.Signals(self.stop_signal).name, self.progress.step,
                    self.progress.step, ckpt.checkpoint_dir(self.out))
        raise KeyboardInterrupt

    def train_epoch(self, batches: list) -> bool:
        """Run the epoch's remaining batches; True when a step/time limit stops training."""
        tc, p = self.cfg.train, self.progress
        updates = math.ceil(len(batches) / tc.update_freq)
        bar = tqdm(total=updates, initial=p.batch // tc.update_freq, disable=not tc.progress,
                   desc=f"epoch {p.epoch}", unit="upd", dynamic_ncols=True, leave=False,
                   mininterval=0.5 if sys.stderr.isatty() else 30.0)
        window = [0.0, 0, 0.0]  # loss sum, tokens, seconds since the last log row
        for start in range(p.batch, len(batches), tc.update_freq):
            t0 = time.perf_counter()
            self._clock = self._clock or t0
            loss, nll, ntok = self.update(batches[start:start + tc.update_freq])
            seconds = time.perf_counter() - t0
            p.batch = start + tc.update_freq
            p.tgt_tokens += ntok
            window = [window[0] + loss, window[1] + ntok, window[2] + seconds]
            bar.update(1)
            bar.set_postfix(loss=f"{loss / ntok:.3f}", tok_s=f"{ntok / seconds:.0f}",
                            lr=f"{self.lr:.2e}", refresh=False)
            if p.step % tc.log_every == 0:
                self.csv.write(step=p.step, epoch=p.epoch, lr=self.lr,
                               train_loss=window[0] / window[1], train_nll=nll / ntok,
                               tok_per_s=window[1] / window[2], elapsed_s=p.train_seconds)
                window = [0.0, 0, 0.0]
            if tc.save_every and p.step % tc.save_every == 0:
                self.save()
            p.train_seconds += time.perf_counter() - t0  # loop wall clock, saving included
            if self.stop_signal is not None:
                bar.close()
                self.stop_if_asked()
            if self.limit_reached():
                bar.close()
                return True
        bar.close()
        return False

    def steps_done(self) -> bool:
        max_steps = self.cfg.train.max_steps
        return bool(max_steps and self.progress.step >= max_steps)

    def limit_reached(self) -> bool:
        tc = self.cfg.train
        over_time = tc.max_seconds and time.perf_counter() - self._clock >= tc.max_seconds
        return self.steps_done() or bool(over_time)

    def update(self, group: list) -> tuple[float, float, int]:
        """One optimiser update over ``group`` (gradient accumulation): returns summed loss,
        summed NLL and target tokens. Gradients are normalised by target tokens."""
        tc = self.cfg.train
        self.model.train()
        self.lr = learning_rate(tc, self.progress.step + 1, self.model_cfg.model_dim,
                                self.progress.lr_resets)
        set_lr(self.optimizer, self.lr)
        batches = [self.collate(idx) for idx in group]
        ntokens = sum(b.ntokens for b in batches)
        loss_sum = nll_sum = 0.0
        for batch in batches:
            with autocast(self.precision, self.device):
                logits = self.model(batch.src, batch.prev)
            loss, nll = label_smoothed_nll(logits, batch.target, tc.label_smoothing,
                                           self.vocab.pad)
            self.scaler.scale(loss / ntokens).backward()
            loss_sum, nll_sum = loss_sum + float(loss.detach()), nll_sum + float(nll.detach())
        self.scaler.unscale_(self.optimizer)
        if tc.clip_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.progress.step += 1
        return loss_sum, nll_sum, ntokens

    def collate(self, indices) -> Batch:
        v = self.vocab
        return collate(indices, self.train_src, self.train_tgt, v.pad, v.bos, v.eos).to(self.device)

    # ------------------------------------------------------------------ validation
    def end_of_epoch(self) -> bool:
        """Validate and keep the best weights, then checkpoint at the start of the next epoch
        (validation draws no random numbers, so resuming stays exact). True when early
        stopping triggers."""
        p, stop = self.progress, False
        if self.cfg.train.run_validation and self.has_valid:
            improved = self.validate_and_keep_best()
            p.bad_epochs = 0 if improved else p.bad_epochs + 1
            patience = self.cfg.train.patience
            if patience and p.bad_epochs >= patience:
                log.info("early stopping: no improvement for %d epochs", patience)
                stop = True
        p.epoch, p.batch = p.epoch + 1, 0
        self.save()
        return stop

    def validate_and_keep_best(self) -> bool:
        scores = self.validate()
        p = self.progress
        self.csv.write(step=p.step, epoch=p.epoch, valid_loss=scores["loss"],
                       valid_ppl=math.exp(min(scores["nll"], 50)), valid_bleu=scores.get("bleu"))
        plot_curves(self.out / "log.csv", self.out / "curves.png", str(self.out.name))
        score = scores.get("bleu", -scores["loss"])
        log.info("valid after update %d: loss %.3f ppl %.2f%s", p.step, scores["loss"],
                 math.exp(min(scores["nll"], 50)),
                 f" BLEU {scores['bleu']:.2f}" if "bleu" in scores else "")
        if score > p.best:
            ckpt.save_weights(self.model, self.out / "best.safetensors")
            p.best = score
            return True
        return False

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Per-token validation loss/NLL and, with a ``valid_bleu`` scorer, BLEU."""
        self.model.eval()
        src, tgt = load_split(self.data_dir, "valid")
        loss_sum = nll_sum = tokens = 0
        for idx in make_batches(src.lengths, tgt.lengths, self.cfg.train.max_tokens, 0, 0,
                                shuffle=False):
            b = collate(idx, src, tgt, self.vocab.pad, self.vocab.bos, self.vocab.eos)
            b = b.to(self.device)
            with autocast(self.precision, self.device):
                logits = self.model(b.src, b.prev)
            loss, nll = label_smoothed_nll(logits, b.target, self.cfg.train.label_smoothing,
                                           self.vocab.pad)
            loss_sum, nll_sum, tokens = loss_sum + float(loss), nll_sum + float(nll), \
                tokens + b.ntokens
        scores = {"loss": loss_sum / tokens, "nll": nll_sum / tokens}
        if self.valid_bleu is not None:
            with autocast(self.precision, self.device):
                scores["bleu"] = self.valid_bleu(self.model)
        return scores

    def write_stats(self) -> None:
        p = self.progress
        stats = {"steps": p.step, "epochs_done": p.epoch - 1,
                 "tgt_tokens": p.tgt_tokens, "train_seconds": p.train_seconds,
                 "tgt_tok_per_s": p.tgt_tokens / max(p.train_seconds, 1e-9),
                 "precision": self.precision, "device": str(self.device),
                 "parameters": self.model.num_parameters()}
        atomic_write_text(self.out / "train_stats.json", json.dumps(stats, indent=1))
        if (self.out / "log.csv").exists():
            plot_curves(self.out / "log.csv", self.out / "curves.png", str(self.out.name))


@contextmanager
def _os_errors_named(out: Path) -> Iterator[None]:
    """An OSError (no permission, disk full, ...) becomes a XindaError naming the file."""
    try:
        yield
    except OSError as err:
        raise XindaError(f"{err.filename or out}: {err.strerror or err}") from None
