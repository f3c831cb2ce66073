"""Data-parallel training under torchrun, with 2 gloo ranks on CPU: the weights of one process
accumulating the same batches, one writer, exact ``--resume``, and a rank killed with SIGKILL
(the job fails at once with one clear line per surviving rank, and ``--resume`` finishes it)."""

from __future__ import annotations

import csv
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from run_state import without_clocks
from safetensors.torch import load_file
from subprocesses import subprocess_env

from xinda.checkpoint import list_checkpoints, load_state, state_json, state_tensors
from xinda.config import load_config
from xinda.data.batching import make_batches
from xinda.data.manifest import load_split
from xinda.errors import XindaError
from xinda.train.trainer import Trainer

MAX_TOKENS = 500
NO_DROPOUT = {"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}
TRAIN = {"max_tokens": MAX_TOKENS, "threads": 1, "keep_last": 50, "log_every": 1,
         "valid_bleu": False, "dist_timeout": 30}

pytestmark = pytest.mark.skipif(not torch.distributed.is_available()
                                or not torch.distributed.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def torchrun(*args: str | Path, nproc: int = 2) -> list[str]:
    """``torchrun --standalone`` (its rendezvous on a free port) running ``xinda ARGS``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", "-m", "xinda.cli", *map(str, args)]


def run_torchrun(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(torchrun(*args), check=False, capture_output=True, text=True,
                          timeout=timeout, env=subprocess_env())
    assert proc.returncode == 0, f"torchrun {args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / f"step_{step:07d}.safetensors"))


def train_rows(run_dir: Path) -> list[dict]:
    with (run_dir / "log.csv").open(newline="") as f:
        return [row for row in csv.DictReader(f) if row["train_loss"]]


def rank_pids(launcher: int) -> dict[int, int]:
    """RANK -> pid of the children of the process ``launcher`` (read from /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0") if ppid == launcher else []
        except (OSError, IndexError, ValueError):
            continue
        for item in environ:
            if item.startswith(b"RANK="):
                found[int(item[5:])] = int(entry.name)
    return found


@pytest.fixture(scope="module")
def batches_per_epoch(prepared) -> int:
    src, tgt = load_split(prepared.data_dir, "train")
    return len(make_batches(src.lengths, tgt.lengths, MAX_TOKENS, 1, 1))


def test_two_ranks_equal_one_process_accumulating_two(prepared, write_config, tmp_path,
                                                      batches_per_epoch):
    """2 ranks x update_freq 1 == 1 process x update_freq 2, over an epoch boundary and an
    odd last group (rank 1 then trains on nothing, with a zero-weight batch)."""
    assert batches_per_epoch % 2 == 1, batches_per_epoch  # the short last group is exercised
    steps = batches_per_epoch // 2 + 3  # into epoch 2
    train = {**TRAIN, "max_steps": steps, "save_every": 0}
    config = write_config(tmp_path / "ddp.yaml", prepared.raw, prepared.data_dir,
                          tmp_path / "ddp", model=NO_DROPOUT, train=train)
    proc = run_torchrun("train", config)
    assert proc.stdout.count(f"trained {steps} updates") == 1  # rank 0 alone reports
    assert "data-parallel: 2 ranks" in proc.stderr

    cfg = load_config(config, [f"train.out_dir={tmp_path / 'one'}", "train.update_freq=2"])
    Trainer(cfg).train()

    one, two = weights(tmp_path / "one", steps), weights(tmp_path / "ddp", steps)
    assert one.keys() == two.keys()
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=1e-5, msg=name)
    progress = [load_state(list_checkpoints(tmp_path / run)[-1])["progress"]
                for run in ("one", "ddp")]
    assert without_clocks(progress[0]) == without_clocks(progress[1])
    assert progress[1]["epoch"] == 2 and progress[1]["batch"] == 4  # 2 updates x 2 batches
    rows = [train_rows(tmp_path / run) for run in ("one", "ddp")]
    assert [r["step"] for r in rows[1]] == [str(s) for s in range(1, steps + 1)]  # one writer
    for a, b in zip(*rows):
        assert float(a["train_loss"]) == pytest.approx(float(b["train_loss"]), rel=1e-5)


@pytest.fixture(scope="module")
def uninterrupted(prepared, write_config, tmp_path_factory):
    """2 ranks, dropout on (each rank its own random numbers), 3 epochs: the reference run."""
    root = tmp_path_factory.mktemp("ddp-resume")
    train = {**TRAIN, "max_steps": 18, "save_every": 2}

    def config(name: str) -> Path:
        return write_config(root / f"{name}.yaml", prepared.raw, prepared.data_dir, root / name,
                            train={**train, "out_dir": str(root / name)})

    run_torchrun("train", config("A"))
    return root, config


def test_a_killed_rank_fails_the_job_and_resume_is_exact(uninterrupted):
    root, config = uninterrupted
    b_dir, b_config = root / "B", config("B")
    log_path = root / "B.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(torchrun("train", b_config), stdout=log, stderr=subprocess.STDOUT,
                                env=subprocess_env())
        try:
            marker = b_dir / "checkpoints" / "step_0000004.state.json"
            deadline = time.monotonic() + 150
            while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            victim = rank_pids(proc.pid).get(1)
            assert victim, log_path.read_text()
            killed_at = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            proc.wait(timeout=120)
            seconds = time.monotonic() - killed_at
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    output = log_path.read_text()
    assert proc.returncode != 0, output
    assert seconds < 60, seconds
    assert "xinda: error: rank 0: lost contact with the other ranks" in output, output
    assert "continue it with --resume" in output
    assert "Traceback" not in output.split("xinda: error: rank 0")[0][-2000:]
    assert not (b_dir / "train_stats.json").exists()
    resumed_from = int(list_checkpoints(b_dir)[-1].name[5:12])
    assert 4 <= resumed_from < 18

    proc = run_torchrun("train", b_config, "--resume")
    assert f"resumed from step_{resumed_from:07d}" in proc.stderr
    assert proc.stdout.count("trained 18 updates") == 1
    a, b = weights(root / "A", 18), weights(b_dir, 18)
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after resume"
    states = [load_state(run / "checkpoints" / "step_0000018.safetensors") for run in
              (root / "A", b_dir)]
    assert states[0]["ranks"]["world_size"] == 2
    for rank in range(2):
        assert torch.equal(states[0]["ranks"]["rng"][rank]["cpu"],
                           states[1]["ranks"]["rng"][rank]["cpu"])
    assert not torch.equal(states[0]["ranks"]["rng"][0]["cpu"],
                           states[0]["ranks"]["rng"][1]["cpu"])


def test_ctrl_c_stops_all_ranks_with_a_checkpoint_and_resume_is_exact(uninterrupted):
    """Ctrl-C in a terminal signals torchrun and every rank, and torchrun passes it on again:
    all ranks stop after the same update, rank 0 saves it, and --resume ends as run A."""
    root, config = uninterrupted
    c_dir, c_config = root / "C", config("C")
    log_path = root / "C.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(torchrun("train", c_config), stdout=log, stderr=subprocess.STDOUT,
                                env=subprocess_env(), start_new_session=True)
        try:
            marker = c_dir / "checkpoints" / "step_0000004.state.json"
            deadline = time.monotonic() + 150
            while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    output = log_path.read_text()
    assert proc.returncode != 0, output
    assert "lost contact" not in output and "SIGINT again" not in output, output
    assert output.count("xinda: interrupted") == 2, output  # both ranks stopped cleanly
    stopped = int(output.split("stopped by SIGINT after update ")[1].split(":")[0])
    assert 4 <= stopped < 18 and int(list_checkpoints(c_dir)[-1].name[5:12]) == stopped

    proc = run_torchrun("train", c_config, "--resume")
    assert f"resumed from step_{stopped:07d}" in proc.stderr
    a, c = weights(root / "A", 18), weights(c_dir, 18)
    for name in a:
        assert torch.equal(a[name], c[name]), f"{name} differs after resume"


