"""Corpus-level metrics (sacreBLEU's BLEU, chrF, TER; ROUGE with rouge-score) and BLEU broken
down by source length.

References are either one stream (``list[str]``, one line per hypothesis) or several streams
(``list[list[str]]``, each stream one line per hypothesis), as in sacreBLEU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import version
from numbers import Integral
from pathlib import Path
from typing import Literal

from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.metrics.base import Metric

from xinda.errors import XindaError
from xinda.evaluate.long_lines import warn_long_lines
from xinda.utils import check_lines, input_name, read_input

Refs = Sequence[str] | Sequence[Sequence[str]]
LengthUnit = Literal["auto", "words", "chars"]

METRICS = ("bleu", "chrf", "chrf++", "ter", "rouge")
ROUGE_TYPES = {"rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeL": "ROUGE-L"}


@dataclass
class Score:
    """One corpus score with its sacreBLEU signature (for reproducible reporting)."""

    name: str  # sacreBLEU's metric name: "BLEU", "chrF2", "chrF2++", "TER"
    score: float
    signature: str  # e.g. "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"

    def __str__(self) -> str:
        return f"{self.name} = {self.score:.2f} ({self.signature})"


def _ref_streams(refs: Refs) -> list[list[str]]:
    """Normalise one reference stream or several into a list of streams."""
    if isinstance(refs, str) or not hasattr(refs, "__iter__"):
        raise XindaError(f"references: expected a list of strings (or of streams), got "
                         f"{type(refs).__name__}")
    refs = list(refs)  # (an iterator read once by the check below lost its first stream)
    if all(isinstance(r, str) for r in refs):
        return [check_lines(refs, "references")]
    return [check_lines(stream, f"reference stream {i}") for i, stream in enumerate(refs, 1)]


def metric_names(metrics: str | Sequence[str]) -> list[str]:
    """``metrics`` as a list of names: "bleu,chrf" (as on the command line, spaces allowed)
    or a list of them; anything else is a XindaError."""
    names = metrics.split(",") if isinstance(metrics, str) else \
        list(metrics) if hasattr(metrics, "__iter__") else [metrics]
    if not all(isinstance(name, str) for name in names):
        raise XindaError(f"metrics: expected names such as ['bleu', 'chrf'], got {metrics!r}")
    return [name.strip() for name in names]


def _stream_names(n: int) -> list[str]:
    """How messages name ``n`` reference streams."""
    return ["references"] if n == 1 else [f"reference stream {i}" for i in range(1, n + 1)]


def _check_lengths(hyps: Sequence[str], streams: list[list[str]]) -> None:
    for i, stream in enumerate(streams, start=1):
        if len(stream) != len(hyps):
            which = "references" if len(streams) == 1 else f"reference stream {i}"
            verb = "have" if len(streams) == 1 else "has"
            raise XindaError(f"hypotheses have {len(hyps)} lines but {which} {verb} {len(stream)}")
    if not hyps:
        raise XindaError("no hypotheses to score (empty input)")


ASIAN_TOKENIZERS = ("zh", "ja-mecab", "ko-mecab", "char")  # their TER segments CJK text too
# ROUGE counts characters for these (Korean spaces its words): unsegmented Chinese or Japanese
# read as words was one "word" per clause
ROUGE_CHAR_TOKENIZERS = ("zh", "ja-mecab", "char")


def resolve_tokenizer(tokenize: str | None, streams: list[list[str]]) -> str | None:
    """``tokenize``, or when None: for mostly CJK references (13a would read each unsegmented
    line as one word: BLEU ~0) "char" when they are Japanese (kana: "zh" would leave each run
    of kana one word), else "zh"; for others None (sacreBLEU's 13a)."""
    if tokenize is not None:
        return tokenize
    script = cjk_script([line for stream in streams for line in stream])
    return {"ja": "char", "zh": "zh", None: None}[script]


def _make_bleu(tokenize: str | None, lowercase: bool = False) -> BLEU:
    if tokenize is None:
        return BLEU(lowercase=lowercase)
    try:
        return BLEU(tokenize=tokenize, lowercase=lowercase)
    except KeyError:
        raise XindaError(
            f"unknown BLEU tokenizer {tokenize!r}; e.g. 13a, intl, zh, char, none"
        ) from None
    except (ImportError, RuntimeError, OSError) as err:  # mecab extras, flores/spm downloads
        raise XindaError(f"BLEU tokenizer {tokenize!r} is not usable here: "
                         f"{type(err).__name__}: {' '.join(str(err).split())}") from None


def _make_metric(name: str, tokenize: str | None, lowercase: bool = False) -> Metric:
    key = name.lower()
    if key == "bleu":
        return _make_bleu(tokenize, lowercase)
    if key == "chrf":
        return CHRF(lowercase=lowercase)
    if key == "chrf++":
        return CHRF(word_order=2, lowercase=lowercase)
    if key == "ter":  # sacreBLEU's TER splits CJK characters only with its normaliser
        asian = tokenize in ASIAN_TOKENIZERS
        return TER(normalized=asian, asian_support=asian, case_sensitive=not lowercase)
    raise XindaError(f"unknown metric {name!r}; choose from {', '.join(METRICS)}")


def corpus_scores(
    hyps: Sequence[str],
    refs: Refs,
    metrics: Sequence[str] = ("bleu", "chrf", "ter"),
    tokenize: str | None = None,
    lowercase: bool = False,
    names: Sequence[str] = (),
) -> list[Score]:
    """Score ``hyps`` against one or more reference streams with each of ``metrics``.

    ``tokenize`` is passed to BLEU ("13a", "intl", "zh", ...; None: "zh" for mostly CJK
    references, "char" when they are Japanese, else sacreBLEU's 13a), to TER as its
    Asian-language support for "zh",
    "ja-mecab", "ko-mecab" and "char", and to ROUGE
    ("zh" or "char": characters; None: characters for mostly CJK references; else words,
    the English ones stemmed). "rouge" gives three scores: ROUGE-1, ROUGE-2 and ROUGE-L. An
    unusable ``tokenize`` is refused whichever metrics are asked for. ``lowercase``: BLEU,
    chrF and TER ignore case (for a model trained on lowercased text; ROUGE always does).
    TER and ROUGE, whose cost grows with the square of a line's length, first warn about
    lines over ``long_lines.SLOW_METRICS``'s bounds, naming them by ``names`` (the hypotheses'
    file, then the references'; default "hypotheses", "references" or "reference stream i").
    """
    hyps, streams = check_lines(hyps, "hypotheses"), _ref_streams(refs)
    _check_lengths(hyps, streams)
    tokenize = resolve_tokenizer(tokenize, streams)
    if tokenize is not None:
        _make_bleu(tokenize)  # refused before any score, as with BLEU among the metrics
    metrics = metric_names(metrics)
    unknown = [name for name in metrics if name.lower() not in METRICS]
    if unknown:
        raise XindaError(f"unknown metric {unknown[0]!r}; choose from {', '.join(METRICS)}")
    names = [*names] or ["hypotheses", *_stream_names(len(streams))]
    for name in dict.fromkeys(name.lower() for name in metrics):
        chars = tokenize in (ROUGE_CHAR_TOKENIZERS if name == "rouge" else ASIAN_TOKENIZERS)
        warn_long_lines(name, [hyps, *streams], names, chars)
    scores = []
    for name in metrics:
        if name.lower() == "rouge":
            scores += rouge_scores(hyps, streams, tokenize)
            continue
        metric = _make_metric(name, tokenize, lowercase)
        result = metric.corpus_score(hyps, streams)
        signature = metric.get_signature().format()
        scores.append(Score(name=result.name, score=float(result.score), signature=signature))
    return scores


# --- ROUGE ---------------------------------------------------------------------------------------


class _Characters:
    """rouge-score tokenizer for Chinese: every non-space character, lowercased (as ROUGE's
    words are: "GPU" and "gpu" in Chinese text are the same tokens), is a token."""

    def tokenize(self, text: str) -> list[str]:
        return [ch for ch in text.lower() if not ch.isspace()]


class _Words:
    """rouge-score's words for any script: lowercased runs of letters, marks and digits
    (rouge-score's own tokenizer keeps only [a-z0-9], so "Größe" became "gr", "e" and
    Cyrillic vanished), the ASCII ones Porter-stemmed when over 3 characters as rouge-score
    does; on ASCII text the same tokens as rouge-score's default tokenizer."""

    def __init__(self):
        import regex  # sacrebleu's dependency
        from nltk.stem import porter

        self._word = regex.compile(r"[\p{L}\p{M}\p{N}]+")
        self._stem = porter.PorterStemmer().stem

    def tokenize(self, text: str) -> list[str]:
        return [self._stem(w) if len(w) > 3 and w.isascii() else w
                for w in self._word.findall(text.lower())]


def rouge_scores(hyps: Sequence[str], refs: Refs, tokenize: str | None = None) -> list[Score]:
    """ROUGE-1/2/L F1 x 100 (Lin 2004), the mean over sentences; with several reference
    streams, each sentence's F1 is its mean over the references (ROUGE-1.5.5 averages too,
    its default -f A; Lin 2004, eq. 2, and rouge-score's score_multi take the best).
    Tokens: words (``_Words``: rouge-score's lowercased, Porter-stemmed words, in any
    script); "zh"/"ja-mecab"/"char", or ``tokenize`` None and mostly CJK references
    (``is_mostly_cjk``): characters."""
    hyps, streams = check_lines(hyps, "hypotheses"), _ref_streams(refs)
    _check_lengths(hyps, streams)
    tokenize = resolve_tokenizer(tokenize, streams)
    if tokenize is not None and tokenize not in BLEU.TOKENIZERS:  # (before: read as words)
        raise XindaError(f"unknown tokenizer {tokenize!r}; e.g. 13a, intl, zh, char, none")
    chars = tokenize in ROUGE_CHAR_TOKENIZERS
    # imported here: rouge-score loads nltk, which training, translating and BLEU do not need
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES),
                                      tokenizer=_Characters() if chars else _Words())
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for i, hyp in enumerate(hyps):
        for stream in streams:
            for key, score in scorer.score(stream[i], hyp).items():
                totals[key] += score.fmeasure
    tok = "char" if chars else "words+stem"
    signature = (f"nrefs:{len(streams)}|refs:mean|tok:{tok}|f1:mean-over-sentences|"
                 f"rouge-score:{version('rouge-score')}")
    n = len(hyps) * len(streams)
    return [Score(name, 100 * totals[key] / n, signature) for key, name in ROUGE_TYPES.items()]


