"""``xinda demo``: the whole pipeline on a task the project generates itself.

English number words -> digits ("four hundred twenty-one thousand seven" -> "421007"):
generate the corpus, prepare it (sentencepiece on the words, characters on the digits),
train ``transformer-tiny`` for a fixed number of updates (with a time cap for slow machines),
translate the held-out test set with beam search and print examples, BLEU (character level)
and exact match. Every setting is in ``numbers.yaml`` beside this file (also
``recipes/demo-numbers.yaml``).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from xinda.config import ExperimentConfig, load_config
from xinda.data.prepare import prepare
from xinda.decode.translator import Translator
from xinda.demo.numbers import DEMO_SPLITS, write_demo_corpus
from xinda.errors import XindaError
from xinda.evaluate.metrics import corpus_scores
from xinda.train.trainer import Trainer
from xinda.utils import read_lines

DEMO_CONFIG = Path(__file__).with_name("numbers.yaml")
MARK = ".xinda-demo"  # in every folder the demo writes: only such folders are replaced


def check_demo_folder(folder: Path) -> None:
    """The demo replaces ``folder`` only when it made it (or it is missing or empty): never a
    user's folder, the current one or one of its parents."""
    here = Path.cwd().resolve()
    if folder.resolve() == here or folder.resolve() in here.parents:
        raise XindaError(f"{folder}: the demo would replace the current folder; choose a "
                         "--workdir below it")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / MARK).is_file():
        raise XindaError(f"{folder}: exists and was not written by xinda demo, which replaces "
                         "its folders; choose another --workdir or remove it")
    if folder.exists() and not folder.is_dir():
        raise XindaError(f"{folder}: not a folder; choose another --workdir")


def demo_config(workdir: Path | None = None, seconds: float | None = None,
                overrides: Sequence[str] = ()) -> ExperimentConfig:
    """The demo's config; ``workdir`` replaces the folder its paths live in (that of
    ``train.out_dir``), ``seconds`` its ``train.max_seconds``; ``overrides`` are ``--set``
    strings applied last."""
    cfg = load_config(DEMO_CONFIG)
    home = Path(cfg.train.out_dir).parent

    def moved(path: str) -> str:  # quoted: a --set value is read as YAML ("#", "*", ": ")
        return json.dumps(path if workdir is None else
                          str(Path(workdir) / Path(path).relative_to(home)))

    data = cfg.data
    moves = [f"data.{name}={moved(getattr(data, name))}" for name in ("train", "valid",
                                                                     "out_dir")]
    moves += [f"data.test.{name}={moved(prefix)}" for name, prefix in data.test.items()]
    moves.append(f"train.out_dir={moved(cfg.train.out_dir)}")
    cap = [] if seconds is None else [f"train.max_seconds={seconds}"]  # (wins over --set's)
    return load_config(DEMO_CONFIG, [*moves, *overrides, *cap])


def run_demo(workdir: Path | None = None, seconds: float | None = None,
             overrides: Sequence[str] = ()) -> dict[str, float]:
    """Generate, prepare, train and translate; print and return exact match, BLEU, updates."""
    cfg = demo_config(workdir, seconds, overrides)
    if "test" not in cfg.data.test:  # (before: a KeyError after the whole run)
        raise XindaError("data.test: the demo translates and scores its test set 'test'; "
                         "keep data.test.test")
    raw = Path(cfg.data.train).parent
    folders = (raw, Path(cfg.data.out_dir), Path(cfg.train.out_dir))
    for folder in folders:
        check_demo_folder(folder)
    for folder in folders:  # an earlier demo's output: started afresh
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / MARK).touch()
    write_demo_corpus(raw)
    print(f"1/3 prepare: {DEMO_SPLITS['train']} generated pairs of number words -> digits")
    prepare(cfg.data)
    limits = [x for x in (f"{cfg.train.max_steps} updates" if cfg.train.max_steps else "",
                          f"{cfg.train.max_seconds:g} s" if cfg.train.max_seconds else "") if x]
    print(f"2/3 train {cfg.model.get('preset', cfg.model.get('arch'))} for "
          f"{' or '.join(limits) or f'{cfg.train.max_epochs} epochs'}"
          f"{', whichever comes first' if len(limits) > 1 else ''}")
    progress = Trainer(cfg).train()
    print(f"    {progress.step} updates, "  # (none: the time cap came before the first)
          f"{progress.tgt_tokens / max(progress.train_seconds, 1e-9):.0f} target tokens/s")
    print(f"3/3 translate the held-out test set (beam {cfg.decode.beam})")
    test = cfg.data.test["test"]
    sources = list(read_lines(f"{test}.{cfg.data.src_lang}"))
    refs = list(read_lines(f"{test}.{cfg.data.tgt_lang}"))
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
