"""Validation BLEU built above training and decoding, and handed to the Trainer."""

from __future__ import annotations

import csv
import json
import logging

import pytest
import torch
import torch.nn.functional as F

from xinda.config import ExperimentConfig
from xinda.data.batching import make_batches
from xinda.data.manifest import load_split, load_vocabularies
from xinda.data.prepare import prepare
from xinda.decode.translator import Translator
from xinda.demo.numbers import write_demo_corpus
from xinda.evaluate.metrics import corpus_scores
from xinda.evaluate.validation import bleu_tokenizer, validation_bleu
from xinda.models.registry import build_model
from xinda.train.trainer import Trainer
from xinda.utils import read_lines

TINY = {"arch": "transformer", "d_model": 16, "heads": 2, "ffn_dim": 32, "encoder_layers": 1,
        "decoder_layers": 1}


def experiment(root, with_valid: bool = True, **train) -> ExperimentConfig:
    raw = write_demo_corpus(root / "raw", {"train": 60, "valid": 8, "test": 4})
    return ExperimentConfig.model_validate({
        "data": {"src_lang": "words", "tgt_lang": "digits", "train": raw["train"],
                 "valid": raw["valid"] if with_valid else None, "out_dir": str(root / "bin"),
                 "vocab_size": 40, "normalize": "none", "pretok_tgt": "char"},
        "model": TINY,
        "train": {"out_dir": str(root / "model"), "progress": False, "valid_beam": 2, **train},
        "decode": {"max_len_a": 0.0, "max_len_b": 8}})


@pytest.fixture(scope="module")
def cfg(tmp_path_factory) -> ExperimentConfig:
    cfg = experiment(tmp_path_factory.mktemp("valid"))
    prepare(cfg.data, log=lambda _: None)
    return cfg


def test_scores_the_validation_translations_with_sacrebleu(tmp_path, monkeypatch):
    """The score is sacreBLEU's of the translations of the validation sources against their
    references: here right on every other sentence, so that it lies strictly inside 0-100."""
    cfg, refs = word_experiment(tmp_path, lowercase=False)
    hyps = [ref if i % 2 else "The Car!" for i, ref in enumerate(refs)]
    sources = []
    monkeypatch.setattr(Translator, "translate_text",
                        lambda self, lines, **_: sources.extend(lines) or hyps)
    vocabs = load_vocabularies(cfg.data.out_dir)
    score = validation_bleu(cfg)(build_model(cfg.model, vocabs.info))
    assert sources == list(read_lines(f"{cfg.data.out_dir}/valid.src.txt"))
    assert 0 < score < 100
    assert score == corpus_scores(hyps, refs, metrics=("bleu",))[0].score


@pytest.mark.parametrize("decode", [{"sampling": True, "temperature": 5.0}, {"nbest": 4},
                                    {"precision": "int8"}, {"beam": 7}, {"workers": 2}])
def test_validation_decodes_by_beam_search_in_full_precision_whatever_decode_says(
        cfg, monkeypatch, decode):
    """Before: validation sampled, or wrote 4-best lists, or decoded in int8, or forked the
    training process into decode.workers (on a GPU: stopped the run with an error)."""
    real, calls = Translator.translate_text, []

    def translate_text(self, lines, **options):
        calls.append(options)
        return real(self, lines, **options)

    monkeypatch.setattr(Translator, "translate_text", translate_text)
    vocabs = load_vocabularies(cfg.data.out_dir)
    other = cfg.model_copy(update={"decode": cfg.decode.model_copy(update=decode)})
    validation_bleu(other)(build_model(cfg.model, vocabs.info))
    [options] = calls
    assert {k: options[k] for k in ("beam", "nbest", "sampling", "precision", "workers")} == {
        "beam": 2, "nbest": 1, "sampling": False, "precision": "fp32", "workers": 1
    }  # train.valid_beam 2


@pytest.mark.parametrize("keep_heap", [True, False])
def test_validation_leaves_the_heap_as_training_set_it(cfg, monkeypatch, keep_heap):
    """Before: validation decoded with decode.keep_heap (true), which kept freed memory in
    glibc's heap for the rest of a run that asked for train.keep_heap: false."""
    calls = []
    monkeypatch.setattr("xinda.decode.translator.keep_freed_heap", lambda: calls.append(1))
    vocabs = load_vocabularies(cfg.data.out_dir)
    model = build_model(cfg.model, vocabs.info)
    run = cfg.model_copy(update={"train": cfg.train.model_copy(update={"keep_heap": keep_heap})})
    validation_bleu(run)(model)
    assert bool(calls) is keep_heap


def test_none_when_no_validation_bleu_is_asked_for(cfg):
    for off in ({"valid_bleu": False}, {"run_validation": False}):
        assert validation_bleu(cfg.model_copy(update={"train": cfg.train.model_copy(
            update=off)})) is None


def test_none_without_a_validation_split(tmp_path):
    cfg = experiment(tmp_path, with_valid=False)
    prepare(cfg.data, log=lambda _: None)
    assert validation_bleu(cfg) is None


def test_chinese_targets_are_scored_with_the_zh_tokenizer():
    assert bleu_tokenizer("zh") == "zh" and bleu_tokenizer("zh-Hans") == "zh"
    assert bleu_tokenizer("en") is None and bleu_tokenizer("digits") is None


def test_trainer_warns_when_bleu_is_asked_for_but_no_scorer_given(cfg, caplog):
    with caplog.at_level(logging.WARNING, logger="xinda"):
        Trainer(cfg)
    assert "train.valid_bleu is on but no BLEU scorer was given" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="xinda"):
        Trainer(cfg, valid_bleu=validation_bleu(cfg))
    assert "no BLEU scorer" not in caplog.text


