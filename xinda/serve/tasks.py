"""One library call per batch, and its results as JSON.

A runner takes the options the batch's jobs share and all their inputs (concatenated), makes one
``Translator.translate`` / ``write_couplets`` / ``write_poems`` call and returns one result per
input, in order; the worker splits them back to the jobs. ``work`` bounds what a job may cost
the decoder before it is queued.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from xinda.apps.generate import (
    Output,
    PoemPrompt,
    write_couplets,
    write_poems,
)
from xinda.apps.poetry import source_text, template
from xinda.decode.constraints import Constraint, length_bounds
from xinda.decode.search import max_lengths
from xinda.decode.translator import Translation, Translator
from xinda.evaluate.generation import poem_lines

ATTENTION_DIGITS = 4
Line = tuple[str, str | None]  # a text to translate and its target prefix (None: none)


def translate(translator: Translator, options: dict, inputs: Sequence[Line]
              ) -> list[list[Translation]]:
    """``options``: {"decode": DecodeConfig fields, "constraints": constraints_for keywords
    (without prefixes), "attention": bool}; a prefix applies to its own line only."""
    lines = [line for line, _ in inputs]
    return translator.translate(lines, constraints=constraints(translator, options, inputs),
                                need_attention=options["attention"], **options["decode"])


def constraints(translator: Translator, options: dict, inputs: Sequence[Line]
                ) -> list[Constraint]:
    """The constraints of a translate job's lines (a prefix applies to its own line only)."""
    lines = [line for line, _ in inputs]
    prefixes = [prefix or "" for _, prefix in inputs] if any(p for _, p in inputs) else None
    return translator.constraints_for(lines, prefixes, **options["constraints"])


def couplets(translator: Translator, options: dict, inputs: Sequence[str]) -> list[list[Output]]:
    """``options``: write_couplets keywords (nbest, no_copy, tone)."""
    return write_couplets(translator, inputs, **options)


def poems(translator: Translator, options: dict, inputs: Sequence[PoemPrompt]
          ) -> list[list[Output]]:
    """``options``: write_poems keywords (nbest, rhyme)."""
    return write_poems(translator, inputs, **options)


RUNNERS: dict[str, Callable[[Translator, dict, Sequence[Any]], list]] = {
    "translate": translate, "couplet": couplets, "poem": poems}


def cost(translator: Translator, kind: str, inputs: Sequence[Any]) -> int:
    """The source tokens of a job's inputs (for the batch's token budget)."""
    if kind == "translate":
        limit = translator.source_limit(translator.cfg.decode)  # longer sources are cut
        return sum(min(len(translator.source_ids(line, False)), limit) + 1 for line, _ in inputs)
    if kind == "poem":
        return sum(len(source_text(p.form, p.keywords or tuple(p.acrostic))) + 1 for p in inputs)
    return sum(len(line) + 1 for line in inputs)


def translate_measures(translator: Translator, options: dict, inputs: Sequence[Line]
                       ) -> tuple[int, int]:
    """A translate job's most decoder row-steps and the attention weights its response may
    carry (0 unless asked), from one pass over its lines. Per line, with its output length
    limit L incl. EOS (as ``search._output_limits`` sets it) and S source tokens + EOS:
    rows (beam, or samples) x L steps, and outputs (n-best or samples) x L x S weights; empty
    lines are not decoded."""
    dec = translator.decode_settings(options["decode"])
    limit = translator.source_limit(dec)
    sizes = torch.tensor([min(len(translator.source_ids(line, False)), limit)
                          for line, _ in inputs])
    cap = translator.model.cfg.max_positions  # output tokens + EOS (search._output_limits)
    limits = max_lengths(sizes + 1, dec.max_len_a, dec.max_len_b, cap)
    _, limits = length_bounds(constraints(translator, options, inputs), limits, cap)
    sources = torch.where(sizes > 0, sizes + 1, 0)
    rows = dec.samples if dec.sampling else dec.beam
    asked = options.get("attention") and translator.model.has_attention  # (else: null)
    outputs = (dec.samples if dec.sampling else dec.nbest) if asked else 0
    return rows * int(limits[sources > 0].sum()), outputs * int((limits * sources).sum())


def translate_work(translator: Translator, options: dict, inputs: Sequence[Line]) -> int:
    """Decoder row-steps a translate job may take (``translate_measures``)."""
    return translate_measures(translator, options, inputs)[0]


def couplet_work(translator: Translator, options: dict, inputs: Sequence[str]) -> int:
    """Decoder row-steps a couplet job may take: beam max(nbest, decode.beam) rows
    (``write_couplets``) of at most two tokens per character + EOS (``CoupletRules``)."""
    rows = max(options.get("nbest", 1), translator.cfg.decode.beam)
    cap = translator.model.cfg.max_positions  # output tokens + EOS (search._output_limits)
    return rows * sum(min(2 * len("".join(up.split())) + 1, cap) for up in inputs)


def poem_work(translator: Translator, options: dict, inputs: Sequence[PoemPrompt]) -> int:
    """Decoder row-steps a poem job may take: beam max(nbest, decode.beam) rows
    (``write_poems``) of at most two tokens per position of the poem's template + EOS."""
    rows = max(options.get("nbest", 1), translator.cfg.decode.beam)
    cap = translator.model.cfg.max_positions
    return rows * sum(min(2 * template(p.form, len(p.acrostic) or 4)[1] + 1, cap)
                      for p in inputs)


WORK: dict[str, Callable[[Translator, dict, Sequence[Any]], int]] = {
    "translate": translate_work, "couplet": couplet_work, "poem": poem_work}


def work(translator: Translator, kind: str, options: dict, inputs: Sequence[Any]) -> int:
    """The decoder row-steps a job may take at most (0 for kinds without a measure)."""
    measure = WORK.get(kind)
    return measure(translator, options, inputs) if measure else 0


def finite(score: float) -> float | None:
    """JSON has no infinities: a score that is not finite is null."""
    return score if math.isfinite(score) else None


def translation_json(source: str, nbest: list[Translation], attention: bool) -> dict:
    """One entry of /v1/translate's "translations"."""
    error = nbest[0].error if nbest else "no output"
    hyps = [] if error else [hypothesis_json(t, attention) for t in nbest]
    return {"source": source, "nbest": hyps, "error": error,
            "truncated_from": nbest[0].truncated_from if nbest else None}


def hypothesis_json(t: Translation, attention: bool) -> dict:
    out = {"text": t.text, "score": finite(t.score), "source_pieces": t.source_pieces,
           "target_pieces": t.target_pieces}
    if attention:
        out["attention"] = None if t.attention is None else \
            t.attention.double().round(decimals=ATTENTION_DIGITS).tolist()
    return out


def couplet_json(source: str, outputs: list[Output]) -> dict:
    """One entry of /v1/couplet's "couplets"."""
    good = [{"text": o.text, "score": finite(o.score)} for o in outputs if not o.error]
    error = None if good else next((o.error for o in outputs), "no output")
    return {"source": source, "nbest": good, "error": error}


def poem_json(outputs: list[Output]) -> tuple[list[dict], str | None]:
    """/v1/poem's "poems" and "error"."""
    good = [{"text": o.text, "lines": poem_lines(o.text), "score": finite(o.score)}
            for o in outputs if not o.error]
    return good, None if good else next((o.error for o in outputs), "no output")
