"""Checkpoint format 2: a real training state (Adam, GradScaler, RNG, progress) round-trips
exactly through safetensors + JSON, nothing on disk is a pickle, and a format-1 pickle is refused
without being unpickled."""

from __future__ import annotations

import hashlib
import json
import math
import pickle

import pytest
import torch
from safetensors.torch import load_file

from xinda.checkpoint import (
    FORMAT_VERSION,
    list_checkpoints,
    load_state,
    load_weights,
    save_checkpoint,
    state_json,
    state_tensors,
)
from xinda.errors import XindaError


def trained_state():
    """A small model after two Adam updates, and the state the trainer saves for it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.9, 0.98), foreach=True)
    for _ in range(2):
        model(torch.randn(5, 3)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)  # enabled: a non-empty state
    progress = {"step": 2, "epoch": 1, "batch": 2, "tgt_tokens": 17, "train_seconds": 0.1,
                "best": -math.inf, "bad_epochs": 0, "lr_resets": [1]}
    state = {"optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
             "rng": torch.get_rng_state(), "progress": progress}
    return model, optimizer, state


def test_a_training_state_round_trips_exactly(tmp_path):
    model, optimizer, state = trained_state()
    weights = save_checkpoint(tmp_path, 2, model, state, keep_last=1)
    loaded = load_state(weights)
    assert loaded["format_version"] == FORMAT_VERSION
    assert loaded["progress"] == state["progress"]  # -inf included
    assert loaded["scaler"] == state["scaler"]
    assert torch.equal(loaded["rng"], state["rng"]) and loaded["rng"].dtype == torch.uint8
    saved_opt, loaded_opt = state["optimizer"], loaded["optimizer"]
    assert loaded_opt["state"].keys() == saved_opt["state"].keys() == {0, 1, 2, 3}  # int keys
    for index, entry in saved_opt["state"].items():
        assert loaded_opt["state"][index].keys() == entry.keys()
        for key, tensor in entry.items():
            assert torch.equal(loaded_opt["state"][index][key], tensor), (index, key)
            assert loaded_opt["state"][index][key].dtype == tensor.dtype
    # a fresh optimizer takes the loaded state and then steps exactly like the original
    fresh_model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(),
                                      torch.nn.Linear(4, 2))
    load_weights(fresh_model, weights)
    fresh = torch.optim.Adam(fresh_model.parameters(), lr=1.0, foreach=True)
    fresh.load_state_dict(loaded_opt)
    assert fresh.param_groups[0]["lr"] == 1e-2
    assert list(fresh.param_groups[0]["betas"]) == [0.9, 0.98]
    batch = torch.randn(5, 3)
    for m, opt in ((model, optimizer), (fresh_model, fresh)):
        m(batch).square().sum().backward()
        opt.step()
    for a, b in zip(model.parameters(), fresh_model.parameters()):
        assert torch.equal(a, b)


def test_the_files_on_disk_hold_no_pickle(tmp_path):
    model, _, state = trained_state()
    weights = save_checkpoint(tmp_path, 2, model, state, keep_last=1)
    assert sorted(p.name for p in weights.parent.iterdir()) == [
        "step_0000002.safetensors", "step_0000002.state.json", "step_0000002.state.safetensors"]
    document = json.loads(state_json(weights).read_text(encoding="utf-8"))
    assert document["format_version"] == FORMAT_VERSION and document["step"] == 2
    for path in (weights, state_tensors(weights)):
        record = document["files"][path.name]
        assert record == {"bytes": path.stat().st_size,
                          "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    tensors = load_file(str(state_tensors(weights)))
    assert set(tensors) == {"rng", *(f"optimizer.state.{i}.{key}" for i in range(4)
                                     for key in ("step", "exp_avg", "exp_avg_sq"))}
    assert document["state"]["rng"] == {"__tensor__": "rng"}
    assert document["state"]["optimizer"]["state"]["3"]["exp_avg"] == {
        "__tensor__": "optimizer.state.3.exp_avg"}
    assert document["state"]["optimizer"]["param_groups"][0]["params"] == [0, 1, 2, 3]
    assert document["state"]["scaler"]["scale"] == 1024.0
    assert document["state"]["progress"]["best"] == -math.inf


def test_a_state_that_is_not_tensors_and_plain_values_is_refused(tmp_path):
    with pytest.raises(TypeError, match="progress.when is a object"):
        save_checkpoint(tmp_path, 1, torch.nn.Linear(2, 2), {"progress": {"when": object()}}, 1)
    assert list_checkpoints(tmp_path) == []


class _Exploit:
    """What a malicious format-1 state could hold: unpickling it writes a file."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return (open, (self.target, "w"))


def format_1_run(tmp_path):
    """A model directory of format 1: weights + a pickled ``step_N.state.pt`` that, if it were
    unpickled, would create ``pwned``."""
    weights = save_checkpoint(tmp_path, 5, torch.nn.Linear(2, 2), {}, keep_last=1)
    state_json(weights).unlink()
    state_tensors(weights).unlink()
    pickled = weights.with_suffix(".state.pt")
    pickled.write_bytes(pickle.dumps({"format_version": 1, "exploit": _Exploit(
        tmp_path / "pwned")}))
    return weights, pickled


def test_format_1_is_refused_without_unpickling_it(tmp_path):
    weights, pickled = format_1_run(tmp_path)
    for call in (lambda: load_state(weights), lambda: list_checkpoints(tmp_path)):
        with pytest.raises(XindaError) as err:
            call()
        message = str(err.value)
        assert message.startswith(f"{pickled}: checkpoint format 1")
        assert "no longer loaded, for safety" in message and "\n" not in message
        assert f"--checkpoint {weights}" in message
    assert not (tmp_path / "pwned").exists()
    model = torch.nn.Linear(2, 2)
    load_weights(model, weights)  # the weights are safetensors: they still load


@pytest.mark.parametrize(("damage", "message"), [
    (lambda doc: doc.pop("state"), 'its "state" is not an object'),
    (lambda doc: doc.update(state="x"), 'its "state" is not an object'),
    (lambda doc: doc["state"]["optimizer"]["state"].update(x=1), "key that is not a parameter"),
])
def test_a_damaged_state_document_is_one_line(tmp_path, damage, message):
    """Before: KeyError, TypeError or ValueError tracebacks from --resume and xinda grow
    (found by review)."""
    model, _, state = trained_state()
    weights = save_checkpoint(tmp_path, 2, model, state, keep_last=1)
    document = json.loads(state_json(weights).read_text(encoding="utf-8"))
    damage(document)
    state_json(weights).write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(XindaError, match=message) as info:
        load_state(weights)
    assert "\n" not in str(info.value) and str(state_json(weights).name) in str(info.value)
