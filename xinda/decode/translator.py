"""The Python API: ``Translator.load(model_dir).translate(["..."], beam=5)``.

Input lines go through the model directory's own pre-processing (normalisation,
pre-tokenisation, sentencepiece), are batched by length, decoded, restored to input order and
detokenised. N lines in always give N lines out: an empty line translates to an empty line, and
an over-long line is truncated (with a warning), never dropped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from xinda.checkpoint import default_weights, load_weights
from xinda.config import DecodeConfig, ExperimentConfig, load_config
from xinda.data.manifest import Vocabularies, load_vocabularies
from xinda.decode.search import Hypothesis, beam_search, greedy_search
from xinda.device import autocast, pick_precision
from xinda.models.base import Seq2SeqModel
from xinda.models.registry import build_model

log = logging.getLogger("xinda")


@dataclass
class Translation:
    text: str  # detokenised output (or pieces, with output_format="pieces")
    score: float  # length-normalised log-probability
    source_pieces: list[str]
    target_pieces: list[str]
    attention: torch.Tensor | None = None  # (len(target)+1, len(source)+1) incl. EOS


class Translator:
    """A model with its vocabularies and text pipelines; decode settings from ``cfg.decode``."""

    def __init__(self, model: Seq2SeqModel, cfg: ExperimentConfig, vocabs: Vocabularies):
        self.model, self.cfg, self.vocabs = model.eval(), cfg, vocabs
        self.src_text, self.tgt_text = vocabs.src_text, vocabs.tgt_text
        self.src_vocab, self.tgt_vocab = vocabs.src, vocabs.tgt
        self.device = next(model.parameters()).device

    @classmethod
    def load(cls, model_dir: str | Path, checkpoint: str | Path | None = None,
             device: str = "cpu") -> Translator:
        """Load a trained model directory (config, vocabularies and weights)."""
        model_dir = Path(model_dir)
        cfg = load_config(model_dir / "config.yaml")
        vocabs = load_vocabularies(model_dir)
        model = build_model(cfg.model, vocabs.info)
        load_weights(model, checkpoint or default_weights(model_dir))
        return cls(model.to(device), cfg, vocabs)

    def encode_source(self, line: str, pieces_in: bool) -> list[int] | None:
        """One input line -> source ids + EOS, truncated to ``max_input_len``; None for a line
        with nothing left to translate after cleaning (blank, or control characters only)."""
        if pieces_in:
            ids = self.src_vocab.pieces_to_ids(line.split())
        else:
            text = self.src_text.preprocess(line)
            ids = self.src_vocab.encode(text) if text else []
        if not ids:
            return None
        limit = self.cfg.decode.max_input_len
        if len(ids) > limit:
            log.warning("input of %d tokens truncated to %d: %.40s...", len(ids), limit, line)
            ids = ids[:limit]
        return ids + [self.src_vocab.eos]

    def translate(self, lines: list[str], input_format: str = "text",
                  output_format: str = "text", need_attention: bool = False,
                  **options) -> list[list[Translation]]:
        """Translate ``lines``; returns, for each line, its n-best list (best first).

        ``options`` override fields of the model's ``DecodeConfig`` (beam, alpha, coverage,
        nbest, max_len_a, max_len_b, batch_size, precision). input/output_format "pieces"
        reads/writes sentencepiece pieces.
        """
        dec = DecodeConfig.model_validate({**self.cfg.decode.model_dump(), **options})
        sources = [self.encode_source(line, input_format == "pieces") for line in lines]
        results: list[list[Translation]] = [[] for _ in lines]
        order = sorted((i for i, s in enumerate(sources) if s), key=lambda i: len(sources[i]))
        for start in range(0, len(order), dec.batch_size):
            chunk = order[start:start + dec.batch_size]
            for i, hyps in zip(chunk, self._decode_batch([sources[i] for i in chunk], dec,
                                                         need_attention)):
                results[i] = [self._finish(h, sources[i], output_format) for h in hyps]
        for i, s in enumerate(sources):
            if s is None:  # empty line in -> empty line out
                results[i] = [Translation("", 0.0, [], [])] * dec.nbest
        return results

    def translate_text(self, lines: list[str], **options) -> list[str]:
        """Convenience: the best translation of each line as a string."""
        return [nbest[0].text for nbest in self.translate(lines, **options)]

    @torch.inference_mode()
    def _decode_batch(self, batch: list[list[int]], dec: DecodeConfig,
                      need_attention: bool) -> list[list[Hypothesis]]:
        width = max(len(s) for s in batch)
        src = torch.full((len(batch), width), self.src_vocab.pad, dtype=torch.long)
        for row, ids in enumerate(batch):
            src[row, : len(ids)] = torch.tensor(ids)
        src = src.to(self.device)
        with autocast(pick_precision(dec.precision, self.device), self.device):
            return self._search(src, dec, need_attention)

    def _search(self, src: torch.Tensor, dec: DecodeConfig,
                need_attention: bool) -> list[list[Hypothesis]]:
        if dec.beam == 1 and dec.nbest == 1 and not dec.coverage:
            return [[h] for h in greedy_search(self.model, src, dec, need_attention)]
        return beam_search(self.model, src, dec, need_attention)

    def _finish(self, hyp: Hypothesis, src_ids: list[int], output_format: str) -> Translation:
        pieces = self.tgt_vocab.ids_to_pieces(hyp.tokens)
        if output_format == "pieces":
            text = " ".join(pieces)
        else:
            text = self.tgt_text.postprocess(self.tgt_vocab.decode(hyp.tokens))
        attn = None if hyp.attention is None else hyp.attention[:, : len(src_ids)].cpu()
        return Translation(text, hyp.score, self.src_vocab.ids_to_pieces(src_ids[:-1]), pieces,
                           attn)
