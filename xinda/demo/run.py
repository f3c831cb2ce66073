"""``xinda demo``: the whole pipeline on a task the project generates itself.

English number words -> digits ("four hundred twenty-one thousand seven" -> "421007"):
generate the corpus, prepare it (sentencepiece on the words, characters on the digits),
train ``transformer-tiny`` for a fixed wall-clock budget, translate the held-out test set
with beam search and print examples, BLEU (character level) and exact match.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from xinda.config import ExperimentConfig
from xinda.data.prepare import prepare
from xinda.decode.translator import Translator
from xinda.demo.numbers import write_demo_corpus
from xinda.evaluate.metrics import corpus_scores
from xinda.train.trainer import Trainer
from xinda.utils import read_lines


def demo_config(workdir: Path, seconds: float) -> ExperimentConfig:
    prefixes = {"train": str(workdir / "raw" / "train"), "valid": str(workdir / "raw" / "valid"),
                "test": str(workdir / "raw" / "test")}
    return ExperimentConfig.model_validate({
        "data": {"src_lang": "words", "tgt_lang": "digits", "train": prefixes["train"],
                 "valid": prefixes["valid"], "test": {"test": prefixes["test"]},
                 "out_dir": str(workdir / "data-bin"), "pretok_tgt": "char",
                 "vocab_size": 120, "normalize": "none"},
        "model": {"preset": "transformer-tiny", "dropout": 0.1},
        "train": {"out_dir": str(workdir / "model"), "max_seconds": seconds, "max_tokens": 3000,
                  "lr": 2e-3, "warmup_steps": 300, "label_smoothing": 0.1, "valid_bleu": False,
                  "keep_last": 2, "log_every": 20},
        "decode": {"beam": 5, "alpha": 1.0, "max_len_a": 0.0, "max_len_b": 16},
    })


def run_demo(workdir: Path, seconds: float = 120.0, n_train: int = 20000) -> dict[str, float]:
    workdir = Path(workdir)
    for sub in ("raw", "data-bin", "model"):
        shutil.rmtree(workdir / sub, ignore_errors=True)
    write_demo_corpus(workdir / "raw", n_train=n_train, n_valid=300, n_test=300, seed=1)
    cfg = demo_config(workdir, seconds)
    print(f"1/3 prepare: {n_train} generated pairs of number words -> digits")
    prepare(cfg.data)
    print(f"2/3 train transformer-tiny for {seconds:.0f} s")
    progress = Trainer(cfg).train()
    print(f"    {progress.step} updates, {progress.tgt_tokens / progress.train_seconds:.0f} "
          f"target tokens/s")
    print("3/3 translate the held-out test set (beam 5)")
    sources = list(read_lines(workdir / "raw" / "test.words"))
    refs = list(read_lines(workdir / "raw" / "test.digits"))
    translator = Translator.load(cfg.train.out_dir)
    start = time.perf_counter()
    hyps = translator.translate_text(sources)
    speed = len(sources) / (time.perf_counter() - start)
    for src, hyp, ref in list(zip(sources, hyps, refs))[:5]:
        print(f"    {src}\n      -> {hyp}   ({'ok' if hyp == ref else 'expected ' + ref})")
    bleu = corpus_scores(hyps, refs, metrics=("bleu",), tokenize="char")[0]
    exact = 100.0 * sum(h == r for h, r in zip(hyps, refs)) / len(refs)
    print(f"test: exact match {exact:.1f}%  {bleu}  ({speed:.0f} sentences/s)")
    return {"exact_match": exact, "bleu": bleu.score, "updates": progress.step}
