"""SIGKILL during training, then ``--resume``: the result is bitwise the uninterrupted run's,
also when the kill tore the checkpoint being written (it is skipped, never loaded)."""

from __future__ import annotations

import csv
import json
import time

import pytest
import torch
from run_state import without_clocks
from safetensors.torch import load_file

from xinda.checkpoint import list_checkpoints, load_state, state_json, state_tensors
from xinda.data.batching import make_batches
from xinda.data.manifest import load_split

STEPS, SAVE_EVERY, KILL_AT = 24, 4, 8
MAX_TOKENS = 500


def step_of(path) -> int:
    return int(path.name.split("_")[1].split(".")[0])


@pytest.fixture(scope="module")
def resume_config(prepared, write_config, tmp_path_factory):
    """Run A (uninterrupted) and run B (killed, resumed) differ only in train.out_dir."""
    root = tmp_path_factory.mktemp("resume")
    train = {"max_steps": STEPS, "save_every": SAVE_EVERY, "keep_last": 20, "log_every": 1,
             "max_tokens": MAX_TOKENS, "threads": 1, "valid_bleu": True}
    configs = {}
    for run in ("A", "B"):
        configs[run] = write_config(root / f"{run}.yaml", prepared.raw, prepared.data_dir,
                                    root / run, train={**train, "out_dir": str(root / run)})
    return root, configs


def test_premise_several_epochs_and_dropout(prepared, resume_config):
    """The comparison is only meaningful when epoch boundaries fall inside the 24 updates
    (new batch order per epoch) and dropout draws random numbers."""
    src, tgt = load_split(prepared.data_dir, "train")
    per_epoch = len(make_batches(src.lengths, tgt.lengths, MAX_TOKENS, 1, 1))
    assert 2 * per_epoch < STEPS, per_epoch
    import yaml

    cfg = yaml.safe_load(resume_config[1]["A"].read_text(encoding="utf-8"))
    assert cfg["model"]["dropout"] > 0


def test_kill_and_resume_equals_uninterrupted(resume_config, xinda, xinda_popen,
                                              one_line_error):
    root, configs = resume_config
    a_dir, b_dir = root / "A", root / "B"

    xinda("train", configs["A"])

    # run B: SIGKILL as soon as the step-8 checkpoint is complete (its JSON document is renamed
    # into place last)
    marker = b_dir / "checkpoints" / f"step_{KILL_AT:07d}.state.json"
    with (root / "B.first.log").open("w") as log:
        proc = xinda_popen("train", configs["B"], stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 150
            while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.001)
            proc.kill()
        finally:
            proc.wait(timeout=60)
    assert marker.exists() or proc.returncode == 0, (root / "B.first.log").read_text()
    newest = step_of(list_checkpoints(b_dir)[-1])
    if newest >= STEPS:
        # The run finished before the kill landed (a fast machine): cut it back to the step-8
        # checkpoint so that the resume below still has 16 updates and 2+ epochs to replay.
        for path in list_checkpoints(b_dir):
            if step_of(path) > KILL_AT:
                for part in (state_json(path), state_tensors(path), path):
                    part.unlink()
        (b_dir / "train_stats.json").unlink(missing_ok=True)
    assert not (b_dir / "train_stats.json").exists()  # B really was interrupted
    newest = list_checkpoints(b_dir)[-1]
    resumed_from = step_of(newest)
    assert KILL_AT <= resumed_from < STEPS

    # a kill inside the next save leaves a torn checkpoint: weights and state tensors renamed
    # into place, no JSON document yet; here the weights are even truncated
    torn = newest.with_name(f"step_{resumed_from + SAVE_EVERY:07d}.safetensors")
    torn.write_bytes(newest.read_bytes()[:-100])
    state_tensors(torn).write_bytes(state_tensors(newest).read_bytes())
    assert list_checkpoints(b_dir)[-1] == newest

    proc = xinda("train", configs["B"], "--resume")
    assert f"skipping incomplete checkpoint {torn}" in proc.stderr
    assert f"resumed from step_{resumed_from:07d}" in proc.stderr
    assert f"trained {STEPS} updates" in proc.stdout

    final = f"step_{STEPS:07d}.safetensors"
    weights_a = load_file(str(a_dir / "checkpoints" / final))
    weights_b = load_file(str(b_dir / "checkpoints" / final))
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        assert torch.equal(weights_a[name], weights_b[name]), f"{name} differs after resume"

    state_a = load_state(a_dir / "checkpoints" / final)
    state_b = load_state(b_dir / "checkpoints" / final)
    progress_a, progress_b = state_a["progress"], state_b["progress"]
    assert without_clocks(progress_a) == without_clocks(progress_b)
    assert torch.equal(state_a["rng"], state_b["rng"])
    for sa, sb in zip(state_a["optimizer"]["state"].values(),
                      state_b["optimizer"]["state"].values()):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"])
        assert torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])

    stats_a = json.loads((a_dir / "train_stats.json").read_text(encoding="utf-8"))
    stats_b = json.loads((b_dir / "train_stats.json").read_text(encoding="utf-8"))
    for key in ("steps", "epochs_done", "tgt_tokens", "parameters"):
        assert stats_a[key] == stats_b[key], key
    assert stats_a["steps"] == STEPS

    # the log of the resumed run has each update once, like the uninterrupted one
    def logged_steps(run_dir):
        with (run_dir / "log.csv").open(newline="") as f:
            return [int(r["step"]) for r in csv.DictReader(f) if r["train_loss"]]

    assert logged_steps(b_dir) == logged_steps(a_dir) == list(range(1, STEPS + 1))

    # training again into a directory with checkpoints, without --resume, is refused
    before = sorted(p.name for p in (a_dir / "checkpoints").iterdir())
    proc = xinda("train", configs["A"], ok=False)
    one_line_error(proc, str(a_dir), "--resume")
    assert sorted(p.name for p in (a_dir / "checkpoints").iterdir()) == before


def test_resuming_a_finished_run_trains_no_further(resume_config, xinda):
    """A run that already reached max_steps, resumed, stops at once: no update beyond it."""
    root, configs = resume_config
    a_dir = root / "A"
    if not (a_dir / "train_stats.json").exists():
        xinda("train", configs["A"])
    proc = xinda("train", configs["A"], "--resume")
    assert f"trained {STEPS} updates" in proc.stdout
    assert step_of(list_checkpoints(a_dir)[-1]) == STEPS
