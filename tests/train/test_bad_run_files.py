"""Bad files around a training run are one-line XindaErrors naming the file, before anything
is written (found by a bad-input review):

* a new run refuses an out_dir that is not a model directory: a user's files (a commented
  config.yaml, the config file read itself, a log.csv and curves.png of their own) or another
  experiment's prepared data were written over; a run stopped before its first checkpoint is
  still started over, and a new or empty folder and ``--resume`` still work;
* a damaged log.csv or checkpoint state (``"step": "x"``, no ``"optimizer"``) on ``--resume``
  and ``xinda grow`` (which left a half-written folder that a retry found not empty);
* token ids outside the vocabulary in the prepared arrays (an IndexError mid-training);
* NaN in the weights a translator loads (every translation came out empty, exit 0).
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from subprocesses import subprocess_env, xinda_command
from tiny_experiment import number_words_experiment

from xinda.checkpoint import list_checkpoints, load_state, state_json
from xinda.config import ExperimentConfig
from xinda.decode.translator import Translator
from xinda.errors import XindaError
from xinda.train.grow import grow_model_dir
from xinda.train.saved_state import checked_state
from xinda.train.trainer import Trainer


def files(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def with_out(cfg: ExperimentConfig, out: Path, **train) -> ExperimentConfig:
    tree = cfg.model_dump(mode="json")
    tree["train"].update(out_dir=str(out), **train)
    return ExperimentConfig.model_validate(tree)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> ExperimentConfig:
    """A prepared 20-pair number-words corpus and a tiny Transformer's training config."""
    return number_words_experiment(tmp_path_factory.mktemp("bad-run-files"), 20,
                                   max_steps=2, threads=1)


@pytest.fixture(scope="module")
def trained_dir(prepared, tmp_path_factory) -> Path:
    """A model directory trained 2 updates (read-only: tests copy it)."""
    out = tmp_path_factory.mktemp("trained") / "model"
    Trainer(with_out(prepared, out)).train()
    return out


@pytest.fixture
def run(trained_dir, tmp_path) -> Path:
    """A copy of the trained model directory."""
    return shutil.copytree(trained_dir, tmp_path / "run")


