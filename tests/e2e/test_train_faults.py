"""Training that is stopped or cannot write: SIGINT / SIGTERM write a checkpoint of the last
completed update and exit 130, and ``--resume`` then ends exactly where an uninterrupted run
ends; a second signal stops at once; an unwritable model directory, weights that are not
safetensors and a format-1 run directory are one-line errors."""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import time

import pytest
import torch
from run_state import without_clocks
from safetensors.torch import load_file

from xinda.checkpoint import list_checkpoints, load_state, state_json, state_tensors
from xinda.config import load_config
from xinda.data.batching import make_batches
from xinda.train.trainer import Trainer

TRAIN = {"save_every": 0, "keep_last": 20, "log_every": 1, "valid_bleu": False, "threads": 1}


def step_of(path) -> int:
    return int(path.name.split("_")[1].split(".")[0])


def logged_steps(run_dir) -> list[int]:
    """Steps of the complete training rows of log.csv (a row being appended is left out)."""
    if not (run_dir / "log.csv").exists():
        return []
    with (run_dir / "log.csv").open(newline="") as f:
        text = f.read()
    rows = list(csv.DictReader(text[:text.rfind("\n") + 1].splitlines()))
    return [int(r["step"]) for r in rows if r.get("train_loss")]


def assert_same_run(a_dir, b_dir, step):
    final = a_dir / "checkpoints" / f"step_{step:07d}.safetensors"
    other = b_dir / "checkpoints" / final.name
    weights_a, weights_b = load_file(str(final)), load_file(str(other))
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        assert torch.equal(weights_a[name], weights_b[name]), f"{name} differs"
    state_a, state_b = load_state(final), load_state(other)
    assert without_clocks(state_a["progress"]) == without_clocks(state_b["progress"])
    assert torch.equal(state_a["rng"], state_b["rng"])
    for index, entry in state_a["optimizer"]["state"].items():
        for key, tensor in entry.items():
            assert torch.equal(tensor, state_b["optimizer"]["state"][index][key]), (index, key)


# A shell without job control starts background commands with SIGINT ignored, and the ignoring
# is inherited: xinda then (rightly) leaves SIGINT alone, so those cases cannot run there.
SIGNALS = [pytest.param(signal.SIGINT, id="SIGINT", marks=pytest.mark.skipif(
               signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
               reason="SIGINT is ignored in this process (started in the background)")),
           pytest.param(signal.SIGTERM, id="SIGTERM")]


@pytest.mark.parametrize("sig", SIGNALS)
def test_a_signal_saves_the_last_update_and_resume_equals_an_uninterrupted_run(
        prepared, write_config, xinda, xinda_popen, tmp_path, sig):
    b_dir = tmp_path / "B"
    config_b = write_config(tmp_path / "B.yaml", prepared.raw, prepared.data_dir, b_dir,
                            train={**TRAIN, "max_steps": 100_000, "out_dir": str(b_dir)})
    with (tmp_path / "B.log").open("w") as out:
        proc = xinda_popen("train", config_b, stdout=out, stderr=out)
        try:
            deadline = time.monotonic() + 150
            while (len(logged_steps(b_dir)) < 3 and proc.poll() is None
                   and time.monotonic() < deadline):
                time.sleep(0.01)
            assert proc.poll() is None, (tmp_path / "B.log").read_text()
            assert len(logged_steps(b_dir)) >= 3, "training did not get under way in 150 s"
            proc.send_signal(sig)
            proc.wait(timeout=120)
        finally:
            proc.kill()
            proc.wait(timeout=60)
    output = (tmp_path / "B.log").read_text()
    assert proc.returncode == 130, output
    assert output.rstrip().endswith("xinda: interrupted"), output
    last = logged_steps(b_dir)[-1]
    assert f"stopped by {sig.name} after update {last}: checkpoint step_{last:07d}" in output
    assert not (b_dir / "train_stats.json").exists()
    newest = list_checkpoints(b_dir)[-1]
    assert step_of(newest) == last
    assert load_state(newest)["progress"]["step"] == last

    target = last + 5
    proc = xinda("train", config_b, "--resume", "--set", f"train.max_steps={target}")
    assert f"resumed from step_{last:07d}" in proc.stderr
    assert f"trained {target} updates" in proc.stdout

    a_dir = tmp_path / "A"
    config_a = write_config(tmp_path / "A.yaml", prepared.raw, prepared.data_dir, a_dir,
                            train={**TRAIN, "max_steps": target, "out_dir": str(a_dir)})
    xinda("train", config_a)
    assert_same_run(a_dir, b_dir, target)
    assert logged_steps(b_dir) == logged_steps(a_dir) == list(range(1, target + 1))