# --- BLEU by source length ---------------------------------------------------------------------

# Han, kana, Hangul and CJK punctuation/fullwidth forms.
_CJK_RANGES = (
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x2E80, 0x2FDF),  # CJK radicals
    (0x3000, 0x30FF),  # CJK punctuation, Hiragana, Katakana
    (0x3100, 0x31FF),  # Bopomofo, Hangul compatibility Jamo, Katakana ext.
    (0x3400, 0x4DBF),  # CJK ext. A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xAC00, 0xD7AF),  # Hangul syllables
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFF00, 0xFFEF),  # halfwidth and fullwidth forms
    (0x20000, 0x2FA1F),  # CJK ext. B-F, compatibility supplement
)


# Hangul: CJK for fonts, but Korean writes spaces between words (13a and words suit it).
_HANGUL_RANGES = ((0x1100, 0x11FF), (0x3130, 0x318F), (0xAC00, 0xD7AF))


def is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def is_unsegmented(ch: str) -> bool:
    """A CJK character of a script written without spaces between words (not Hangul)."""
    cp = ord(ch)
    return is_cjk(ch) and not any(lo <= cp <= hi for lo, hi in _HANGUL_RANGES)


def cjk_script(lines: Sequence[str]) -> Literal["ja", "zh"] | None:
    """For lines whose non-space characters are more than half CJK of a script without spaces
    between words (Korean is not): "ja" when at least a tenth of those CJK characters are
    kana, else "zh"; None for other lines (one pass)."""
    total = cjk = kana = 0
    for line in lines:
        for ch in line:
            if not ch.isspace():
                total += 1
                if is_unsegmented(ch):
                    cjk += 1
                    kana += 0x3041 <= ord(ch) <= 0x30FF or 0x31F0 <= ord(ch) <= 0x31FF
    if not (total and cjk * 2 > total):
        return None
    return "ja" if kana * 10 >= cjk else "zh"


