"""A prepared tiny experiment on the demo's number-words corpus, for tests that train
in-process: a 1+1-layer Transformer of width 16, fp32 on the CPU, no progress bars, no
validation, no heap tuning."""

from __future__ import annotations

from pathlib import Path

from xinda.config import ExperimentConfig
from xinda.data.prepare import prepare
from xinda.demo.numbers import write_demo_corpus

TINY_TRANSFORMER = {"arch": "transformer", "d_model": 16, "heads": 2, "ffn_dim": 32,
                    "encoder_layers": 1, "decoder_layers": 1}


def number_words_experiment(root: Path, pairs: int, model: dict | None = None,
                            **train) -> ExperimentConfig:
    """``pairs`` training pairs prepared into ``root/bin``; the model trains into
    ``root/model`` with ``train`` overriding the defaults above."""
    raw = write_demo_corpus(root / "raw", {"train": pairs})
    cfg = ExperimentConfig.model_validate({
        "data": {"src_lang": "words", "tgt_lang": "digits", "train": raw["train"],
                 "out_dir": str(root / "bin"), "vocab_size": 40, "normalize": "none",
                 "pretok_tgt": "char"},
        "model": model or TINY_TRANSFORMER,
        "train": {"out_dir": str(root / "model"), "progress": False, "device": "cpu",
                  "precision": "fp32", "keep_heap": False, "run_validation": False, **train}})
    prepare(cfg.data, log=lambda _: None)
    return cfg
