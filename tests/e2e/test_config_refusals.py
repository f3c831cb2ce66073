"""Settings that can only fail or mislead later are refused (or warned about) by the command
that would waste the work, before it writes anything."""

from __future__ import annotations

import shutil


def test_prepare_refuses_a_model_too_short_for_its_sentences(prepared, xinda, one_line_error,
                                                              tmp_path):
    out = tmp_path / "data-bin"
    proc = xinda("prepare", prepared.config, "--set", f"data.out_dir={out}",
                 "--set", "model.max_positions=32", ok=False)
    one_line_error(proc, "data.max_len 250 keeps training sentences longer than "
                   "model.max_positions 32 holds (at most 31 pieces")
    assert not out.exists()
    xinda("prepare", prepared.config, "--set", f"data.out_dir={out}",
          "--set", "model.max_positions=32", "--set", "data.max_len=31")


def test_prepare_refuses_a_trained_model_folder(trained, xinda, one_line_error, tmp_path):
    """A new dataset there would replace the vocabulary under the model (the review made
    `translate` print garbage with exit 0 this way)."""
    model = shutil.copytree(trained.model_dir, tmp_path / "model")
    before = {p.name: p.read_bytes() for p in model.iterdir() if p.is_file()}
    proc = xinda("prepare", trained.prepared.config, "--set", f"data.out_dir={model}",
                 "--set", "data.lowercase=true", ok=False)
    one_line_error(proc, f"{model}: holds a trained model (config.yaml)")
    assert {p.name: p.read_bytes() for p in model.iterdir() if p.is_file()} == before


def test_train_refuses_the_data_folder_as_its_output(prepared, xinda, one_line_error):
    proc = xinda("train", prepared.config, "--set", f"train.out_dir={prepared.data_dir}",
                 ok=False)
    one_line_error(proc, "train.out_dir and data.out_dir are both")
    assert not (prepared.data_dir / "config.yaml").exists()


def test_train_warns_when_the_warm_up_outlasts_the_run(prepared, xinda, tmp_path):
    proc = xinda("train", prepared.config, "--set", f"train.out_dir={tmp_path / 'm'}",
                 "--set", "train.max_steps=2", "--set", "train.warmup_steps=40",
                 "--set", "train.run_validation=false")
    assert ("xinda: warning: train.warmup_steps 40 is more than train.max_steps 2: the "
            "learning rate stops at 0.05 of its peak") in proc.stderr
    quiet = xinda("train", prepared.config, "--set", f"train.out_dir={tmp_path / 'q'}",
                  "--set", "train.max_steps=2", "--set", "train.warmup_steps=2",
                  "--set", "train.run_validation=false")
    assert "warmup_steps" not in quiet.stderr