def refused(cfg: ExperimentConfig, *fragments: str, resume: bool = False, **kw) -> str:
    with pytest.raises(XindaError) as err:
        Trainer(cfg, **kw).train(resume=resume)
    message = str(err.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


# ------------------------------------------------------------------ A: where a new run writes
COMMENTED = "# my experiment: do not lose this comment\ntrain:\n  out_dir: .\n"


def test_a_users_commented_config_in_out_dir_is_not_written_over(prepared, tmp_path):
    """(a) ``train.out_dir: .`` beside the user's commented config.yaml: it was rewritten."""
    (tmp_path / "config.yaml").write_text(COMMENTED, encoding="utf-8")
    before = files(tmp_path)
    refused(with_out(prepared, tmp_path), f"{tmp_path / 'config.yaml'}: not a file that xinda "
            "train wrote (a new run would write over it)")
    refused(with_out(prepared, tmp_path), f"{tmp_path / 'config.yaml'}: the config file read, "
            "not a file that xinda train wrote", config=tmp_path / "config.yaml")
    assert files(tmp_path) == before


def test_the_cli_refuses_it_on_one_line(prepared, tmp_path):
    """The reviewer's repro: ``xinda train config.yaml`` in the folder, ``train.out_dir: .``:
    exit 0, the config rewritten and its comments lost."""
    tree = prepared.model_dump(mode="json")
    tree["train"]["out_dir"] = "."
    config = tmp_path / "config.yaml"
    config.write_text(f"# my experiment\n{yaml.safe_dump(tree)}", encoding="utf-8")
    before = files(tmp_path)
    proc = subprocess.run([*xinda_command(), "train", "config.yaml"], cwd=tmp_path, text=True,
                          capture_output=True, env=subprocess_env(), timeout=120, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert errors == [("xinda: error: config.yaml: the config file read, not a file that xinda "
                       "train wrote (a new run would write over it): choose another "
                       "train.out_dir (a new or empty folder)")]
    assert files(tmp_path) == before


def test_a_folder_of_the_users_own_files_is_refused(prepared, trained_dir, tmp_path):
    """(b) their log.csv, config.yaml and curves.png were all overwritten, exit 0. Each is
    refused by itself, among files that a run wrote (which alone would be started over)."""
    users = {"config.yaml": COMMENTED.encode(), "log.csv": b"when,what\nmonday,notes\n",
             "curves.png": b"my plot", "manifest.json": b'{"mine": 1}',
             "train_stats.json": b"[1, 2]"}
    for name, content in users.items():
        out = shutil.copytree(trained_dir, tmp_path / name, ignore=shutil.ignore_patterns(
            "checkpoints"))
        (out / name).write_bytes(content)
        before = files(out)
        refused(with_out(prepared, out), f"{out / name}: not a file that xinda train wrote (a "
                "new run would write over it): choose another train.out_dir")
        assert files(out) == before


def test_another_experiments_prepared_data_is_refused(prepared, tmp_path):
    """(c) its manifest.json and spm.model were replaced: the dataset no longer matched its
    arrays."""
    other = shutil.copytree(prepared.data.out_dir, tmp_path / "other-bin")
    before = files(other)
    refused(with_out(prepared, other), f"{other}: holds a prepared dataset (train.src.ids.npy)")
    assert files(other) == before


def test_new_empty_and_stopped_run_folders_and_resume_still_train(prepared, trained_dir, run,
                                                                   tmp_path):
    """A new folder, an empty one, one with the demo's mark, one with the user's own files of
    names train does not write (their config under another name, a data folder: found by
    review), that of a run stopped before its first checkpoint (started over, as before, also
    from its own config.yaml), and ``--resume`` of a run from its own config.yaml."""
    empty, hidden, users = tmp_path / "empty", tmp_path / "hidden", tmp_path / "users"
    stopped = tmp_path / "stopped"
    for folder in (empty, hidden, users / "data"):
        folder.mkdir(parents=True)
    (hidden / ".xinda-demo").touch()
    (users / "exp.yaml").write_text("# mine\n", encoding="utf-8")
    (users / "data" / "notes.txt").write_text("mine", encoding="utf-8")
    shutil.copytree(trained_dir, stopped, ignore=shutil.ignore_patterns("checkpoints"))
    assert {p.name for p in stopped.iterdir()} == {
        "config.yaml", "manifest.json", "spm.model", "log.csv", "curves.png", "train_stats.json"}
    for out in (tmp_path / "new" / "model", empty, hidden, users, stopped):
        config = out / "config.yaml" if out == stopped else None
        assert Trainer(with_out(prepared, out, max_steps=1), config=config).train().step == 1
        assert [c.name for c in list_checkpoints(out)] == ["step_0000001.safetensors"]
    assert (users / "exp.yaml").read_text(encoding="utf-8") == "# mine\n"
    cfg = with_out(prepared, run, max_steps=3)
    assert Trainer(cfg, config=run / "config.yaml").train(resume=True).step == 3


# ------------------------------------------------------------------ B: damaged run files
def damage_state(run: Path, change) -> Path:
    meta = state_json(list_checkpoints(run)[-1])
    document = json.loads(meta.read_text(encoding="utf-8"))
    change(document)
    meta.write_text(json.dumps(document), encoding="utf-8")
    return meta


def test_a_log_that_is_not_utf8_is_one_line_on_resume(prepared, run):
    with (run / "log.csv").open("ab") as f:
        f.write(b"3,1,0.1,\xff\xfe,,,,,,\n")
    lines = (run / "log.csv").read_bytes().count(b"\n")
    before = files(run)
    refused(with_out(prepared, run, max_steps=4), f"{run / 'log.csv'}: line {lines}: not UTF-8 "
            "text", "damaged training log", resume=True)
    assert files(run) == before


def test_a_log_with_a_field_that_is_not_a_number_is_one_line_on_resume(prepared, run):
    """It failed in plot_curves at the first validation."""
    with (run / "log.csv").open("a", encoding="utf-8") as f:
        f.write("1,1,0.1,oops,1,1,1,,,\n")
    before = files(run)
    refused(with_out(prepared, run, max_steps=4), "log.csv: line ", "train_loss 'oops' is not "
            "a number", resume=True)
    assert files(run) == before


@pytest.mark.parametrize(("change", "fragment"), [
    (lambda d: d["state"]["progress"].update(step="x"), "progress.step is 'x', not a whole"),
    (lambda d: d["state"].pop("optimizer"), "the training state has no 'optimizer'"),
    (lambda d: d["state"]["progress"].update(log_window=[1]), "progress.log_window is [1]"),
    (lambda d: d["state"].update(rng=3), "'rng' is not a random generator state"),
    (lambda d: d["state"]["progress"].update(shoe_size=3), "progress.shoe_size is not a field"),
], ids=["step", "no-optimizer", "log-window", "rng", "unknown"])
def test_a_damaged_checkpoint_state_is_one_line_on_resume(prepared, run, change, fragment):
    """``"step": "x"`` was a TypeError in curves.py, no "optimizer" a KeyError in trainer.py."""
    meta = damage_state(run, change)
    before = files(run)
    refused(with_out(prepared, run, max_steps=4), f"{meta}: {fragment}", "damaged or edited "
            "checkpoint", resume=True)
    assert files(run) == before


def test_grow_checks_the_state_before_it_writes(run, tmp_path):
    """It left a half-written g3/, and a second try was refused "not empty"."""
    meta = damage_state(run, lambda d: d["state"]["progress"].update(step="x"))
    with pytest.raises(XindaError, match="progress.step is 'x'"):
        grow_model_dir(run, 2, tmp_path / "g3")
    assert not (tmp_path / "g3").exists()
    damage_state(run, lambda d: d["state"]["progress"].update(step=2))
    (run / "log.csv").write_bytes(b"step\n\xff\n")
    with pytest.raises(XindaError, match=r"log.csv: line 2: not UTF-8 text"):
        grow_model_dir(run, 2, tmp_path / "g3")
    assert not (tmp_path / "g3").exists()
    (run / "log.csv").unlink()
    assert meta.is_file() and grow_model_dir(run, 2, tmp_path / "g3") == tmp_path / "g3"


def test_grow_removes_what_it_wrote_when_it_fails(run, tmp_path, monkeypatch):
    """A failure while writing (here: the checkpoint) leaves no half-written folder; a folder
    that was there empty stays, empty."""
    from xinda.train import grow

    def fail(*args, **kwargs):
        raise XindaError("disk full")

    monkeypatch.setattr(grow.ckpt, "save_checkpoint", fail)
    for out, kept in ((tmp_path / "new", False), (tmp_path / "empty", True)):
        if kept:
            out.mkdir()
        with pytest.raises(XindaError, match="disk full"):
            grow_model_dir(run, 2, out)
        assert out.exists() == kept and not (kept and any(out.iterdir()))


# ------------------------------------------------------------------ C: ids outside the vocab
@pytest.mark.parametrize(("side", "bad"), [("src", 1000000), ("tgt", -3)])
def test_ids_outside_the_vocabulary_are_refused_before_training(prepared, tmp_path, side, bad):
    """They were an IndexError in the embedding, once the out_dir had been written."""
    data = shutil.copytree(prepared.data.out_dir, tmp_path / "bin")
    array = data / f"train.{side}.ids.npy"
    ids = np.load(array)
    ids[len(ids) // 2] = bad
    np.save(array, ids)
    out = tmp_path / "model"
    with pytest.raises(XindaError) as err:
        Trainer(with_out(prepared, out), data_dir=data).train()
    assert str(err.value).startswith(f"{array}: holds token id {bad}, outside the vocabulary "
                                     "of ")
    assert " pieces (ids 0 to " in str(err.value)
    assert not out.exists()


# ------------------------------------------------------------------ D: NaN in the weights
def test_weights_with_nan_do_not_translate(run):
    """The reviewer's damage: best.safetensors with its last 4000 bytes 0xFF (a valid header,
    NaN in output.weight). Before, every translation was empty, exit 0."""
    best = run / "best.safetensors"
    shutil.copyfile(list_checkpoints(run)[-1], best)
    data = bytearray(best.read_bytes())
    data[-4000:] = b"\xff" * 4000
    best.write_bytes(bytes(data))
    with pytest.raises(XindaError) as err:
        Translator.load(run)
    message = str(err.value)
    assert message.startswith(f"{best}: holds NaN or infinite values in ")
    assert message.endswith(": damaged file?")


def test_an_optimizer_state_for_other_parameters_starts_afresh_with_a_warning(run, caplog):
    """A run saved by an older xinda whose model had fewer parameters (cosine attention before
    its key strength) failed to resume with a ValueError traceback (found by review)."""
    state = load_state(list_checkpoints(run)[-1])
    sizes = [len(group["params"]) for group in state["optimizer"]["param_groups"]]
    fitting = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1)) for _ in range(sizes[0])])
    assert checked_state(state, Path("s.json"), fitting)["optimizer"] is not None
    other = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1)) for _ in range(sizes[0] + 2)])
    with caplog.at_level(logging.WARNING, logger="xinda"):
        assert checked_state(state, Path("s.json"), other)["optimizer"] is None
    assert f"s.json: its optimizer state is for {sizes} parameters, the model has " \
           f"[{sizes[0] + 2}]" in caplog.text and "the optimizer starts afresh" in caplog.text


