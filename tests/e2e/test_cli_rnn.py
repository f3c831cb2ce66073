"""The RNN family through the same CLI: train, translate with coverage, attention plots."""

from __future__ import annotations

import json

import pytest
import yaml


@pytest.mark.parametrize("preset", ["rnn-luong-global", "rnn-bahdanau"])
def test_rnn_preset_trains_translates_and_plots(preset, prepared, xinda, write_config, tmp_path):
    config = write_config(tmp_path / "rnn.yaml", prepared.raw, prepared.data_dir,
                          tmp_path / "model")
    cfg = yaml.safe_load(config.read_text(encoding="utf-8"))
    cfg["model"] = {"preset": preset, "embed_dim": 32, "hidden_dim": 32}
    config.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    xinda("train", config, "--set", "train.max_steps=20", cwd=tmp_path)
    stats = json.loads((tmp_path / "model" / "train_stats.json").read_text(encoding="utf-8"))
    assert stats["steps"] == 20
    src = tmp_path / "in.txt"
    src.write_text("three hundred four\n\nseventy-one thousand two\n", encoding="utf-8")
    plots = tmp_path / "plots"
    proc = xinda("translate", tmp_path / "model", "-i", src, "--beam", "3", "--coverage", "0.2",
                 "--attention-plot", plots)
    assert len(proc.stdout.splitlines()) == 3 and proc.stdout.splitlines()[1] == ""
    assert sorted(p.name for p in plots.glob("*.png")) == ["00000.png", "00002.png"]


def test_attention_plots_of_a_model_without_attention_are_refused(prepared, xinda, one_line_error,
                                                                   write_config, tmp_path):
    """Before: an empty folder, exit code 0 and no word of why."""
    config = write_config(tmp_path / "rnn.yaml", prepared.raw, prepared.data_dir,
                          tmp_path / "model")
    cfg = yaml.safe_load(config.read_text(encoding="utf-8"))
    cfg["model"] = {"preset": "rnn-sutskever", "embed_dim": 16, "hidden_dim": 16,
                    "encoder_layers": 1, "decoder_layers": 1}
    config.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    xinda("train", config, "--set", "train.max_steps=2", cwd=tmp_path)
    src = tmp_path / "in.txt"
    src.write_text("three hundred four\n", encoding="utf-8")
    proc = xinda("translate", tmp_path / "model", "-i", src, "--attention-plot",
                 tmp_path / "plots", ok=False)
    one_line_error(proc, "--attention-plot needs an attention model")
    assert not list((tmp_path / "plots").glob("*.png"))
