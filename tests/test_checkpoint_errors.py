"""Failures around checkpoint files are one-line XindaErrors that name the file: a full disk or a
directory that cannot be written while saving (earlier checkpoints stay complete, no temporary
file stays behind), and weights that are not safetensors or do not fit the model."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

from xinda import checkpoint
from xinda.checkpoint import list_checkpoints, load_state, load_weights, save_checkpoint
from xinda.errors import XindaError
from xinda.models.registry import build_model

TINY = {"arch": "transformer", "d_model": 32, "heads": 2, "ffn_dim": 64, "encoder_layers": 1,
        "decoder_layers": 1}


def saved_twice(tmp_path):
    model = torch.nn.Linear(3, 2)
    for step in (1, 2):
        save_checkpoint(tmp_path, step, model, {"rng": torch.get_rng_state(),
                                                "progress": {"step": step}}, keep_last=5)
    return model


def assert_intact(tmp_path):
    """Steps 1 and 2 are complete and load; nothing else (no temporary file) is there."""
    folder = tmp_path / "checkpoints"
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000001.safetensors",
                                                            "step_0000002.safetensors"]
    assert load_state(folder / "step_0000002.safetensors")["progress"] == {"step": 2}
    load_weights(torch.nn.Linear(3, 2), folder / "step_0000002.safetensors")
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        f"step_000000{s}.{ext}" for s in (1, 2)
        for ext in ("safetensors", "state.json", "state.safetensors"))


@pytest.mark.parametrize("failing", [1, 2, 3], ids=["weights", "state-tensors", "state-json"])
@pytest.mark.parametrize("step", [3, 2], ids=["new-step", "step-again"])
def test_a_full_disk_while_saving_is_one_line_and_loses_nothing(tmp_path, monkeypatch, step,
                                                                failing):
    """The disk fills up while the ``failing``-th file of a step is written (simulated: its
    flush to disk raises ENOSPC after the data went to the temporary file): step 3, new, or
    step 2 saved a second time (an epoch that ends on a ``save_every`` step), whose first save
    stays complete."""
    model = saved_twice(tmp_path)
    real_fsync, calls = os.fsync, []

    def fsync(fd):
        calls.append(fd)
        if len(calls) == failing:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    names = [f"step_000000{step}.safetensors", f"step_000000{step}.state.safetensors",
             f"step_000000{step}.state.json"]
    with pytest.raises(XindaError) as err:
        save_checkpoint(tmp_path, step, model, {"progress": {"step": step, "epoch": 1}},
                        keep_last=5)  # (no rng: step 2's state file changes size)
    message = str(err.value)
    assert message == (f"{tmp_path / 'checkpoints' / names[failing - 1]}: cannot write: "
                       "No space left on device")
    monkeypatch.undo()
    assert_intact(tmp_path)


def test_a_failing_safetensors_write_is_one_line(tmp_path, monkeypatch):
    """safetensors reports I/O errors as its own SafetensorError; it is named the same way."""
    from safetensors import SafetensorError

    model = saved_twice(tmp_path)

    def save_model(model, filename):
        raise SafetensorError("Error while serializing: I/O error: No space left on device "
                              "(os error 28)")

    monkeypatch.setattr(checkpoint, "save_model", save_model)
    with pytest.raises(XindaError, match=r"step_0000003\.safetensors: cannot write: .*"
                                         r"No space left on device \(os error 28\)$"):
        save_checkpoint(tmp_path, 3, model, {}, keep_last=5)
    monkeypatch.undo()
    assert_intact(tmp_path)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root writes into read-only directories: chmod cannot make one")
def test_a_read_only_directory_is_one_line(tmp_path):
    model = saved_twice(tmp_path)
    folder = tmp_path / "checkpoints"
    folder.chmod(0o555)
    try:
        with pytest.raises(XindaError, match=r"step_0000003\.safetensors: cannot write: "
                                             "Permission denied"):
            save_checkpoint(tmp_path, 3, model, {}, keep_last=5)
    finally:
        folder.chmod(0o755)
    assert_intact(tmp_path)


def test_a_model_dir_that_cannot_be_a_directory_is_one_line(tmp_path):
    """Even as root: the model directory's path is a regular file."""
    blocker = tmp_path / "model"
    blocker.write_text("not a directory")
    with pytest.raises(XindaError, match=rf"^{blocker}/checkpoints/step_0000001\.safetensors: "
                                         "cannot write: (Not a directory|File exists)$"):
        save_checkpoint(blocker, 1, torch.nn.Linear(2, 2), {}, keep_last=5)
    assert blocker.read_text() == "not a directory"


