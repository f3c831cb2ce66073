"""Checkpoint files: weights + state written together, and the state's format version checked
before anything is loaded from it. (Layout and format 1: test_checkpoint_format.py; torn
checkpoints: test_checkpoint_torn.py; write and load failures: test_checkpoint_errors.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from xinda.checkpoint import (
    FORMAT_VERSION,
    check_format,
    list_checkpoints,
    load_state,
    load_weights,
    save_checkpoint,
)
from xinda.errors import XindaError


def test_state_round_trips_with_its_format_version(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    weights = save_checkpoint(tmp_path, 7, model, {"progress": {"step": 7}}, keep_last=2)
    assert list_checkpoints(tmp_path) == [weights]
    state = load_state(weights)
    assert state == {"format_version": FORMAT_VERSION, "progress": {"step": 7}}
    other = torch.nn.Linear(3, 2)
    load_weights(other, weights)
    assert torch.equal(other.weight, model.weight) and torch.equal(other.bias, model.bias)


def test_keep_last_deletes_older_checkpoints_with_their_states(tmp_path):
    model = torch.nn.Linear(2, 2)
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, model, {}, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000003.safetensors",
                                                            "step_0000004.safetensors"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step_0000003.safetensors", "step_0000003.state.json", "step_0000003.state.safetensors",
        "step_0000004.safetensors", "step_0000004.state.json", "step_0000004.state.safetensors"]


def test_a_corrupt_newer_checkpoint_does_not_take_a_kept_place(tmp_path):
    """Resuming passes over a corrupt newest checkpoint (checksums) and goes on from an older
    step. Before: pruning (sizes only) counted the corrupt one as the newest, and with
    keep_last 1 deleted every checkpoint the resumed run wrote (found by review)."""
    model = torch.nn.Linear(2, 2)
    for step in (5, 10):
        save_checkpoint(tmp_path, step, model, {}, keep_last=2)
    newest = tmp_path / "checkpoints" / "step_0000010.safetensors"
    data = bytearray(newest.read_bytes())
    data[-1] ^= 1  # same size, another checksum
    newest.write_bytes(bytes(data))
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000005.safetensors"]
    for step in (6, 7):  # the resumed run
        save_checkpoint(tmp_path, step, model, {}, keep_last=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000007.safetensors"]
    save_checkpoint(tmp_path, 11, model, {}, keep_last=1)  # passed: the corrupt one goes
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step_0000011.safetensors", "step_0000011.state.json", "step_0000011.state.safetensors"]


def test_format_2_is_still_read_and_its_progress_counts_its_last_validation(tmp_path):
    """Format 3 added Progress.counted_step and validated_score: a format-2 state has neither
    and loads, counting its epoch ends as before (up to validated_step)."""
    from xinda.train.progress import Progress

    weights = save_checkpoint(tmp_path, 4, torch.nn.Linear(2, 2),
                              {"progress": {"step": 4, "validated_step": 3}}, keep_last=1)
    meta = weights.with_suffix(".state.json")
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "format_version": 2}))
    state = load_state(weights)
    assert state["format_version"] == 2
    progress = Progress(**state["progress"])
    assert (progress.counted_step, progress.validated_score) == (3, None)


def test_a_newer_format_asks_for_a_newer_xinda():
    with pytest.raises(XindaError, match=rf"format {FORMAT_VERSION + 1} is newer .* upgrade xinda"):
        check_format({"format_version": FORMAT_VERSION + 1}, Path("x.state.json"))


@pytest.mark.parametrize("state", [{}, {"format_version": 0}, {"format_version": "2"}, [1, 2],
                                   {"format_version": True}],
                         ids=["missing", "zero", "string", "not-a-dict", "bool"])
def test_anything_else_is_not_a_training_state(state):
    with pytest.raises(XindaError, match=r"x\.state\.json: not a xinda training state"):
        check_format(state, Path("x.state.json"))


def test_load_state_refuses_a_state_of_another_format(tmp_path):
    weights = save_checkpoint(tmp_path, 1, torch.nn.Linear(2, 2), {}, keep_last=1)
    meta = weights.with_suffix(".state.json")
    document = json.loads(meta.read_text(encoding="utf-8"))
    meta.write_text(json.dumps({**document, "format_version": FORMAT_VERSION + 1}))
    with pytest.raises(XindaError, match=f"step_0000001.state.json: checkpoint format "
                                         f"{FORMAT_VERSION + 1} is newer"):
        load_state(weights)
    with pytest.raises(XindaError, match="upgrade xinda"):  # not silently skipped as torn
        list_checkpoints(tmp_path)


@pytest.mark.parametrize("damaged", ["{}", "[]", "null", '{"format_version": 0}'])
def test_a_damaged_state_is_skipped_like_a_torn_one(tmp_path, damaged, caplog):
    """Valid JSON but no training state: skipped with a warning, as an unparsable one is, so
    the intact checkpoints stay usable (before: every command that listed the folder failed,
    average, --resume and translate among them; found by review)."""
    model = torch.nn.Linear(2, 2)
    older, newest = (save_checkpoint(tmp_path, s, model, {}, keep_last=2) for s in (1, 2))
    older.with_suffix(".state.json").write_text(damaged)
    assert list_checkpoints(tmp_path) == [newest]
    assert "is not a xinda training state" in caplog.text
    with pytest.raises(XindaError, match="not a xinda training state"):
        load_state(older)


def test_averaging_checks_names_and_shapes_and_keeps_dtypes(tmp_path):
    """Before: a name missing from one file was divided by N anyway, (3, 2) and (2,) were
    broadcast together, and bf16 weights came back float32."""
    from safetensors.torch import load_file, save_file

    from xinda.averaging import average_checkpoints
    from xinda.errors import XindaError

    def write(name, **tensors):
        save_file(tensors, str(tmp_path / name))
        return tmp_path / name

    a = write("a", w=torch.ones(3, 2, dtype=torch.bfloat16), b=torch.zeros(2))
    b = write("b", w=torch.full((3, 2), 3.0, dtype=torch.bfloat16), b=torch.ones(2))
    average_checkpoints([a, b], tmp_path / "avg")
    avg = load_file(str(tmp_path / "avg"))
    assert avg["w"].dtype == torch.bfloat16 and avg["w"].eq(2).all() and avg["b"].eq(0.5).all()
    # bf16 and fp32 of one model: the mean in fp32, whichever comes first (before: the first's)
    fine = write("fine", w=torch.full((3, 2), 1 + 2**-10), b=torch.ones(2))
    for order in ([a, fine], [fine, a]):
        average_checkpoints(order, tmp_path / "mixed")
        w = load_file(str(tmp_path / "mixed"))["w"]
        assert w.dtype == torch.float32 and w.eq(1 + 2**-11).all()
    with pytest.raises(XindaError, match=r"extra is in only one of it and"):
        average_checkpoints([a, write("c", w=avg["w"], b=avg["b"], extra=torch.ones(1))],
                            tmp_path / "x")
    with pytest.raises(XindaError, match=r"w has shape \(2,\), \(3, 2\) in"):
        average_checkpoints([a, write("d", w=torch.ones(2, dtype=torch.bfloat16), b=avg["b"])],
                            tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_averaging_keeps_integer_tensors_and_refuses_differing_ones(tmp_path):
    """Before: integers went through a double-precision mean (2**53 + 1 came back 2**53) and
    differing ones were averaged and truncated."""
    from safetensors.torch import load_file, save_file

    from xinda.averaging import average_checkpoints
    from xinda.errors import XindaError

    big = torch.tensor([2**53 + 1], dtype=torch.int64)
    for name, count in (("a", big), ("b", big), ("c", big + 1)):
        save_file({"w": torch.ones(2), "count": count}, str(tmp_path / name))
    average_checkpoints([tmp_path / "a", tmp_path / "b"], tmp_path / "avg")
    assert load_file(str(tmp_path / "avg"))["count"].tolist() == [2**53 + 1]
    with pytest.raises(XindaError, match=r"count holds integers that differ from those in"):
        average_checkpoints([tmp_path / "a", tmp_path / "c"], tmp_path / "x")
