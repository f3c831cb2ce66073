"""``xinda grow``: train a 1-layer encoder, grow it to 2 layers, resume training from there."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
import yaml

from xinda.checkpoint import list_checkpoints, load_state, state_json
from xinda.config import TrainConfig
from xinda.errors import XindaError
from xinda.train.grow import grow_model_dir
from xinda.train.schedule import learning_rate

SHALLOW_STEPS, MORE_STEPS = 8, 6
TRAIN = {"max_steps": SHALLOW_STEPS, "log_every": 1, "valid_bleu": False, "lr": 3e-3,
         "warmup_steps": 20}  # inverse_sqrt, restarted at this peak after the growth


def rows(model_dir):
    with (model_dir / "log.csv").open(newline="") as f:
        return [r for r in csv.DictReader(f) if r["lr"]]


@pytest.fixture(scope="module")
def grown(prepared, write_config, xinda, tmp_path_factory):
    root = tmp_path_factory.mktemp("grow")
    shallow = root / "shallow"
    config = write_config(root / "shallow.yaml", prepared.raw, prepared.data_dir, shallow,
                          train={**TRAIN, "out_dir": str(shallow)})
    xinda("train", config)
    proc = xinda("grow", shallow, "--to", "2")  # --output defaults to MODEL_DIR-2l
    return shallow, root / "shallow-2l", proc


def test_grow_writes_a_self_contained_directory(grown):
    shallow, deep, proc = grown
    assert str(deep) in proc.stdout and "--resume" in proc.stdout
    assert f"update {SHALLOW_STEPS}, inside the warm-up (20 updates)" in proc.stderr
    cfg = yaml.safe_load((deep / "config.yaml").read_text(encoding="utf-8"))
    old = yaml.safe_load((shallow / "config.yaml").read_text(encoding="utf-8"))
    assert cfg["model"]["arch"] == "transformer" and cfg["model"]["encoder_layers"] == 2
    assert cfg["model"]["decoder_layers"] == old["model"]["decoder_layers"] == 1
    assert cfg["model"]["d_model"] == 32 and "norm" in cfg["model"]  # every field explicit
    assert cfg["train"] == {**old["train"], "out_dir": str(deep)}  # the same schedule
    for name in ("manifest.json", "log.csv", *{p.name for p in shallow.glob("*.model")}):
        assert (deep / name).is_file(), name
    [checkpoint] = list_checkpoints(deep)
    assert checkpoint.name == f"step_{SHALLOW_STEPS:07d}.safetensors"
    state = load_state(checkpoint)
    old_state = load_state(list_checkpoints(shallow)[-1])
    assert state["optimizer"] is None
    assert state["progress"]["lr_resets"] == [SHALLOW_STEPS]
    assert state["progress"]["best"] == -math.inf
    for key in ("step", "epoch", "batch", "tgt_tokens", "train_seconds"):
        assert state["progress"][key] == old_state["progress"][key], key
    assert torch.equal(state["rng"], old_state["rng"])


def test_grow_keeps_every_ranks_random_numbers(grown, monkeypatch, tmp_path):
    """Before: a multi-rank (or GPU) run's per-rank generators were dropped, so ranks > 0 and
    the CUDA generator were reseeded on --resume."""
    import xinda.checkpoint as ckpt

    shallow, _, _ = grown
    ranks = {"world_size": 2, "rng": [{"cpu": torch.get_rng_state()},
                                      {"cpu": torch.randint(0, 255, (16,), dtype=torch.uint8)}]}
    original = ckpt.load_state
    monkeypatch.setattr(ckpt, "load_state", lambda path: {**original(path), "ranks": ranks,
                                                          "batches_per_update": 4})
    grow_model_dir(shallow, 2, tmp_path / "deep")
    [checkpoint] = list_checkpoints(tmp_path / "deep")
    saved = load_state(checkpoint)["ranks"]
    # before: dropped, and a resume guessed it from config.yaml (found by review)
    assert load_state(checkpoint)["batches_per_update"] == 4
    assert saved["world_size"] == 2
    for got, want in zip(saved["rng"], ranks["rng"]):
        assert torch.equal(got["cpu"], want["cpu"])


def test_grow_warns_of_every_limit_the_run_already_reached(grown, monkeypatch, tmp_path,
                                                           caplog):
    """Before: only max_steps was named; after max_epochs or max_seconds the grown model's
    --resume trained no update, exit 0 (found by review)."""
    import xinda.checkpoint as ckpt

    shallow, _, proc = grown
    assert f"train.max_steps {SHALLOW_STEPS} is already reached" in proc.stderr
    original = ckpt.load_state

    def finished(path):
        state = original(path)
        return {**state, "progress": {**state["progress"], "epoch": 101, "wall_seconds": 9.5}}
    monkeypatch.setattr(ckpt, "load_state", finished)
    with caplog.at_level("WARNING", logger="xinda"):
        grow_model_dir(shallow, 2, tmp_path / "deep")
    assert "train.max_epochs 100 is already reached: resume with --set train.max_epochs=N " \
           "(N > 100)" in caplog.text


def test_resume_continues_with_the_lr_at_its_peak(grown, xinda):
    from xinda.decode.translator import Translator

    _, deep, _ = grown
    total = SHALLOW_STEPS + MORE_STEPS
    proc = xinda("train", deep / "config.yaml", "--resume", "--set",
                 f"train.max_steps={total}")
    assert f"trained {total} updates" in proc.stdout
    assert "fresh optimizer" in proc.stderr
    assert "warmup_steps" not in proc.stderr  # restarted at its peak: no warm-up cut short
    assert list_checkpoints(deep)[-1].name == f"step_{total:07d}.safetensors"
    logged = {int(r["step"]): float(r["lr"]) for r in rows(deep)}
    assert sorted(logged) == list(range(1, total + 1))  # the step counter continued
    assert logged[SHALLOW_STEPS + 1] == pytest.approx(TRAIN["lr"], rel=1e-5)  # the old peak
    assert logged[SHALLOW_STEPS] < logged[SHALLOW_STEPS + 1]  # still warming up before
    cfg = TrainConfig(**yaml.safe_load((deep / "config.yaml").read_text())["train"])
    for step in range(SHALLOW_STEPS + 1, total + 1):
        assert logged[step] == pytest.approx(
            learning_rate(cfg, step, 32, [SHALLOW_STEPS]), rel=1e-5)
    translator = Translator.load(deep)
    assert translator.model.cfg.encoder_layers == 2
    out = translator.translate_text(["one hundred two", "", "seven"], beam=2)
    assert len(out) == 3 and out[1] == ""


def test_the_old_model_s_unlogged_updates_keep_a_row_of_their_own(grown, tmp_path):
    """A checkpoint may hold updates not yet in the log (fewer than log_every since its last
    row). Before: the grown model kept them pending, and its first row mixed the old model's
    losses with its own (found by review)."""
    import json
    import shutil

    shallow = tmp_path / "shallow"
    shutil.copytree(grown[0], shallow)
    meta = state_json(list_checkpoints(shallow)[-1])
    document = json.loads(meta.read_text(encoding="utf-8"))
    document["state"]["progress"]["log_window"] = [6.0, 4.0, 3, 0.5]  # 3 tokens unlogged
    meta.write_text(json.dumps(document), encoding="utf-8")
    deep = grow_model_dir(shallow, 2, tmp_path / "deep")
    state = load_state(list_checkpoints(deep)[-1])
    assert state["progress"]["log_window"] == [0.0, 0.0, 0, 0.0]
    last = rows(deep)[-1]
    assert int(last["step"]) == SHALLOW_STEPS and float(last["train_loss"]) == 2.0
    assert float(last["tok_per_s"]) == 6.0
    assert [r["step"] for r in rows(deep)].count(str(SHALLOW_STEPS)) == 1


def test_the_default_output_is_beside_the_model_directory(tmp_path, monkeypatch):
    """Before: "xinda grow ." wrote ".-2l" inside the model directory (found by review)."""
    from xinda.train.grow import default_out

    assert default_out("runs/x", 2) == Path("runs/x-2l")
    assert default_out("runs/x/", 3) == Path("runs/x-3l")
    model = tmp_path / "model"
    model.mkdir()
    monkeypatch.chdir(model)
    assert default_out(".", 2) == tmp_path / "model-2l"
    assert default_out("..", 2).name == f"{tmp_path.name}-2l"


def test_refusals(grown, xinda, one_line_error, tmp_path):
    shallow, _, _ = grown
    one_line_error(xinda("grow", shallow, "--to", "3", "-o", tmp_path / "x", ok=False),
                   "1 < N <= 2")
    with pytest.raises(XindaError, match="1 < N <= 2"):
        grow_model_dir(shallow, 1, tmp_path / "y")
    with pytest.raises(XindaError, match="already holds checkpoints"):
        grow_model_dir(shallow, 2, shallow.parent / "shallow-2l")
    served = tmp_path / "served"  # a model kept for serving, without its checkpoints: before,
    served.mkdir()  # grow replaced its config.yaml, and its weights no longer loaded
    (served / "config.yaml").write_text("kept")
    (served / "best.safetensors").write_bytes(b"weights")
    with pytest.raises(XindaError, match=r"holds trained weights \(best.safetensors\)"):
        grow_model_dir(shallow, 2, served)
    assert (served / "config.yaml").read_text() == "kept"
    mine = tmp_path / "mine"  # before: grow replaced the folder's config.yaml
    mine.mkdir()
    (mine / "config.yaml").write_text("kept")
    with pytest.raises(XindaError, match=r"mine: not empty \(config.yaml\)"):
        grow_model_dir(shallow, 2, mine)
    assert (mine / "config.yaml").read_text() == "kept"
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.yaml").write_text((shallow / "config.yaml").read_text())
    with pytest.raises(XindaError, match="no step checkpoint"):
        grow_model_dir(empty, 2)
    (empty / "checkpoints").symlink_to(shallow / "checkpoints")  # no manifest.json
    with pytest.raises(XindaError, match="manifest"):
        grow_model_dir(empty, 2, tmp_path / "grown")
    assert not (tmp_path / "grown").exists()  # before: an empty folder was left
    rnn = tmp_path / "rnn"
    rnn.mkdir()
    (rnn / "config.yaml").write_text(yaml.safe_dump({"model": {"preset": "rnn-bahdanau"}}))
    with pytest.raises(XindaError, match="only a Transformer encoder can grow"):
        grow_model_dir(rnn, 2)


@pytest.mark.parametrize("out", ["file", "file/sub"])
def test_an_output_that_cannot_be_written_is_one_line(grown, xinda, one_line_error, tmp_path,
                                                      out):
    """Before: a FileExistsError / NotADirectoryError traceback."""
    shallow, _, _ = grown
    (tmp_path / "file").write_text("kept")
    proc = xinda("grow", shallow, "--to", "2", "--out", tmp_path / out, ok=False)
    one_line_error(proc, str(tmp_path / out), "cannot write")
    assert (tmp_path / "file").read_text() == "kept"


def test_average_needs_at_least_one_checkpoint(grown, xinda, one_line_error, tmp_path):
    """Before: --last 0 averaged every checkpoint and --last -1 all but the oldest."""
    shallow, _, _ = grown
    for last in ("0", "-1"):
        proc = xinda("average", shallow, "--last", last, "-o", tmp_path / "avg.safetensors",
                     ok=False)
        assert proc.returncode != 0 and "--last" in proc.stderr
    assert not (tmp_path / "avg.safetensors").exists()
    one_line_error(xinda("average", tmp_path / "nothing", ok=False),
                   f"{tmp_path / 'nothing'}: no checkpoints")


def test_average_never_writes_into_the_checkpoints(grown, xinda, one_line_error):
    """Before: -o onto a step checkpoint replaced it, which then failed its checksum and was
    skipped as incomplete: its training state was lost."""
    shallow, _, _ = grown
    step = max((shallow / "checkpoints").glob("step_*.safetensors"))
    before = step.read_bytes()
    one_line_error(xinda("average", shallow, "--last", "2", "-o", step, ok=False),
                   "inside", "checkpoints")
    assert step.read_bytes() == before


@pytest.mark.parametrize("name", ["best.safetensors", "config.yaml"])
def test_average_never_replaces_the_model_s_own_files(grown, xinda, one_line_error, name):
    """Before: -o MODEL_DIR/config.yaml wrote weights over the config (the model no longer
    loaded) and -o MODEL_DIR/best.safetensors replaced the best weights."""
    shallow, _, _ = grown
    path = shallow / name
    if not path.exists():
        path.write_bytes(b"kept")
    before = path.read_bytes()
    proc = xinda("average", shallow, "--last", "2", "-o", path, ok=False)
    one_line_error(proc, f"-o {path}: ", "safetensors")
    assert path.read_bytes() == before


def test_average_never_replaces_another_model_s_average(grown, xinda, one_line_error, tmp_path):
    """Before: any file named averaged* was replaced, so -o OTHER_MODEL/averaged.safetensors
    overwrote that model's own average, which translate then loaded (found by review)."""
    shallow, _, _ = grown
    other = tmp_path / "other"
    other.mkdir()
    (other / "averaged.safetensors").write_bytes(b"the other model's average")
    proc = xinda("average", shallow, "--last", "2", "-o", other / "averaged.safetensors",
                 ok=False)
    one_line_error(proc, "exists; averaging replaces only an earlier average in")
    assert (other / "averaged.safetensors").read_bytes() == b"the other model's average"
