"""The Python API: ``Translator.load(model_dir).translate(["..."], beam=5)``.

Input lines go through the model directory's own pre-processing (normalisation,
pre-tokenisation, sentencepiece), are batched by length, decoded, restored to input order and
detokenised. N lines in always give N lines out: an empty line translates to empty lines (one
per n-best entry or sample), and an over-long line is truncated (with a warning) to what the
model's position table holds, never dropped. A line for which the search finds no output that
satisfies the caller's constraints (an empty line too, when they ask for a non-empty output)
gets one Translation with ``text=""`` and ``error`` set (the search does not look ahead: a
wider beam may find one)."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from pydantic import ValidationError

from xinda.checkpoint import default_weights, load_weights
from xinda.config import DecodeConfig, ExperimentConfig, format_validation_error, load_config
from xinda.data.manifest import Vocabularies, load_vocabularies
from xinda.data.text import SPACE_MARK
from xinda.data.vocab import UNK_SURFACE, WORD_START
from xinda.decode.constraints import (
    BanSourceTokens,
    BanTokens,
    Constraint,
    ExactLength,
    NoRepeatNgram,
    TargetPrefix,
    reindex,
)
from xinda.decode.ensemble import Ensemble, check_same_vocabularies
from xinda.decode.options import (
    check_constraints,
    check_format,
    check_model_dir,
    check_sampling_options,
    warn_unknown_pieces,
)
from xinda.decode.sampling import SamplingConfig, sample
from xinda.decode.search import Hypothesis, beam_search, greedy_search
from xinda.decode.workers import map_in_workers
from xinda.device import autocast, check_device, keep_freed_heap, pick_precision
from xinda.errors import XindaError
from xinda.models.base import Seq2SeqModel
from xinda.models.quantize import quantize_int8
from xinda.models.registry import build_model, resolve
from xinda.utils import check_lines, is_whole

log = logging.getLogger("xinda")
UNSATISFIABLE = "the search found no output that satisfies the constraints"


@dataclass
class Translation:
    text: str  # detokenised output (or pieces, with output_format="pieces")
    score: float  # log-probability / length penalty + coverage penalty (ranks the n-best)
    source_pieces: list[str]
    target_pieces: list[str]
    attention: torch.Tensor | None = None  # (len(target)+1, len(source)+1) incl. EOS
    error: str | None = None  # why there is no output (then text is ""), e.g. UNSATISFIABLE
    truncated_from: int | None = None  # the source's token count when it was cut to fit


def _load_model(model_dir: Path, vocabs: Vocabularies,
                checkpoint: str | Path | None) -> Seq2SeqModel:
    """The model of a trained model directory with its weights."""
    config = model_dir / "config.yaml"
    model = build_model(resolve(load_config(config).model, str(config)), vocabs.info)
    load_weights(model, checkpoint or default_weights(model_dir))
    return model


class Translator:
    """A model with its vocabularies and text pipelines; decode settings from ``cfg.decode``."""

    def __init__(self, model: Seq2SeqModel, cfg: ExperimentConfig, vocabs: Vocabularies):
        self.model, self.cfg, self.vocabs = model.eval(), cfg, vocabs
        self.src_text, self.tgt_text = vocabs.src_text, vocabs.tgt_text
        self.src_vocab, self.tgt_vocab = vocabs.src, vocabs.tgt
        self.device = next(model.parameters()).device
        # the int8 copy, made on first use, and what it was made from (see int8_model)
        self._int8, self._int8_made_from = None, ()

    @classmethod
    def load(cls, model_dir: str | Path, checkpoint: str | Path | None = None,
             device: str = "cpu", ensemble: Sequence[str | Path] = ()) -> Translator:
        """Load a trained model directory (config, vocabularies and weights); with
        ``ensemble`` (more model directories, same vocabularies) the models decode together
        (``xinda.decode.ensemble``), with the first one's config and text pipelines;
        ``checkpoint`` replaces the first one's weights only."""
        if not isinstance(model_dir, (str, os.PathLike)):
            raise XindaError(f"model_dir: expected a folder, got {type(model_dir).__name__}")
        if isinstance(ensemble, (str, Path)):
            raise XindaError(f"ensemble={str(ensemble)!r}: give a list of model directories")
        check_device(str(device), "device")
        dirs = [Path(model_dir), *map(Path, ensemble)]
        for folder in dirs:
            check_model_dir(folder)
        cfg = load_config(dirs[0] / "config.yaml")
        vocabs = [load_vocabularies(d) for d in dirs]
        check_same_vocabularies(dirs, vocabs)
        models = [_load_model(d, v, checkpoint if i == 0 else None)
                  for i, (d, v) in enumerate(zip(dirs, vocabs))]
        model = models[0] if len(models) == 1 else Ensemble(models)
        return cls(model.to(device), cfg, vocabs[0])

    def source_ids(self, line: str, pieces_in: bool, where: str = "input") -> list[int]:
        """One input line -> its source ids (no EOS, not truncated)."""
        if pieces_in:
            return self.src_vocab.line_to_ids(line, where, source=True)
        text = self.src_text.preprocess(line)
        return self.src_vocab.encode(text) if text else []

    def source_limit(self, dec: DecodeConfig) -> int:
        """The source tokens (EOS not counted) a line keeps: ``dec.max_input_len``, and no more
        than the model's position table (an ensemble's smallest) holds with the EOS."""
        return min(dec.max_input_len, self.model.cfg.max_positions - 1)

    def encode_source(self, line: str, pieces_in: bool, limit: int | None = None,
                      where: str = "input") -> list[int] | None:
        """One input line -> source ids + EOS, truncated to ``limit`` tokens (default
        ``source_limit`` of the model's decode settings); None for a line with nothing left to
        translate after cleaning (blank, or control characters only)."""
        ids = self.source_ids(line, pieces_in, where)
        if not ids:
            return None
        limit = limit or self.source_limit(self.cfg.decode)
        if len(ids) > limit:
            log.warning("%s: %d tokens truncated to %d: %r...", where, len(ids), limit, line[:40])
            ids = ids[:limit]
        return ids + [self.src_vocab.eos]

    def translate(self, lines: list[str], input_format: str = "text",
                  output_format: str = "text", need_attention: bool = False,
                  constraints: Sequence[Constraint] = (), sampler: SamplingConfig | None = None,
                  **options) -> list[list[Translation]]:
        """Translate ``lines``; returns, for each line, its n-best list (best first).

        ``options`` override fields of the model's ``DecodeConfig`` (beam, alpha, coverage,
        nbest, max_len_a, max_len_b, batch_size, precision; the sampling ones only with
        sampling on). input/output_format "pieces" reads/writes sentencepiece pieces.
        ``constraints`` index sentences by their position in ``lines`` (``constraints_for``);
        a line the search finds no output for gets one Translation with ``error`` set (its
        text ""). ``sampler`` draws ``sampler.n`` samples per line instead of beam search
        (ranked by score; reproducible for the same lines, batch size and seed); without it,
        the model's ``decode.sampling`` settings decide."""
        pieces_in = check_format("input_format", input_format) == "pieces"
        check_format("output_format", output_format)
        lines = check_lines(lines)
        warn_unknown_pieces(lines, pieces_in, self.src_vocab)
        constraints = check_constraints(constraints, len(lines))
        dec = self.decode_settings(options)
        check_sampling_options(options, dec, sampler)
        sampling = sampler or SamplingConfig.from_decode(dec)
        limit = self.source_limit(dec)
        sources = [self.encode_source(line, pieces_in, limit, f"line {i}")
                   for i, line in enumerate(lines, start=1)]
        results: list[list[Translation]] = [[] for _ in lines]
        order = sorted((i for i, s in enumerate(sources) if s), key=lambda i: len(sources[i]))
        generator = None if sampling is None else sampling.generator(self.device)
        chunks = [order[start:start + dec.batch_size]
                  for start in range(0, len(order), dec.batch_size)]

        def decode_chunk(k: int) -> list[list[Hypothesis]]:
            search = functools.partial(self._search, dec=dec, need_attention=need_attention,
                                       constraints=reindex(constraints, chunks[k]),
                                       sampling=sampling, generator=generator)
            return self._decode_batch([sources[i] for i in chunks[k]], dec, search)

        # longest batches first (no worker ends on a long one); sampling: one generator, in order
        handed_out = range(len(chunks)) if sampling else range(len(chunks) - 1, -1, -1)
        decoded = map_in_workers(decode_chunk, handed_out, self._workers(dec, sampling))
        for k, chunk in enumerate(chunks):
            for i, hyps in zip(chunk, decoded[k]):
                results[i] = [self._finish(h, sources[i], output_format) for h in hyps] or [
                    Translation("", float("-inf"), self._source_pieces(sources[i]), [],
                                error=UNSATISFIABLE)]
        for i, s in enumerate(sources):
            if s is None:  # empty line in -> empty lines out (as many as n-best or samples)
                results[i] = empty_translations(i, constraints,
                                                sampling.n if sampling else dec.nbest)
            elif len(s) > limit:  # at the limit (+ EOS): was it cut?
                full = len(self.source_ids(lines[i], pieces_in))
                if full > limit:
                    results[i] = [replace(t, truncated_from=full) for t in results[i]]
        return results

    def decode_settings(self, options: dict) -> DecodeConfig:
        """The model's ``DecodeConfig`` with ``options`` applied; a bad value is a one-line
        XindaError naming the setting (``decode.beam: ...``). An ``nbest`` above the beam
        widens the beam to it (beam search finds at most beam hypotheses), as the apps do."""
        try:
            dec = DecodeConfig.model_validate({**self.cfg.decode.model_dump(), **options})
        except ValidationError as err:
            raise XindaError(format_validation_error(err, "", "decode")) from None
        if not dec.sampling and dec.nbest > dec.beam:
            dec.beam = dec.nbest
        return dec

    def _workers(self, dec: DecodeConfig, sampling: SamplingConfig | None) -> int:
        """``decode.workers``, checked; with more than one, the model is quantised (for int8)
        before the workers are forked, so that they share it."""
        if dec.workers > 1:
            if sampling is not None:
                raise XindaError("decode.workers > 1 decodes batches out of order, and sampling "
                                 "draws them from one generator in order: use --workers 1 "
                                 "(decode.workers=1)")
            if self.device.type != "cpu":
                raise XindaError(f"decode.workers > 1 runs on CPU, not {self.device.type}")
            if pick_precision(dec.precision, self.device) == "int8":
                self.int8_model(dec.int8_scale)
        return dec.workers

    def translate_text(self, lines: list[str], **options) -> list[str]:
        """Convenience: the best translation of each line as a string."""
        return [nbest[0].text for nbest in self.translate(lines, **options)]

    @torch.inference_mode()
    def _decode_batch(self, batch: list[list[int]], dec: DecodeConfig,
                      search: Callable[[torch.Tensor, Seq2SeqModel], list[list[Hypothesis]]]
                      ) -> list[list[Hypothesis]]:
        src = torch.full((len(batch), max(map(len, batch))), self.src_vocab.pad, dtype=torch.long)
        for row, ids in enumerate(batch):
            src[row, : len(ids)] = torch.tensor(ids)
        src = src.to(self.device)
        if dec.keep_heap and self.device.type == "cpu":
            keep_freed_heap()
        precision = pick_precision(dec.precision, self.device)
        model = self.int8_model(dec.int8_scale) if precision == "int8" else self.model
        with autocast(precision, self.device):
            return search(src, model)

    def int8_model(self, scale: str | None = None) -> Seq2SeqModel:
        """The int8 copy (``decode.precision: int8``; CPU only); default ``decode.int8_scale``."""
        if self.device.type != "cpu":
            raise XindaError(f"decode.precision int8 runs on CPU, not {self.device.type}")
        scale = scale or self.cfg.decode.int8_scale
        # made again when the weights changed in place (load_weights, an optimizer step):
        # their version counters (writes through ``.data`` do not count them)
        made_from = (scale, *((id(p), p._version, p.dtype) for p in self.model.parameters()))
        if self._int8 is None or self._int8_made_from != made_from:
            self._int8, self._int8_made_from = quantize_int8(self.model, scale), made_from
        return self._int8

    def _search(self, src: torch.Tensor, model: Seq2SeqModel, dec: DecodeConfig,
                need_attention: bool,
                constraints: Sequence[Constraint], sampling: SamplingConfig | None,
                generator: torch.Generator | None) -> list[list[Hypothesis]]:
        if sampling is not None:
            return sample(model, src, dec, sampling, need_attention, constraints, generator)
        if dec.beam == 1 and dec.nbest == 1 and not dec.coverage:
            hyps = greedy_search(model, src, dec, need_attention, constraints)
            return [[] if h is None else [h] for h in hyps]
        return beam_search(model, src, dec, need_attention, constraints)

    def constraints_for(self, lines: list[str], prefixes: list[str] | None = None,
                        ban: Sequence[str] = (), no_repeat_ngram: int = 0,
                        ban_source_copy: bool = False, exact_length: int | None = None,
                        input_format: str = "text", prefix_file: str | None = None
                        ) -> list[Constraint]:
        """The constraints ``xinda translate`` offers, built for ``lines``: target
        ``prefixes`` (one per line, text through the target pipeline, or pieces with
        input_format "pieces"; "" = none; errors name ``prefix_file``'s line when given),
        ``ban`` (target pieces or words that are one piece; blanks ignored), no repeated
        n-grams of that size (0: off), no copied source tokens, an exact output length."""
        check_format("input_format", input_format)
        lines, ban = check_lines(lines), check_lines(ban, "ban")  # (one string: refused)
        prefixes = None if prefixes is None else check_lines(prefixes, "prefixes")
        for name, size in (("no_repeat_ngram", no_repeat_ngram), ("exact_length", exact_length)):
            if size is not None and (not is_whole(size) or size < 0):
                raise XindaError(f"{name} must be >= 0 (a whole number), got {size!r}")
        out: list[Constraint] = []
        if prefixes is not None:
            if len(prefixes) != len(lines):
                raise XindaError(f"{len(prefixes)} target prefixes for {len(lines)} lines")
            where = [f"{prefix_file}:{i}" if prefix_file else f"prefix {i}"
                     for i in range(1, len(prefixes) + 1)]
            out.append(TargetPrefix([self.prefix_ids(w, p, input_format == "pieces")
                                     for w, p in zip(where, prefixes)]))
        if words := [w.strip() for w in ban if w.strip()]:
            out.append(BanTokens([i for word in words for i in self.target_tokens(word)]))
        if no_repeat_ngram:
            out.append(NoRepeatNgram(int(no_repeat_ngram)))
        if ban_source_copy:
            # every source token, also past a cut (translate's limit may differ from
            # this config's): at worst a token the decoder did not see is banned too
            sources = [self.source_ids(line, input_format == "pieces", f"line {i}")
                       for i, line in enumerate(lines, start=1)]
            copies = [self.copy_ids(s) for s in sources]
            out.append(BanSourceTokens(copies, self.model.vocab))
        if exact_length is not None:
            if exact_length >= self.model.cfg.max_positions:
                raise XindaError(f"exact length {exact_length}: this model writes at most "
                                 f"{self.model.cfg.max_positions - 1} tokens (its position "
                                 "table)")
            out.append(ExactLength([int(exact_length)] * len(lines)))
        return out

    def prefix_ids(self, where: str, prefix: str, pieces_in: bool) -> list[int]:
        """A target prefix's ids; one the target vocabulary cannot write (it would force
        ``<unk>`` where it was not asked for by name) is a XindaError naming what it lacks, and
        so is one longer than the model writes (the search found no output, and said only
        that)."""
        ids, unk = self.encode_target(prefix, pieces_in, where), self.tgt_vocab.unk
        if len(ids) >= (cap := self.model.cfg.max_positions):
            raise XindaError(f"{where}: a prefix of {len(ids)} tokens; this model writes at "
                             f"most {cap - 1} (its position table)")
        if unk not in ids:
            return ids
        named = self.tgt_vocab.ids_to_pieces([unk])[0]
        parts = prefix.split() if pieces_in else list(dict.fromkeys(prefix.replace(" ", "")))
        unknown = [p for p in parts if p != named and unk in self.encode_target(p, pieces_in)]
        if not unknown and not pieces_in:  # each character is known alone, not as written:
            unknown = [" "] if " " in prefix.strip() else [prefix]  # (char targets: "␣")
        if unknown:
            raise XindaError(f"{where}: {' '.join(unknown)!r} not in the target "
                             "vocabulary (the output would start with <unk>)")
        return ids

    def encode_target(self, line: str, pieces_in: bool = False, where: str = "target"
                      ) -> list[int]:
        """Target-side text (or pieces) -> target ids, without BOS/EOS."""
        if pieces_in:
            return self.tgt_vocab.line_to_ids(line, where, source=False)
        text = self.tgt_text.preprocess(line)
        return self.tgt_vocab.encode(text) if text else []

    def target_tokens(self, word: str) -> list[int]:
        """The target ids that spell ``word`` in one piece: the piece ``word`` itself and the
        one piece the target pipeline makes of the word (e.g. "▁word"), where they exist."""
        unk = self.tgt_vocab.unk
        unk_piece = self.tgt_vocab.ids_to_pieces([unk])[0]  # "<unk>" itself may be banned
        ids = {i for i in self.tgt_vocab.pieces_to_ids([word]) if i != unk or word == unk_piece}
        if special := ids & {self.tgt_vocab.bos, self.tgt_vocab.eos, self.tgt_vocab.pad}:
            raise XindaError(f"cannot ban {word!r}: it is a control token of the search "
                             f"(id {min(special)}), not a word of the output")
        encoded = self.encode_target(word)
        if len(encoded) == 1 and encoded[0] != unk:
            ids.add(encoded[0])
        if not ids:
            pieces = " ".join(self.tgt_vocab.ids_to_pieces(encoded))
            raise XindaError(f"cannot ban {word!r}: it is not one target piece ({pieces!r})")
        return sorted(ids)

    def copy_ids(self, source_ids: Sequence[int]) -> list[int]:
        """The target ids that would copy the source ``source_ids``: each of its word pieces
        itself or, where the target is written in characters (char and jieba pre-tokenisation:
        detokenising drops the spaces between them), every target piece holding one of its
        characters. Never the bare "▁", which starts any word the vocabulary spells in parts,
        nor pieces named for no text: <unk>, bytes (<0xE6>: of many characters)."""
        src = self.src_vocab.sp
        if self.tgt_text.pretok in ("char", "jieba"):  # (decoding joins bytes into characters)
            chars = set(self.src_vocab.decode(list(source_ids))) - {WORD_START, SPACE_MARK,
                                                                    " ", UNK_SURFACE}
            ids = {i for char in chars for i in self._pieces_with_character.get(char, ())}
        else:
            pieces = {src.id_to_piece(i) for i in source_ids if i < self.src_vocab.pieces and
                      not (src.is_control(i) or src.is_unknown(i) or src.is_byte(i))}
            ids = set(self.tgt_vocab.pieces_to_ids(sorted(pieces - {WORD_START})))
        return sorted(ids - {self.tgt_vocab.unk})

    @functools.cached_property
    def _pieces_with_character(self) -> dict[str, list[int]]:
        """Character -> the target pieces that write it (specials, bytes and "▁" aside)."""
        sp, index = self.tgt_vocab.sp, {}
        for i in range(self.tgt_vocab.pieces):
            if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i)):
                for char in set(sp.id_to_piece(i)) - {WORD_START}:
                    index.setdefault(char, []).append(i)
        return index

    def _source_pieces(self, src_ids: list[int] | None) -> list[str]:
        return self.src_vocab.labels(src_ids[:-1]) if src_ids else []  # one per column

    def _finish(self, hyp: Hypothesis, src_ids: list[int], output_format: str) -> Translation:
        pieces = self.tgt_vocab.ids_to_pieces(hyp.tokens)
        if output_format == "pieces":
            text = " ".join(pieces)
        else:
            text = self.tgt_text.postprocess(self.tgt_vocab.decode(hyp.tokens))
        # a copy: the slice is a view of the whole batch's beam history, which it would keep
        attn = (None if hyp.attention is None
                else hyp.attention[:, : len(src_ids)].to("cpu", copy=True))
        return Translation(text, hyp.score, self._source_pieces(src_ids), pieces, attn)


def empty_translations(line: int, constraints: Sequence[Constraint], n: int
                       ) -> list[Translation]:
    """The outputs of an empty input line: ``n`` empty ones, or one without output
    (``UNSATISFIABLE``) when one of the ``constraints`` asks that line for a token or more."""
    if any(c.min_length(line) for c in constraints):
        return [Translation("", float("-inf"), [], [], error=UNSATISFIABLE)]
    return [Translation("", 0.0, [], []) for _ in range(n)]
