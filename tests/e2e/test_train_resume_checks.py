"""What ``xinda train --resume`` refuses before it writes anything (another model, other data,
another batch order), what it takes from the config (optimizer settings), and the runs it must
not extend (an early-stopped one) or silently shadow (an older average)."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file

from xinda.checkpoint import default_weights, list_checkpoints, load_state


def files(folder) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.fixture
def model(trained, tmp_path):
    """A copy of the trained model directory, to resume."""
    return shutil.copytree(trained.model_dir, tmp_path / "model")


def resume(xinda, trained, model, *sets: str, ok: bool = True):
    args = [f"train.out_dir={model}", f"train.max_steps={trained.steps + 2}", *sets]
    return xinda("train", trained.prepared.config, "--resume",
                 *(x for s in args for x in ("--set", s)), ok=ok)


@pytest.mark.parametrize(("change", "fragments"), [
    ("model.d_model=64", ("model.d_model=32, not 64", "config.yaml")),
    ("model.norm=pre", ("model.norm=post, not pre",)),  # the same shapes
    ("train.seed=2", ("train.seed=1, not 2", "same batches")),
    ("train.max_tokens=400", ("train.max_tokens=500, not 400",)),
    ("train.optimizer=sgd", ("train.optimizer=adam, not sgd",)),
])
def test_a_changed_model_or_batch_order_is_refused_before_anything_is_written(
        trained, xinda, one_line_error, model, change, fragments):
    """Before: config.yaml was overwritten first (a wider model left a directory that no longer
    translates), and a same-shaped change or another seed went on silently."""
    before = files(model)
    one_line_error(resume(xinda, trained, model, change, ok=False), *fragments)
    assert files(model) == before


def test_other_prepared_data_is_refused(trained, xinda, one_line_error, model, tmp_path):
    """Another vocabulary of the same size would scramble the embeddings: before, it trained on."""
    other = tmp_path / "other-bin"
    xinda("prepare", trained.prepared.config, "--set", f"data.out_dir={other}",
          "--set", "data.seed=7", "--set", "data.spm_sample=150")
    assert (other / "spm.model").read_bytes() != (model / "spm.model").read_bytes()
    before = files(model)
    proc = resume(xinda, trained, model, f"data.out_dir={other}", ok=False)
    one_line_error(proc, str(other / "spm.model"), "not the sentencepiece model")
    assert files(model) == before


def test_data_prepared_with_other_settings_is_refused_other_files_warned(
        trained, xinda, one_line_error, tmp_path):
    """A prepare with a new vocab_size that failed left the old data, and train used it while
    its config (and the model's) said the new size: before, silently."""
    data = trained.prepared.data_dir
    proc = xinda("train", trained.prepared.config, "--set", f"train.out_dir={tmp_path / 'a'}",
                 "--set", "data.vocab_size=90", "--set", "data.lowercase=true", ok=False)
    one_line_error(proc, f"{data}: prepared with other data settings than the config's "
                         "(data.lowercase False -> True, data.vocab_size ", " -> 90): run xinda "
                         "prepare again")
    assert not (tmp_path / "a").exists()
    moved = xinda("train", trained.prepared.config, "--set", f"train.out_dir={tmp_path / 'b'}",
                  "--set", "train.max_steps=1", "--set", f"data.train={tmp_path / 'moved'}",
                  "--set", "data.workers=2")  # (a setting of how, not what: no warning)
    assert f"{data}: prepared from other files than the config names (data.train " in moved.stderr
    assert "data.workers" not in moved.stderr


def test_dropout_and_limits_may_change_and_optimizer_settings_come_from_the_config(
        trained, xinda, model):
    resume(xinda, trained, model, "model.dropout=0.2", "train.weight_decay=0.5",
           "train.eps=1e-6", "train.threads=1")
    newest = list_checkpoints(model)[-1]
    assert newest.name == f"step_{trained.steps + 2:07d}.safetensors"
    group, = load_state(newest)["optimizer"]["param_groups"]
    assert (group["weight_decay"], group["eps"]) == (0.5, 1e-6)  # before: 0.0 and 1e-8


def test_a_new_checkpoint_retires_an_older_average(trained, xinda, model):
    """``translate`` loads averaged.safetensors first: it must not shadow newer weights."""
    xinda("average", model, "--last", "2")
    resume(xinda, trained, model)
    assert not (model / "averaged.safetensors").exists()
    assert (model / f"averaged-before-step_{trained.steps + 2:07d}.safetensors").is_file()
    assert default_weights(model) != model / "averaged.safetensors"


def test_a_run_that_no_longer_validates_retires_its_best_weights(trained, xinda, model):
    """Found by review: resumed with run_validation off, translate went on loading the old
    best.safetensors after hundreds of newer updates. With validation on it stays."""
    assert (model / "best.safetensors").is_file()
    resume(xinda, trained, model, "train.run_validation=false")
    step = trained.steps + 2
    assert (model / f"best-before-step_{step:07d}.safetensors").is_file()
    assert default_weights(model) == list_checkpoints(model)[-1]


def test_a_non_finite_loss_stops_training_with_finite_checkpoints(trained, xinda,
                                                                  one_line_error, tmp_path):
    """Before: exit 0 and every kept checkpoint all NaN."""
    out = tmp_path / "diverged"
    sets = [f"train.out_dir={out}", "train.lr=1e6", "train.schedule=constant",
            "train.max_steps=40", "train.save_every=1", "train.keep_last=2"]
    proc = xinda("train", trained.prepared.config, *(x for s in sets for x in ("--set", s)),
                 ok=False)
    one_line_error(proc, "the training loss is nan", "lower train.lr")
    for path in list_checkpoints(out):
        assert all(torch.isfinite(t).all() for t in load_file(str(path)).values()), path.name


def test_resuming_an_early_stopped_run_trains_no_further(trained, xinda, tmp_path):
    """Before: each --resume trained one more epoch and early-stopped again."""
    out = tmp_path / "early"
    sets = [f"train.out_dir={out}", "train.patience=1", "train.lr=1e-12",
            "train.schedule=constant", "train.max_steps=400", "train.valid_bleu=false"]
    args = [x for s in sets for x in ("--set", s)]
    first = xinda("train", trained.prepared.config, *args)
    assert "early stopping" in first.stderr + first.stdout
    newest = list_checkpoints(out)[-1]
    xinda("train", trained.prepared.config, "--resume", *args)
    assert list_checkpoints(out)[-1] == newest


def test_a_sentence_longer_than_the_position_table_is_refused_before_training(
        prepared, xinda, write_config, one_line_error, tmp_path):
    """Before: a full epoch of training, then a ValueError traceback in validation and no
    checkpoint. Valid and test sets are not length-filtered, so prepare keeps such a line."""
    raw = dict(prepared.raw)
    for side in ("words", "digits"):
        lines = (prepared.root / "raw" / f"valid.{side}").read_text().splitlines()
        long = " ".join(["seven"] * 40) if side == "words" else "7" * 40
        (tmp_path / f"valid.{side}").write_text("\n".join([*lines, long]) + "\n")
    raw["valid"] = str(tmp_path / "valid")
    config = write_config(tmp_path / "config.yaml", raw, tmp_path / "bin", tmp_path / "model",
                          model={"max_positions": 32}, data={"max_len": 31})
    xinda("prepare", config)
    proc = xinda("train", config, ok=False)
    one_line_error(proc, "valid source sentence 21 has", "model.max_positions 32")
    assert not list_checkpoints(tmp_path / "model")


def test_another_runs_weights_without_checkpoints_are_not_overwritten(trained, xinda,
                                                                      one_line_error, model):
    """A finished run whose checkpoints were deleted to save space keeps its best weights."""
    shutil.rmtree(model / "checkpoints")
    before = files(model)
    for resume_flag in ([], ["--resume"]):
        proc = xinda("train", trained.prepared.config, *resume_flag, "--set",
                     f"train.out_dir={model}", ok=False)
        one_line_error(proc, str(model), "best.safetensors", "no checkpoint")
    assert files(model) == before


def test_pairs_longer_than_max_tokens_are_warned_about(trained, xinda, tmp_path):
    """Before: they silently became batches above the budget."""
    proc = xinda("train", trained.prepared.config, "--set", f"train.out_dir={tmp_path / 'm'}",
                 "--set", "train.max_tokens=6", "--set", "train.max_steps=1")
    assert "longer than train.max_tokens 6" in proc.stderr