# ------------------------------------------------------------------ weights that do not fit
def tiny(vocab_size: int, **changes):
    from xinda.data.vocab import VocabInfo

    torch.manual_seed(0)
    return build_model({**TINY, **changes}, VocabInfo(vocab_size, vocab_size, 0, 2, 3, True))


@pytest.mark.parametrize("content", [b"", b"\x00" * 7, os.urandom(4096), b"{\"not\": 1}"],
                         ids=["empty", "short", "random", "json"])
def test_a_file_that_is_not_safetensors(tmp_path, content):
    path = tmp_path / "weights.safetensors"
    path.write_bytes(content)
    with pytest.raises(XindaError, match=rf"^{path}: not a readable safetensors weights file "
                                         r"\(.+\)$"):
        load_weights(tiny(30), path)


def test_a_truncated_weights_file(tmp_path):
    path = tmp_path / "weights.safetensors"
    checkpoint.save_weights(tiny(30), path)
    path.write_bytes(path.read_bytes()[:-64])
    with pytest.raises(XindaError, match=rf"^{path}: not a readable safetensors weights file"):
        load_weights(tiny(30), path)


def test_another_vocabulary_size_names_the_tensor_and_both_shapes(tmp_path):
    path = tmp_path / "weights.safetensors"
    checkpoint.save_weights(tiny(30), path)
    with pytest.raises(XindaError) as err:
        load_weights(tiny(40), path)
    message = str(err.value)
    assert message.startswith(f"{path}: weights do not fit the model: ")
    # joint vocabulary: the embeddings and the output layer share one tensor, stored once
    assert "output.weight has shape (30, 32) in the file but the model expects (40, 32)" in message
    assert "a different vocabulary or model size?" in message and "\n" not in message


def test_another_architecture_names_missing_and_unexpected_tensors(tmp_path):
    path = tmp_path / "weights.safetensors"
    checkpoint.save_weights(tiny(30), path)
    with pytest.raises(XindaError, match=rf"^{path}: weights do not fit the model \(a different "
                                         r"architecture\?\): missing \['encoder_layers\.1\."):
        load_weights(tiny(30, encoder_layers=2), path)


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_weights_that_are_not_finite_are_refused(tmp_path, value):
    """A damaged best.safetensors (a valid header, NaN in output.weight) loaded: every
    translation came out empty, with a warning about constraints that nobody gave."""
    model, path = tiny(30), tmp_path / "best.safetensors"
    with torch.no_grad():
        model.output.weight[3, 5] = value
    checkpoint.save_weights(model, path)
    with pytest.raises(XindaError) as err:
        load_weights(tiny(30), path)
    assert str(err.value) == (f"{path}: holds NaN or infinite values in output.weight: "
                              "damaged file?")


def test_the_reviewers_damage_is_refused(tmp_path):
    """The last 4000 bytes overwritten with 0xFF (NaN in float32)."""
    path = tmp_path / "best.safetensors"
    checkpoint.save_weights(tiny(30), path)
    data = path.read_bytes()
    path.write_bytes(data[:-4000] + b"\xff" * 4000)
    with pytest.raises(XindaError, match=rf"^{path}: holds NaN or infinite values in \S+"
                                         r"( \(and \d+ more\))?: damaged file\?$"):
        load_weights(tiny(30), path)


def test_saving_a_step_again_replaces_it(tmp_path):
    model = saved_twice(tmp_path)
    save_checkpoint(tmp_path, 2, model, {"progress": {"step": 2, "epoch": 1}}, keep_last=5)
    folder = tmp_path / "checkpoints"
    assert load_state(folder / "step_0000002.safetensors")["progress"] == {"step": 2, "epoch": 1}
    assert len(list_checkpoints(tmp_path)) == 2 and len(list(folder.iterdir())) == 6


