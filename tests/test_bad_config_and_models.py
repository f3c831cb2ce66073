"""Config files and prepared directories that are wrong in ways that used to pass silently or
end in a traceback: duplicate YAML keys, out-of-range seeds, a directory as a file, a corrupt
sentencepiece model or manifest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from data.test_bad_input_prepare import config, corpus, lines

from xinda.config import load_config
from xinda.data.manifest import load_manifest, load_vocabularies
from xinda.data.prepare import prepare
from xinda.errors import XindaError


def error(call, *args) -> str:
    with pytest.raises(XindaError) as info:
        call(*args)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_a_key_given_twice_is_refused_with_its_line(tmp_path):
    """Before: the second ``data:`` silently replaced the first."""
    path = tmp_path / "config.yaml"
    path.write_text("data:\n  vocab_size: 16\n  train: corpus\ntrain:\n  lr: 0.001\n"
                    "data:\n  vocab_size: 32\n")
    assert error(load_config, path) == f"{path}: invalid YAML: duplicate key 'data' at line 6"
    path.write_text("train:\n  lr: 0.001\n  warmup_steps: 10\n  lr: 0.002\n")
    assert "duplicate key 'lr' at line 4" in error(load_config, path)


@pytest.mark.parametrize(("key", "value", "top"), [
    ("data.seed", -1, 2**32 - 1), ("data.seed", 2**32, 2**32 - 1),  # sentencepiece's uint32
    ("train.seed", -1, 2**32 - 1), ("train.seed", 2**32, 2**32 - 1),  # numpy's
    ("decode.seed", -1, 2**63 - 1), ("decode.seed", 2**63, 2**63 - 1)])  # torch.Generator's
def test_seeds_outside_what_their_generator_takes_are_refused(key, value, top):
    """Before: data.seed=-1 crashed sentencepiece with a traceback after reading the corpus."""
    assert f"{key}: Input should be" in error(load_config, None, [f"{key}={value}"])
    section = getattr(load_config(None, [f"{key}={top}"]), key.split(".")[0])
    assert section.seed == top


def test_a_directory_as_the_config_or_the_sentencepiece_model(tmp_path):
    assert error(load_config, tmp_path) == f"{tmp_path}: is a directory, not a config file"
    train = corpus(tmp_path, "train", lines(50), lines(50, 1))
    message = error(prepare, config(tmp_path, train=train, spm_model=str(tmp_path)))
    assert message.startswith(f"{tmp_path}: is a directory")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("prepared")
    prepare(config(root, train=corpus(root, "train", lines(200), lines(200, 1))),
            log=lambda _: None)
    return root / "bin"


def test_a_truncated_sentencepiece_model_is_named(prepared, tmp_path):
    broken = shutil.copytree(prepared, tmp_path / "bin")
    model = broken / "spm.model"
    model.write_bytes(model.read_bytes()[:100])
    assert error(load_vocabularies, broken) == (
        f"{model}: not a valid sentencepiece model — run xinda prepare again")


@pytest.mark.parametrize("manifest", [[1, 2], {"format_version": 1}, "text"])
def test_a_manifest_of_the_wrong_shape_is_named(prepared, tmp_path, manifest):
    broken = shutil.copytree(prepared, tmp_path / "bin")
    (broken / "manifest.json").write_text(json.dumps(manifest))
    assert error(load_manifest, broken).startswith(
        f"{broken / 'manifest.json'}: not a manifest of xinda prepare (no spm")


@pytest.mark.parametrize(("setting", "named"), [
    ("train.betas=[1.5,0.98]", "train.betas.0"), ("train.eps=-1", "train.eps"),
    ("train.weight_decay=-0.1", "train.weight_decay"), ("train.momentum=-0.5", "train.momentum"),
    ("train.lr=.inf", "train.lr"), ("train.dist_timeout=.inf", "train.dist_timeout"),
    ("train.min_lr=-1", "train.min_lr"), ("train.warmup_steps=0", "warmup_steps >= 1")])
def test_optimizer_settings_torch_would_refuse_are_config_errors(setting, named):
    """Before: accepted, then a torch ValueError traceback at the first update (or, lr inf,
    a NaN loss; warm-up 0 made inverse_sqrt a constant rate without a word)."""
    assert named in error(load_config, None, [setting])


def test_a_cuda_device_without_cuda_is_one_line(monkeypatch):
    """Before: AssertionError "Torch not compiled with CUDA enabled" (a traceback)."""
    from xinda.device import pick_device
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert error(pick_device, "cuda").startswith("train.device cuda: no CUDA device here")


def test_heads_that_do_not_divide_the_width_are_a_config_error():
    """Before: accepted by the config, then a ValueError traceback when the model was built."""
    from xinda.models.registry import resolve
    message = error(resolve, {"preset": "transformer-tiny", "heads": 3}, "c.yaml")
    assert "heads (3) must divide d_model (128)" in message