def is_mostly_cjk(lines: Sequence[str]) -> bool:
    """True if more than half of the non-space characters in ``lines`` are CJK."""
    return cjk_script(lines) is not None


def sentence_length(text: str, unit: Literal["words", "chars"]) -> int:
    """Length in whitespace tokens ("words") or non-space characters ("chars")."""
    if unit == "words":
        return len(text.split())
    return sum(not ch.isspace() for ch in text)


def _bucket_labels(edges: Sequence[int]) -> list[str]:
    labels, lo = [], 1
    for edge in edges:
        labels.append(f"{lo}-{edge}")
        lo = edge + 1
    labels.append(f"{lo}+")
    return labels


def _bucket_index(length: int, edges: Sequence[int]) -> int:
    for i, edge in enumerate(edges):
        if length <= edge:
            return i
    return len(edges)


def bleu_by_length(
    sources: Sequence[str],
    hyps: Sequence[str],
    refs: Refs,
    edges: Sequence[int] = (10, 20, 30, 40),
    tokenize: str | None = None,
    unit: LengthUnit = "auto",
    lowercase: bool = False,
) -> list[dict]:
    """Corpus BLEU per source-length bucket:
    ``[{"bucket": "1-10", "sentences": n, "bleu": x, "unit": "words" or "chars"}]``.

    Buckets are 1..edges[0], edges[0]+1..edges[1], ..., and edges[-1]+1 and longer; empty
    sources form a "0" bucket. Empty buckets are left out. ``unit`` "auto" counts characters
    when the sources are mostly CJK, else whitespace-separated words.
    """
    edges = list(edges)  # (an iterator was used up by the check: one bucket)
    if not all(isinstance(e, Integral) and not isinstance(e, bool) for e in edges):
        raise XindaError(f"length bucket edges must be increasing positive integers: {edges}")
    edges = [int(e) for e in edges]  # (numpy integers too)
    if edges != sorted(set(edges)) or (edges and edges[0] < 1):
        raise XindaError(f"length bucket edges must be increasing positive integers: {edges}")
    if unit not in ("auto", "words", "chars"):
        raise XindaError(f"unknown length unit {unit!r}; choose from auto, words, chars")
    sources, hyps = check_lines(sources, "sources"), check_lines(hyps, "hypotheses")
    streams = _ref_streams(refs)
    _check_lengths(hyps, streams)
    if len(sources) != len(hyps):
        raise XindaError(f"sources have {len(sources)} lines but hypotheses have {len(hyps)}")
    if unit == "auto":
        unit = "chars" if is_mostly_cjk(sources) else "words"

    groups: dict[int, list[int]] = {}  # bucket index (-1 = empty source) -> sentence indices
    for i, src in enumerate(sources):
        length = sentence_length(src, unit)
        groups.setdefault(-1 if length == 0 else _bucket_index(length, edges), []).append(i)

    labels = _bucket_labels(edges)
    bleu = _make_bleu(resolve_tokenizer(tokenize, streams), lowercase)
    rows = []
    for b in sorted(groups):
        idx = groups[b]
        sub_hyps = [hyps[i] for i in idx]
        sub_refs = [[stream[i] for i in idx] for stream in streams]
        score = bleu.corpus_score(sub_hyps, sub_refs).score
        rows.append({"bucket": "0" if b < 0 else labels[b], "sentences": len(idx), "bleu": score,
                     "unit": unit})
    return rows


