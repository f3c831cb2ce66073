"""A checkpoint torn by a crash (kill -9 while saving, a truncated copy, a flipped bit) is
skipped by ``list_checkpoints`` with a warning and refused by ``load_state``; the previous
complete checkpoint is what resuming gets."""

from __future__ import annotations

import logging

import pytest
import torch

from xinda.checkpoint import (
    list_checkpoints,
    load_state,
    save_checkpoint,
    state_json,
    state_tensors,
)
from xinda.errors import XindaError


def truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


def flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


TEARS = {  # name -> (damage to step 2's files, fragment of the logged reason)
    "weights-truncated": (lambda w: truncate(w), "step_0000002.safetensors has"),
    "state-tensors-truncated": (lambda w: truncate(state_tensors(w), 0.9),
                                "step_0000002.state.safetensors has"),
    "state-tensors-missing": (lambda w: state_tensors(w).unlink(),
                              "step_0000002.state.safetensors is missing"),
    "json-missing": (lambda w: state_json(w).unlink(),
                     "step_0000002.state.json is missing (interrupted while saving?)"),
    "json-truncated": (lambda w: truncate(state_json(w)), "step_0000002.state.json is not valid"),
    "json-garbled": (lambda w: state_json(w).write_bytes(b"\x93\xff{garbage"),
                     "step_0000002.state.json is not valid"),
    "weights-checksum": (lambda w: flip_a_byte(w),
                         "step_0000002.safetensors does not match its SHA-256 checksum"),
    "state-tensors-checksum": (lambda w: flip_a_byte(state_tensors(w)),
                               "step_0000002.state.safetensors does not match its SHA-256"),
}


@pytest.mark.parametrize("tear", list(TEARS), ids=list(TEARS))
def test_a_torn_checkpoint_is_skipped_and_never_loaded(tmp_path, caplog, tear):
    damage, reason = TEARS[tear]
    model = torch.nn.Linear(4, 3)
    first = save_checkpoint(tmp_path, 1, model, {"rng": torch.get_rng_state(),
                                                 "progress": {"step": 1}}, keep_last=5)
    with torch.no_grad():
        model.weight.add_(1.0)
    second = save_checkpoint(tmp_path, 2, model, {"rng": torch.get_rng_state(),
                                                  "progress": {"step": 2}}, keep_last=5)
    assert list_checkpoints(tmp_path) == [first, second]

    damage(second)
    with caplog.at_level(logging.WARNING, logger="xinda"):
        assert list_checkpoints(tmp_path) == [first]
    assert f"skipping incomplete checkpoint {second}: {reason}" in caplog.text
    assert load_state(first)["progress"] == {"step": 1}
    if second.exists():
        with pytest.raises(XindaError, match=f"{second}: incomplete checkpoint: "):
            load_state(second)


def test_the_warning_is_logged_once_per_process(tmp_path, caplog):
    save_checkpoint(tmp_path, 1, torch.nn.Linear(2, 2), {}, keep_last=5)
    torn = save_checkpoint(tmp_path, 2, torch.nn.Linear(2, 2), {}, keep_last=5)
    state_json(torn).unlink()
    with caplog.at_level(logging.WARNING, logger="xinda"):
        for _ in range(3):
            list_checkpoints(tmp_path)
    assert caplog.text.count("skipping incomplete checkpoint") == 1


def test_saving_the_same_step_again_replaces_a_torn_one(tmp_path):
    model = torch.nn.Linear(2, 2)
    weights = save_checkpoint(tmp_path, 3, model, {"progress": {"step": 3}}, keep_last=5)
    truncate(weights)
    assert list_checkpoints(tmp_path) == []
    save_checkpoint(tmp_path, 3, model, {"progress": {"step": 3}}, keep_last=5)
    assert list_checkpoints(tmp_path) == [weights]
    assert load_state(weights)["progress"] == {"step": 3}


def test_keep_last_counts_complete_checkpoints_only(tmp_path):
    model = torch.nn.Linear(2, 2)
    for step in (1, 2):
        save_checkpoint(tmp_path, step, model, {}, keep_last=2)
    torn = save_checkpoint(tmp_path, 3, model, {}, keep_last=2)  # deletes step 1
    state_json(torn).unlink()
    save_checkpoint(tmp_path, 4, model, {}, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000002.safetensors",
                                                            "step_0000004.safetensors"]
