"""Fixtures of the server tests: tiny trained models (built once per session, in-process, in a
few seconds each) and app clients built with ``create_app`` (no socket).

``served_model_dir`` (a number-words -> digits translation model) is also the model of the
browser test (test_browser.py).
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from xinda.config import ExperimentConfig
from xinda.data.prepare import prepare
from xinda.demo.numbers import write_demo_corpus
from xinda.serve.app import create_app
from xinda.serve.models import ServedModel, load_models
from xinda.serve.settings import ServeSettings
from xinda.train.trainer import Trainer

with warnings.catch_warnings():  # Starlette >= 1 prefers httpx2 to httpx (both work)
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

TINY = {"arch": "transformer", "d_model": 16, "heads": 2, "ffn_dim": 32, "encoder_layers": 1,
        "decoder_layers": 1}
HAN = "春夏秋冬江山风月花鸟云水天地日星雨雪松竹梅兰红绿青白东西南北心意一三"


def train_tiny(root: Path, name: str, data: dict, decode: dict | None = None) -> Path:
    """Prepare ``data`` and train a 16-dimensional Transformer for 2 updates into root/name."""
    cfg = ExperimentConfig.model_validate({
        "data": {"out_dir": str(root / "bin"), **data},
        "model": TINY,
        "train": {"out_dir": str(root / name), "progress": False, "device": "cpu",
                  "precision": "fp32", "max_steps": 2, "max_tokens": 400,
                  "run_validation": False, "threads": 1},
        "decode": decode or {}})
    prepare(cfg.data, log=lambda _: None)
    with warnings.catch_warnings():  # training without validation plots an empty legend
        warnings.filterwarnings("ignore", "No artists with labels")
        Trainer(cfg).train()
    return root / name


def write_pairs(prefix: Path, src: str, tgt: str, pairs: list[tuple[str, str]]) -> str:
    for suffix, side in ((src, 0), (tgt, 1)):
        Path(f"{prefix}.{suffix}").write_text("".join(p[side] + "\n" for p in pairs),
                                              encoding="utf-8")
    return str(prefix)


def han_line(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(HAN) for _ in range(n))


@pytest.fixture(scope="session")
def served_model_dir(tmp_path_factory) -> Path:
    """A trained tiny translation model (number words -> digits), served as "numbers"."""
    root = tmp_path_factory.mktemp("serve-numbers")
    raw = write_demo_corpus(root / "raw", {"train": 60})
    return train_tiny(root, "numbers", {
        "src_lang": "words", "tgt_lang": "digits", "train": raw["train"], "vocab_size": 40,
        "normalize": "NFKC", "pretok_src": "moses", "pretok_tgt": "char"},
        {"max_len_a": 0.0, "max_len_b": 8, "max_input_len": 24, "beam": 2})


@pytest.fixture(scope="session")
def couplet_model_dir(tmp_path_factory) -> Path:
    """A trained tiny couplet model (up -> down, characters), served as "couplet"."""
    root = tmp_path_factory.mktemp("serve-couplet")
    rng = random.Random(1)
    pairs = [(han_line(rng, n), han_line(rng, n)) for n in [5, 7] * 100]
    return train_tiny(root, "couplet", {
        "src_lang": "up", "tgt_lang": "down", "train": write_pairs(root / "train", "up",
                                                                   "down", pairs),
        "vocab_size": 120, "normalize": "NFC", "pretok_src": "char", "pretok_tgt": "char"})


@pytest.fixture(scope="session")
def poetry_model_dir(tmp_path_factory) -> Path:
    """A trained tiny poetry model (kw -> poem, characters), served as "poetry"."""
    root = tmp_path_factory.mktemp("serve-poetry")
    rng = random.Random(2)
    poems = ["".join(han_line(rng, 5) + "，。"[k % 2] for k in range(4)) for _ in range(150)]
    pairs = [(f"五言 {han_line(rng, 2)}", poem) for poem in poems]
    return train_tiny(root, "poetry", {
        "src_lang": "kw", "tgt_lang": "poem", "train": write_pairs(root / "train", "kw",
                                                                   "poem", pairs),
        "vocab_size": 120, "normalize": "NFC", "pretok_src": "char", "pretok_tgt": "char",
        "max_len_ratio": 10})


@pytest.fixture(scope="session")
def served_models(served_model_dir, couplet_model_dir, poetry_model_dir
                  ) -> dict[str, ServedModel]:
    """The three models, loaded once: "numbers", "couplet", "poetry"."""
    return load_models([served_model_dir, couplet_model_dir, poetry_model_dir])


@pytest.fixture
def make_client(served_models) -> Callable:
    """``make_client(models=("numbers",), start=True, **settings)`` -> a context manager giving
    a TestClient of an app serving those models; ``start=False`` leaves the workers stopped
    (requests then wait in the queue)."""
    @contextmanager
    def make(models: tuple[str, ...] = ("numbers",), start: bool = True,
             **settings) -> Iterator[TestClient]:
        app = create_app({name: served_models[name] for name in models},
                         ServeSettings(**settings))
        client = TestClient(app, base_url="http://127.0.0.1")
        if start:
            with client:
                yield client
        else:
            yield client
    return make


@pytest.fixture
def client(make_client) -> Iterator[TestClient]:
    """A client of an app serving all three models."""
    with make_client(("numbers", "couplet", "poetry")) as c:
        yield c