def test_the_trainer_logs_the_scorers_bleu(cfg, tmp_path):
    calls = []

    def fake_bleu(model) -> float:
        calls.append(model.training)
        return 42.0

    train = cfg.train.model_copy(update={"out_dir": str(tmp_path / "m"), "max_epochs": 1})
    Trainer(cfg.model_copy(update={"train": train}), valid_bleu=fake_bleu).train()
    assert calls == [False]  # once, at the epoch's end, in eval mode
    with open(tmp_path / "m" / "log.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["valid_bleu"]) for r in rows if r["valid_bleu"]] == [42.0]
    stats = json.loads((tmp_path / "m" / "train_stats.json").read_text())
    [valid] = [r for r in rows if r["valid_loss"]]  # at the training seconds so far; the
    assert 0 < float(valid["elapsed_s"]) <= stats["train_seconds"]  # epoch's checkpoint follows


def test_the_validation_loss_is_the_per_token_mean_over_all_batches(cfg):
    """Guards corpus_loss's divisor: the validation loss and NLL are sums over every target
    token (EOS included) of the split, over their count, whatever the batching (here 80-token
    batches of different sizes); recomputed sentence by sentence with torch's loss."""
    train = cfg.train.model_copy(update={"max_tokens": 80, "label_smoothing": 0.2,
                                         "precision": "fp32"})
    trainer = Trainer(cfg.model_copy(update={"train": train}))
    scores = trainer.validate()
    src, tgt = load_split(cfg.data.out_dir, "valid")
    batches = make_batches(src.lengths, tgt.lengths, 80, 0, 0, shuffle=False)
    assert 1 < len(batches) < len(src.lengths)
    vocab, loss, nll, tokens = trainer.vocab, 0.0, 0.0, 0
    with torch.no_grad():
        for i in range(len(src.lengths)):
            sentence = torch.tensor([*src[i].tolist(), vocab.eos])
            prev = torch.tensor([vocab.bos, *tgt[i].tolist()])
            target = torch.tensor([*tgt[i].tolist(), vocab.eos])
            logits = trainer.model(sentence[None], prev[None])[0]
            loss += float(F.cross_entropy(logits, target, label_smoothing=0.2, reduction="sum"))
            nll += float(F.cross_entropy(logits, target, reduction="sum"))
            tokens += len(target)
    assert scores["loss"] == pytest.approx(loss / tokens, rel=1e-5)
    assert scores["nll"] == pytest.approx(nll / tokens, rel=1e-5)

def word_experiment(root, lowercase: bool) -> tuple[ExperimentConfig, list[str]]:
    """A prepared corpus of multi-word targets ("The Red Blue Car!") and its 10 validation
    targets as written."""
    words = ["Red", "Blue", "Green", "Big", "Small", "Old", "New", "Fast"]
    pairs = [(f"{i} {j}", f"The {words[i % 8]} {words[j % 8]} Car!") for i in range(9)
             for j in range(9)]
    for split, chunk in (("train", pairs), ("valid", pairs[:10])):
        (root / f"{split}.src").write_text("".join(f"{s}\n" for s, _ in chunk))
        (root / f"{split}.tgt").write_text("".join(f"{t}\n" for _, t in chunk))
    cfg = ExperimentConfig.model_validate({
        "data": {"src_lang": "src", "tgt_lang": "tgt", "train": str(root / "train"),
                 "valid": str(root / "valid"), "out_dir": str(root / "bin"),
                 "vocab_size": 40, "lowercase": lowercase, "max_len_ratio": 20},
        "model": TINY, "train": {"out_dir": str(root / "model"), "progress": False}})
    prepare(cfg.data, log=lambda _: None)
    return cfg, [t for _, t in pairs[:10]]


def test_a_perfect_model_scores_100_when_targets_are_lowercased(tmp_path, monkeypatch):
    """Before: the references kept their case (and full-width punctuation under NFKC) while
    the model learned cleaned targets: a perfect model scored 24 BLEU on lowercased Tatoeba."""
    cfg, targets = word_experiment(tmp_path, lowercase=True)
    perfect = [t.lower() for t in targets]  # what a model of the cleaned targets writes
    monkeypatch.setattr(Translator, "translate_text", lambda self, lines, **_: perfect)
    vocabs = load_vocabularies(cfg.data.out_dir)
    assert validation_bleu(cfg)(build_model(cfg.model, vocabs.info)) == pytest.approx(100.0)


def test_validation_bleu_decodes_in_fp32_when_training_in_bf16(cfg, tmp_path):
    """Before: the trainer wrapped the scorer in the training autocast, and the scorer's own
    fp32 (no autocast) did not switch it off, so best.safetensors was picked by bf16 search."""
    train = cfg.train.model_copy(update={"out_dir": str(tmp_path / "m"), "precision": "bf16"})
    trainer = Trainer(cfg.model_copy(update={"train": train}), valid_bleu=validation_bleu(cfg))
    layer = next(m for m in trainer.model.modules() if isinstance(m, torch.nn.Linear))
    autocast_on: list[bool] = []
    layer.register_forward_pre_hook(
        lambda *_: autocast_on.append(torch.is_autocast_enabled("cpu")))
    scorer = trainer.valid_bleu

    def scored(model) -> float:
        autocast_on.clear()
        return scorer(model)

    trainer.valid_bleu = scored
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as around a training step
        trainer.validate()
    assert autocast_on and not any(autocast_on)
