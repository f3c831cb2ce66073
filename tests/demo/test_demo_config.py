"""The demo's one config (xinda/demo/numbers.yaml, linked as recipes/demo-numbers.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from xinda.config import load_config
from xinda.demo.numbers import DEMO_SPLITS, write_demo_corpus
from xinda.demo.run import DEMO_CONFIG, demo_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_recipe_is_the_demo_config_itself():
    recipe = ROOT / "recipes" / "demo-numbers.yaml"
    assert recipe.resolve() == DEMO_CONFIG.resolve()
    assert load_config(recipe) == demo_config()


def test_default_paths_are_the_files_the_demo_writes():
    cfg = demo_config()
    assert cfg.data.train == "xinda-demo/raw/train" and cfg.train.out_dir == "xinda-demo/model"
    assert cfg.train.max_steps == 800 and cfg.train.max_seconds == 900


def test_workdir_moves_every_path_and_seconds_replace_the_budget(tmp_path):
    cfg = demo_config(tmp_path / "w", seconds=7.5)
    work = str(tmp_path / "w")
    assert cfg.data.train == f"{work}/raw/train" and cfg.data.valid == f"{work}/raw/valid"
    assert cfg.data.test == {"test": f"{work}/raw/test"}
    assert cfg.data.out_dir == f"{work}/data-bin" and cfg.train.out_dir == f"{work}/model"
    assert cfg.train.max_seconds == 7.5
    default = demo_config()  # everything else is unchanged
    assert cfg.model == default.model and cfg.decode == default.decode
    assert cfg.train.lr == default.train.lr and cfg.data.vocab_size == default.data.vocab_size


def test_seconds_win_over_a_set_time_cap():
    """As translate's options win over --set (before: --set dropped --seconds silently)."""
    assert demo_config(seconds=60, overrides=["train.max_seconds=900"]).train.max_seconds == 60
    assert demo_config(overrides=["train.max_seconds=30"]).train.max_seconds == 30


def test_the_corpus_written_by_default_has_the_demo_sizes(tmp_path):
    prefixes = write_demo_corpus(tmp_path)
    assert set(prefixes) == set(DEMO_SPLITS)
    for split, size in DEMO_SPLITS.items():
        lines = Path(f"{prefixes[split]}.digits").read_text(encoding="utf-8").splitlines()
        assert len(lines) == size


@pytest.mark.parametrize("name", ["run #1", "*x", "a: b", "&y", "[z]"])
def test_a_workdir_is_a_path_whatever_its_characters(tmp_path, name):
    """Before: pasted into --set values read as YAML, "run #1" lost " #1" to a comment (and
    two out_dirs became one), "*x" was an alias error, "a: b" a mapping (found by review)."""
    cfg = demo_config(tmp_path / name)
    assert cfg.data.out_dir == f"{tmp_path / name}/data-bin"
    assert cfg.train.out_dir == f"{tmp_path / name}/model"