def test_one_process_resumes_a_two_rank_run(uninterrupted, tmp_path, caplog, batches_per_epoch):
    """Another number of ranks: same weights, optimizer and data position, with a warning."""
    root, config = uninterrupted
    run = tmp_path / "D"
    shutil.copytree(root / "A", run)
    for path in list_checkpoints(run)[-4:]:  # back to step 10
        for part in (state_json(path), state_tensors(path), path):
            part.unlink()
    cfg = load_config(config("A"), [f"train.out_dir={run}"])
    # before: accepted, with half the batches per update under the same schedule
    with pytest.raises(XindaError, match=r"took 2 batches per update, this job 1 \(1 x 1\): "
                                         r"train.update_freq=2 keeps it"):
        Trainer(cfg).train(resume=True)
    cfg = load_config(config("A"), [f"train.out_dir={run}", "train.update_freq=2"])
    with caplog.at_level(logging.INFO, logger="xinda"):
        progress = Trainer(cfg).train(resume=True)
    assert "resumed from step_0000010" in caplog.text
    assert "resuming with 1 rank(s) a run saved with 2" in caplog.text
    assert progress.step == 18
    saved = load_state(run / "checkpoints" / "step_0000010.safetensors")["progress"]
    per_epoch = (batches_per_epoch + 1) // 2  # updates of 2 ranks
    assert (saved["epoch"], saved["batch"]) == (10 // per_epoch + 1, 10 % per_epoch * 2)
    # one process finishes that epoch two batches per update
    left = batches_per_epoch - saved["batch"]
    assert f"valid after update {10 + (left + 1) // 2}:" in caplog.text
    assert "ranks" not in load_state(list_checkpoints(run)[-1])  # one process: as before


def test_a_refusal_by_rank_0_is_every_ranks_error(uninterrupted):
    """Before: rank 0 refused (here: checkpoints but no --resume) and the other ranks, left
    waiting for it, reported "lost contact ... continue it with --resume"."""
    root, config = uninterrupted
    proc = subprocess.run(torchrun("train", config("A")), check=False, capture_output=True,
                          text=True, timeout=300, env=subprocess_env())
    assert proc.returncode != 0
    refusal = f"xinda: error: {root / 'A'}: already holds checkpoints; use --resume"
    assert proc.stderr.count(refusal) == 2, proc.stderr
    assert "lost contact" not in proc.stderr


def test_an_output_folder_rank_0_cannot_make_is_every_ranks_error(uninterrupted, tmp_path):
    """Before: rank 0 failed ("Not a directory") and rank 1 reported "lost contact ... continue
    it with --resume", with nothing to resume (found by review)."""
    _, config = uninterrupted
    (tmp_path / "file").write_text("kept")
    out = tmp_path / "file" / "run"
    proc = subprocess.run(torchrun("train", config("A"), "--set", f"train.out_dir={out}"),
                          check=False, capture_output=True, text=True, timeout=300,
                          env=subprocess_env())
    assert proc.returncode != 0 and "lost contact" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("xinda: error: ")]
    assert len(errors) == 2 and all(str(out) in e for e in errors), proc.stderr
    assert f"xinda: error: {out}: Not a directory" in errors  # each rank's line whole


def test_a_rank_failing_after_the_last_update_leaves_one_line_per_rank(uninterrupted,
                                                                        tmp_path):
    """Found by review: the other ranks wait for rank 0 in the final barrier; when rank 0
    failed writing train_stats.json, they printed a 40-line gloo traceback."""
    _, config = uninterrupted
    out = tmp_path / "run"
    (out / "train_stats.json").mkdir(parents=True)
    proc = subprocess.run(torchrun("train", config("A"), "--set", f"train.out_dir={out}",
                                   "--set", "train.max_steps=2"),
                          check=False, capture_output=True, text=True, timeout=300,
                          env=subprocess_env())
    # (torchrun's own ChildFailedError traceback follows; none from a rank's barrier)
    assert proc.returncode != 0 and "distributed_c10d" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("xinda: error: ")]
    assert f"xinda: error: {out / 'train_stats.json'}: is a directory, not a file" in errors
    assert any(e.startswith("xinda: error: rank 1: lost contact") for e in errors), errors
