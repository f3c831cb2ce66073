"""Validation BLEU for the training loop. It translates with ``xinda.decode`` and scores with
sacreBLEU, so it is built here, above both, and handed to ``Trainer`` as a callable."""

from __future__ import annotations

from pathlib import Path

from xinda.config import ExperimentConfig
from xinda.data.manifest import load_manifest, load_vocabularies
from xinda.decode.translator import Translator
from xinda.evaluate.metrics import corpus_scores
from xinda.models.base import Seq2SeqModel
from xinda.train.trainer import ValidBleu
from xinda.utils import read_lines


def bleu_tokenizer(tgt_lang: str) -> str | None:
    """sacreBLEU's tokenizer for a target language: "zh" for Chinese, else its default."""
    return "zh" if tgt_lang.startswith("zh") else None


def validation_bleu(cfg: ExperimentConfig, data_dir: str | Path | None = None) -> ValidBleu | None:
    """model -> BLEU of its translations of the prepared validation set (beam
    ``train.valid_beam``) against its references cleaned like the training targets, or None
    when the config asks for no validation BLEU or the data has no validation split."""
    tc = cfg.train
    data_dir = Path(data_dir or cfg.data.out_dir)
    manifest = load_manifest(data_dir)
    if not (tc.run_validation and tc.valid_bleu and "valid" in manifest["splits"]):
        return None
    vocabs = load_vocabularies(data_dir, manifest)
    sources = list(read_lines(data_dir / "valid.src.txt"))
    # the references as the target side was cleaned for training (normalisation,
    # lowercasing), so that a perfect model scores 100: this score picks checkpoints
    refs = [vocabs.tgt_text.clean(line) for line in read_lines(data_dir / "valid.tgt.txt")]
    tokenize = bleu_tokenizer(manifest["tgt_lang"])

    def score(model: Seq2SeqModel) -> float:
        # beam search in full precision in this process (on its device), whatever
        # decode.sampling / nbest / precision / workers say, and leaving glibc's heap as
        # training set it
        hyps = Translator(model, cfg, vocabs).translate_text(
            sources, beam=tc.valid_beam, nbest=1, sampling=False, precision="fp32",
            keep_heap=tc.keep_heap, workers=1)
        hyps = [vocabs.tgt_text.clean(h) for h in hyps]  # normalised as the references are
        return corpus_scores(hyps, refs, metrics=("bleu",), tokenize=tokenize)[0].score

    return score