def format_length_table(rows: Sequence[dict]) -> str:
    """Render ``bleu_by_length`` rows as an aligned text table, its unit in the header."""
    header = (f"length ({rows[0]['unit']})" if rows else "length", "sentences", "BLEU")
    body = [(r["bucket"], str(r["sentences"]), f"{r['bleu']:.2f}") for r in rows]
    widths = [max(len(row[c]) for row in [header, *body]) for c in range(3)]
    lines = [
        f"{row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:>{widths[2]}}"
        for row in [header, *body]
    ]
    return "\n".join(lines)


def read_hyps_refs(hyp_path: str | Path, ref_paths: Sequence[str | Path]
                   ) -> tuple[list[str], list[list[str]]]:
    """Read a hypothesis file once and one or more reference files (plain or .gz; "-" or a
    pipe such as /dev/stdin for one of them); every line count must match."""
    if isinstance(ref_paths, (str, Path)):
        raise XindaError(f"reference files: expected a list of paths, got one: [{ref_paths!r}]")
    names = [input_name(hyp_path), *map(input_name, ref_paths)]
    if names.count("<stdin>") > 1:
        raise XindaError("the hypotheses and references: stdin (-) gives one of them at most")
    hyps, hyp_path = read_input(hyp_path), input_name(hyp_path)
    if not hyps:
        raise XindaError(f"{hyp_path}: no hypotheses to score (empty file)")
    streams = []
    for ref_path in ref_paths:
        refs, ref_path = read_input(ref_path), input_name(ref_path)
        if len(hyps) != len(refs):
            raise XindaError(
                f"{hyp_path} has {len(hyps)} lines but {ref_path} has {len(refs)}; "
                "hypotheses and references must be line-parallel"
            )
        streams.append(refs)
    return hyps, streams