def trainer_for(prepared, write_config, out_dir, **train) -> Trainer:
    path = write_config(out_dir.with_suffix(".yaml"), prepared.raw, prepared.data_dir, out_dir,
                        train={**TRAIN, "out_dir": str(out_dir), "progress": False, **train})
    return Trainer(load_config(path))


def signal_inside_update(trainer: Trainer, sig: int, at_step: int, times: int = 1) -> None:
    """Send ``sig`` to this process ``times`` times in the middle of update ``at_step``: after
    the optimizer stepped, before the update is counted."""
    zero_grad = trainer.optimizer.zero_grad

    def zero_grad_then_signal(*args, **kwargs):
        zero_grad(*args, **kwargs)
        if trainer.progress.step == at_step - 1:
            for _ in range(times):
                os.kill(os.getpid(), sig)
                time.sleep(0.01)  # let the handler run

    trainer.optimizer.zero_grad = zero_grad_then_signal


@pytest.mark.parametrize("sig", SIGNALS)
def test_a_signal_inside_an_update_saves_that_update_whole(prepared, write_config, tmp_path,
                                                           sig):
    before = signal.getsignal(sig)
    trainer = trainer_for(prepared, write_config, tmp_path / "B", max_steps=100)
    signal_inside_update(trainer, sig, at_step=3)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert signal.getsignal(sig) is before  # the previous handler is back
    [saved] = list_checkpoints(tmp_path / "B")
    progress = load_state(saved)["progress"]
    assert (saved.name, progress["step"], progress["epoch"], progress["batch"]) == (
        "step_0000003.safetensors", 3, 1, 3)

    uninterrupted = trainer_for(prepared, write_config, tmp_path / "A", max_steps=3,
                                run_validation=False)
    uninterrupted.train()
    assert_same_run(tmp_path / "A", tmp_path / "B", 3)