def test_ctrl_c_during_a_resave_swap_waits_for_it(tmp_path, monkeypatch):
    """A step saved a second time is moved in by three renames after the old commit mark goes.
    Before: a Ctrl-C between them left neither save, and removed the staged one too (found by
    review). Now the interrupt takes effect once the new save is whole."""
    import signal

    model = saved_twice(tmp_path)
    real_replace, calls = os.replace, []

    def replace(src, dst):
        if Path(dst).parent == tmp_path / "checkpoints":  # a rename of the swap
            calls.append(dst)
            if len(calls) == 1:
                os.kill(os.getpid(), signal.SIGINT)  # as a second Ctrl-C would, mid-swap
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    # Python's Ctrl-C handler (a background job starts with SIGINT ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            save_checkpoint(tmp_path, 2, model, {"progress": {"step": 2, "epoch": 1}},
                            keep_last=5)
    finally:
        signal.signal(signal.SIGINT, previous)
    monkeypatch.undo()
    assert len(calls) == 3
    assert load_state(tmp_path / "checkpoints" / "step_0000002.safetensors")["progress"] == {
        "step": 2, "epoch": 1}


def crashed_mid_resave(tmp_path, renamed: int) -> torch.nn.Module:
    """Steps 1 and 2 saved; step 2 saved again by a process killed (no `finally`) after
    ``renamed`` of the swap's three renames (-1: while writing the staged files)."""
    saved_twice(tmp_path)
    model = torch.nn.Linear(3, 2)  # other weights
    weights = tmp_path / "checkpoints" / "step_0000002.safetensors"
    staging = weights.parent / ".step_0000002.resave"
    checkpoint._write_checkpoint(staging / weights.name, 2, model,
                                 {"progress": {"step": 2, "epoch": 1}})
    if renamed < 0:
        checkpoint.state_json(staging / weights.name).unlink()  # its commit mark not written
        return model
    checkpoint.state_json(weights).unlink()
    names = (weights, checkpoint.state_tensors(weights), checkpoint.state_json(weights))
    for name in names[:renamed]:
        os.replace(staging / name.name, name)
    return model


@pytest.mark.parametrize("renamed", [0, 1, 2])
def test_a_swap_cut_by_a_kill_is_finished_before_training_resumes(tmp_path, renamed):
    """Found by review: killed after the first rename, the only checkpoint (keep_last 1) was
    torn, and `--resume` started over, rewriting log.csv; the staged save was whole."""
    model = crashed_mid_resave(tmp_path, renamed)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000001.safetensors"]
    checkpoint.finish_resaves(tmp_path)
    newest = list_checkpoints(tmp_path)[-1]
    assert newest.name == "step_0000002.safetensors"
    assert load_state(newest)["progress"] == {"step": 2, "epoch": 1}
    loaded = torch.nn.Linear(3, 2)
    load_weights(loaded, newest)
    assert torch.equal(loaded.weight, model.weight)
    assert not list((tmp_path / "checkpoints").glob(".*"))


def test_a_staged_save_without_its_commit_mark_is_dropped(tmp_path):
    crashed_mid_resave(tmp_path, -1)
    checkpoint.finish_resaves(tmp_path)
    assert_intact(tmp_path)


def test_only_torn_checkpoints_are_refused_not_trained_over(tmp_path):
    from xinda.train.run_dir import check_output_dir

    model = torch.nn.Linear(3, 2)
    save_checkpoint(tmp_path, 7, model, {"progress": {"step": 7}}, keep_last=1)
    checkpoint.state_json(tmp_path / "checkpoints" / "step_0000007.safetensors").unlink()
    for resume in (True, False):
        with pytest.raises(XindaError, match=r"holds only incomplete checkpoints "
                                             r"\(step_0000007.safetensors, step_0000007.state"
                                             r".safetensors\), none to continue from"):
            check_output_dir(tmp_path, resume, None, tmp_path, {})


def test_checkpoints_saved_at_a_stop_go_first_once_a_later_one_is_saved(tmp_path):
    """Found by review: a signal's checkpoint took one of keep_last's places, so `xinda
    average --last N` of a resumed run averaged other steps than the uninterrupted run."""
    model = torch.nn.Linear(3, 2)
    for step, stop in ((5, False), (7, True), (10, False), (15, False)):
        save_checkpoint(tmp_path, step, model, {"progress": {"step": step}}, keep_last=3,
                        off_grid=stop)
        if step == 7:  # the newest is kept, stopped or not: training resumes from it
            assert [p.name[5:12] for p in list_checkpoints(tmp_path)] == ["0000005", "0000007"]
    assert [p.name[5:12] for p in list_checkpoints(tmp_path)] == ["0000005", "0000010",
                                                                  "0000015"]