def test_a_long_training_pair_is_not_named_by_a_corpus_line(tmp_path):
    """Prepare filters training pairs (length, ratio, duplicates): the index of a kept pair is
    no line of the corpus, and the error said "sentence N" as for valid (found by review)."""
    from xinda.train.run_dir import check_lengths

    class Arrays:
        def __init__(self, lengths):
            self.lengths = np.array(lengths)

        def __len__(self):
            return len(self.lengths)

    pair = (Arrays([3, 40, 5]), Arrays([3, 4, 5]))
    with pytest.raises(XindaError, match="train source pair 2 of those kept "
                                         r"\(filtered: not a corpus line\) has 40 pieces"):
        check_lengths(tmp_path, "train", pair, 32)
    with pytest.raises(XindaError, match="valid source sentence 2 has 40 pieces"):
        check_lengths(tmp_path, "valid", pair, 32)


@pytest.mark.parametrize(("model", "joint", "warned"), [
    ({"preset": "transformer-tiny", "share_embeddings": True}, False, True),
    ({"preset": "transformer-tiny"}, False, False),  # the default: no choice was made
    ({"preset": "transformer-tiny", "share_embeddings": True}, True, False)])
def test_shared_embeddings_asked_for_separate_vocabularies_are_warned_about(model, joint,
                                                                            warned, caplog):
    """Silently unused before (each side kept its own table)."""
    from xinda.data.vocab import VocabInfo
    from xinda.train.run_dir import warn_data_fit

    lengths = type("Arrays", (), {"lengths": np.array([3, 4])})()
    cfg = ExperimentConfig.model_validate({"model": model})
    warn_data_fit(cfg, lengths, lengths, VocabInfo(90, 80, 0, 2, 3, joint))
    assert ("model.share_embeddings has no effect" in caplog.text) is warned