def test_a_second_signal_stops_at_once_without_a_checkpoint(prepared, write_config, tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    trainer = trainer_for(prepared, write_config, tmp_path / "B", max_steps=100)
    signal_inside_update(trainer, signal.SIGTERM, at_step=3, times=2)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert signal.getsignal(signal.SIGTERM) is before
    assert trainer.progress.step == 2  # update 3 never finished
    assert list_checkpoints(tmp_path / "B") == []


def test_kill_9_while_a_checkpoint_is_written_leaves_only_complete_ones(
        prepared, write_config, xinda, xinda_popen, tmp_path):
    """SIGKILL as soon as a temporary file shows that a checkpoint is being written, three
    times over, resuming each time: whatever the kill tore is never listed, every listed
    checkpoint loads, and a last ``--resume`` finishes."""
    run = tmp_path / "K"
    config = write_config(tmp_path / "K.yaml", prepared.raw, prepared.data_dir, run,
                          train={**TRAIN, "save_every": 1, "keep_last": 100_000,
                                 "max_steps": 100_000, "out_dir": str(run)})
    folder, newest = run / "checkpoints", 0
    for attempt in range(3):
        proc = xinda_popen("train", config, *(["--resume"] if attempt else []),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 150
            while proc.poll() is None and time.monotonic() < deadline and not (
                    len(logged_steps(run)) > newest + 2
                    and any(p.name.startswith(".") for p in folder.iterdir())):
                time.sleep(0.0005)
        finally:
            proc.kill()
            proc.wait(timeout=60)
        found = list_checkpoints(run)
        assert step_of(found[-1]) > newest, f"attempt {attempt}: no new complete checkpoint"
        newest = step_of(found[-1])
        for weights in found:
            assert load_state(weights)["progress"]["step"] == step_of(weights)
            load_file(str(weights))
    target = newest + 2
    proc = xinda("train", config, "--resume", "--set", f"train.max_steps={target}")
    assert f"trained {target} updates" in proc.stdout


# ------------------------------------------------------------------ one-line errors
def test_a_model_dir_that_cannot_be_created_is_one_line(prepared, xinda, one_line_error,
                                                        tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = xinda("train", prepared.config, "--set", f"train.out_dir={blocker / 'model'}",
                 ok=False)
    line = one_line_error(proc, str(blocker / "model"))
    assert line.endswith(("Not a directory", "File exists")), line
    assert blocker.read_text() == "not a directory"


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root writes into read-only directories: chmod cannot make one")
def test_a_read_only_model_dir_is_one_line(trained, xinda, one_line_error, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(trained.model_dir, model)
    before = {p: p.read_bytes() for p in model.rglob("*") if p.is_file()}
    for folder in (model / "checkpoints", model):
        folder.chmod(0o555)
    try:
        proc = xinda("train", trained.prepared.config, "--resume", "--set",
                     f"train.out_dir={model}", "--set", f"train.max_steps={trained.steps + 5}",
                     ok=False)
    finally:
        for folder in (model, model / "checkpoints"):
            folder.chmod(0o755)
    one_line_error(proc, str(model), "Permission denied")
    assert {p: p.read_bytes() for p in model.rglob("*") if p.is_file()} == before


def test_weights_that_are_not_safetensors_are_one_line(trained, xinda, one_line_error,
                                                       tmp_path):
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(os.urandom(2048))
    proc = xinda("translate", trained.model_dir, "--checkpoint", garbage, input="seven\n",
                 ok=False)
    one_line_error(proc, str(garbage), "not a readable safetensors weights file")


def test_a_format_1_run_dir_is_refused_and_its_weights_still_translate(
        trained, xinda, one_line_error, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(trained.model_dir, model)
    newest = list_checkpoints(model)[-1]
    for weights in list_checkpoints(model):  # what xinda wrote before format 2
        state = load_state(weights)
        state_json(weights).unlink()
        state_tensors(weights).unlink()
        torch.save({**state, "format_version": 1}, weights.with_suffix(".state.pt"))
    proc = xinda("train", trained.prepared.config, "--resume", "--set",
                 f"train.out_dir={model}", ok=False)
    one_line_error(proc, f"{newest.with_suffix('.state.pt')}: checkpoint format 1",
                   "for safety", f"--checkpoint {newest}")
    assert sorted(p.name for p in (model / "checkpoints").glob("*.state.*")) == sorted(
        p.with_suffix(".state.pt").name for p in (model / "checkpoints").glob("step_*"
                                                                               ".safetensors"))
    proc = xinda("translate", model, "--checkpoint", newest, input="seven\n\n")
    assert len(proc.stdout.splitlines()) == 2


def epoch_updates(trainer: Trainer) -> int:
    return len(make_batches(trainer.train_src.lengths, trainer.train_tgt.lengths,
                            trainer.cfg.train.max_tokens, trainer.cfg.train.seed, 1))


def valid_rows(run_dir) -> list[tuple[str, str]]:
    with (run_dir / "log.csv").open(newline="") as f:
        return [(r["step"], r["valid_loss"]) for r in csv.DictReader(f) if r["valid_loss"]]


@pytest.mark.parametrize("where", ["epoch_end", "inside_an_epoch"])
def test_a_run_killed_while_validating_its_last_update_validates_it_on_resume(
        prepared, write_config, tmp_path, where):
    """Before: with the last update checkpointed (save_every) and the process killed during
    its final validation, --resume found max_steps reached and stopped: no validation row, no
    best weights, the epoch never closed (found by review)."""
    probe = trainer_for(prepared, write_config, tmp_path / "probe", max_steps=1)
    last = epoch_updates(probe) + (0 if where == "epoch_end" else 2)
    train = {"max_steps": last, "save_every": 1, "keep_last": 50}
    trainer_for(prepared, write_config, tmp_path / "A", **train).train()

    killed = trainer_for(prepared, write_config, tmp_path / "B", **train)
    validate = killed.validate

    def killed_at_the_last_update():
        if killed.progress.step == last:
            raise SystemExit("killed")  # stands in for SIGKILL: nothing after it runs
        return validate()

    killed.validate = killed_at_the_last_update
    with pytest.raises(SystemExit):
        killed.train()
    assert step_of(list_checkpoints(tmp_path / "B")[-1]) == last
    trainer_for(prepared, write_config, tmp_path / "B", **train).train(resume=True)

    assert_same_run(tmp_path / "A", tmp_path / "B", last)
    assert valid_rows(tmp_path / "B") == valid_rows(tmp_path / "A")
    assert valid_rows(tmp_path / "A")[-1][0] == str(last)
    best_a, best_b = (load_file(str(tmp_path / d / "best.safetensors")) for d in "AB")
    assert all(torch.equal(best_a[name], best_b[name]) for name in best_a)


def test_a_time_limit_spent_validating_at_an_epoch_end_stops_there(prepared, write_config,
                                                                   tmp_path):
    """Before: the limit was checked again only after the next epoch's first update, which
    then ran, validated and checkpointed beyond train.max_seconds (found by review)."""
    trainer = trainer_for(prepared, write_config, tmp_path / "A", max_seconds=10**6)
    validate = trainer.validate

    def validate_past_the_budget():
        trainer._wall_base += 10**6  # the validation used up the budget
        return validate()

    trainer.validate = validate_past_the_budget
    progress = trainer.train()
    assert (progress.step, progress.epoch, progress.batch) == (epoch_updates(trainer), 2, 0)
    assert [step for step, _ in valid_rows(tmp_path / "A")] == [str(progress.step)]
