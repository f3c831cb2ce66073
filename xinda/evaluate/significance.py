"""Paired significance of a system's translations against a baseline's on the same references.

Both tests work on sacreBLEU's sentence statistics (n-gram matches, edit counts: what its own
``PairedTest`` resamples), read once; a trial only re-adds counts.

- Approximate randomization (Riezler and Maxwell 2005): each trial swaps the two systems'
  translations of every sentence with probability 1/2; two-sided p = (c + 1) / (R + 1), c the
  trials whose |difference| is at least the observed one. The trials are sacreBLEU's
  ``--paired-ar`` trials (the same seed and draws), but sacreBLEU counts strictly greater
  differences only (as multeval does): the same p unless trials tie with the observed
  difference, which they do when the outputs differ in few sentences. With integer statistics
  (BLEU, chrF, TER on one reference) it calls identical outputs, or two that differ in one
  sentence, different at p = 1/(R + 1) (reported for multeval: jhclark/multeval#5); here p
  is 1.
- Paired bootstrap (Koehn 2004): the test set resampled with replacement; the 95 % percentile
  interval of the difference system - baseline.
- Over several runs (training seeds), ``two_level_interval``: the runs and the sentences both
  resampled, for the mean difference.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from xinda.errors import XindaError
from xinda.evaluate.long_lines import warn_long_lines
from xinda.evaluate.metrics import (
    ASIAN_TOKENIZERS,
    Refs,
    _check_lengths,
    _make_bleu,
    _make_metric,
    _ref_streams,
    check_lines,
    metric_names,
    resolve_tokenizer,
)
from xinda.utils import is_whole

AR_TRIALS, BOOTSTRAP_SAMPLES, SEED = 10_000, 1_000, 12345  # sacreBLEU's defaults
PAIRED_METRICS = ("bleu", "chrf", "chrf++", "ter")  # (ROUGE: not on sacreBLEU's statistics)
CHUNK_VALUES = 4_000_000  # trials x sentences held at once (about)


@dataclass(frozen=True)
class PairedResult:
    """One metric's paired comparison of a system with a baseline."""

    metric: str  # sacreBLEU's name: "BLEU", "chrF2", "chrF2++", "TER"
    baseline: float
    system: float
    p: float  # approximate randomization, two-sided
    trials: int
    ci95: tuple[float, float]  # paired bootstrap interval of system - baseline
    samples: int
    differing: int  # sentences the two outputs translate differently
    sentences: int
    signature: str  # sacreBLEU's, with the tests' "|ar:R|bs:B|seed:S"

    @property
    def difference(self) -> float:
        return self.system - self.baseline

    def __str__(self) -> str:
        low, high = self.ci95
        lower = " (lower is better)" if self.metric.startswith("TER") else ""
        return (f"{self.metric}{lower}: {self.system:.2f} vs baseline {self.baseline:.2f}, "
                f"{self.difference:+.2f} (95 % CI [{low:+.2f}, {high:+.2f}], paired bootstrap); "
                f"p = {self.p:.4f} (approximate randomization, two-sided); the outputs differ "
                f"in {self.differing} of {self.sentences} sentences ({self.signature})")


def paired_tests(baseline: Sequence[str], system: Sequence[str], refs: Refs,
                 metrics: Sequence[str] = ("bleu",), tokenize: str | None = None,
                 lowercase: bool = False, trials: int = AR_TRIALS,
                 samples: int = BOOTSTRAP_SAMPLES, seed: int = SEED) -> list[PairedResult]:
    """``system`` against ``baseline`` (the same sentences, in order) on one or more reference
    streams, for each of ``metrics`` (``PAIRED_METRICS``), tokenised as ``corpus_scores``
    tokenises (and warns, naming the baseline's long lines as ``corpus_scores`` names the
    others')."""
    baseline, system = check_lines(baseline, "baseline"), check_lines(system, "hypotheses")
    streams = _ref_streams(refs)
    _check_lengths(system, streams)
    if len(baseline) != len(system):
        raise XindaError(f"baseline has {len(baseline)} lines but hypotheses have "
                         f"{len(system)}")
    if any(not is_whole(n) or n < 1 for n in (trials, samples)):
        raise XindaError(f"paired tests need at least one trial and one resample (whole "
                         f"numbers), got {trials!r} and {samples!r}")
    metrics = metric_names(metrics)
    unknown = [m for m in metrics if m.lower() not in PAIRED_METRICS]
    if unknown:
        raise XindaError(f"no paired test for {unknown[0]!r}; choose from "
                         f"{', '.join(PAIRED_METRICS)}")
    tokenize = resolve_tokenizer(tokenize, streams)
    if tokenize is not None:
        _make_bleu(tokenize)  # an unusable tokenizer is refused, as corpus_scores refuses it
    same = (str.lower if lowercase else str)  # what the metrics compare
    differing = sum(same(a) != same(b) for a, b in zip(baseline, system))
    results = []
    for name in metrics:
        warn_long_lines(name.lower(), [baseline], ["baseline"],
                        tokenize in ASIAN_TOKENIZERS)
        metric = _make_metric(name, tokenize, lowercase)
        with _quiet_sacrebleu():
            stats = [np.asarray(metric._extract_corpus_statistics(hyps, streams),
                                dtype=np.float64) for hyps in (baseline, system)]
        base, sys_ = (metric._aggregate_and_compute(s) for s in stats)
        signature = f"{metric.get_signature().format()}|ar:{trials}|bs:{samples}|seed:{seed}"
        results.append(PairedResult(
            metric=sys_.name, baseline=float(base.score), system=float(sys_.score),
            p=randomization_p(metric, *stats, trials, seed), trials=trials,
            ci95=bootstrap_interval(metric, *stats, samples, seed), samples=samples,
            differing=differing, sentences=len(system), signature=signature))
    return results


@contextmanager
def _quiet_sacrebleu() -> Iterator[None]:
    """sacreBLEU's warnings (e.g. about lines ending in " .") off for the block: the
    statistics are read again after ``corpus_scores`` read (and warned about) them."""
    logger = logging.getLogger("sacrebleu")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _chunk_rows(n: int) -> int:
    """Trials (or resamples) per chunk of about ``CHUNK_VALUES`` values: a multiple of 32, so
    that numpy draws the same random bits as in one piece (as sacreBLEU draws them)."""
    return max(32, CHUNK_VALUES // n // 32 * 32)


def _score(metric, summed: np.ndarray) -> float:
    """The metric of summed sentence statistics (k,)."""
    return float(metric._aggregate_and_compute(summed[None]).score)


def randomization_p(metric, base: np.ndarray, sys_: np.ndarray, trials: int, seed: int
                    ) -> float:
    """Two-sided approximate randomization p over sentence statistics (n, k) of each system:
    (#{trials with |d*| >= |d|} + 1) / (trials + 1)."""
    observed = abs(_score(metric, sys_.sum(0)) - _score(metric, base.sum(0)))
    rng, n, at_least = np.random.default_rng(seed), len(base), 0
    step = _chunk_rows(n)
    for start in range(0, trials, step):
        swap = rng.integers(2, size=(min(step, trials - start), n), dtype=bool)
        a, b = swap @ sys_ + ~swap @ base, swap @ base + ~swap @ sys_  # (chunk, k) each
        d = np.array([abs(_score(metric, x) - _score(metric, y)) for x, y in zip(a, b)])
        # a tie counts (the tolerance: TER's fractional average reference lengths)
        at_least += int((d >= observed - 1e-9).sum())
    return (at_least + 1) / (trials + 1)


def bootstrap_interval(metric, base: np.ndarray, sys_: np.ndarray, samples: int, seed: int
                       ) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of system - baseline over ``samples`` resamples of
    the sentences (with replacement, the same resample for both systems)."""
    rng, n, diffs = np.random.default_rng(seed), len(base), []
    step = _chunk_rows(n)
    for start in range(0, samples, step):
        picked = rng.integers(n, size=(min(step, samples - start), n))
        weights = np.stack([np.bincount(row, minlength=n) for row in picked]).astype(np.float64)
        diffs += [_score(metric, s) - _score(metric, b)
                  for s, b in zip(weights @ sys_, weights @ base)]
    low, high = np.percentile(diffs, [2.5, 97.5])
    return float(low), float(high)


def two_level_interval(runs: Sequence[tuple[Sequence[str], Sequence[str]]], refs: Refs,
                       tokenize: str | None = None, samples: int = BOOTSTRAP_SAMPLES,
                       seed: int = SEED) -> tuple[float, float]:
    """The 95 % percentile interval of the mean BLEU difference system - baseline over paired
    runs (each a (baseline, system) pair of translations of the same test set, e.g. one per
    training seed) when both levels are resampled with replacement: the runs, and the test
    sentences (one draw shared by the runs drawn). It holds the seed-to-seed variance that a
    per-run test leaves out and the test-set variance that a t-test over seeds on one test
    set leaves out (the optimizer instability of Clark et al. 2011)."""
    runs = list(runs)
    if any(isinstance(run, str) or len(run) != 2 for run in runs):
        raise XindaError("runs: expected (baseline, system) pairs of translations, one per run")
    runs = [(check_lines(base, "baseline"), check_lines(sys_, "hypotheses"))
            for base, sys_ in runs]
    if not runs or not is_whole(samples) or samples < 1:
        raise XindaError("a two-level interval needs a pair of runs and a resample at least "
                         f"(a whole number), got {len(runs)} runs and samples={samples!r}")
    streams = _ref_streams(refs)
    for run in runs:
        for hyps in run:
            _check_lengths(hyps, streams)
    metric = _make_bleu(resolve_tokenizer(tokenize, streams))
    with _quiet_sacrebleu():
        stats = np.stack([[np.asarray(metric._extract_corpus_statistics(hyps, streams),
                                      dtype=np.float64) for hyps in run] for run in runs])
    rng, n_runs, n = np.random.default_rng(seed), len(runs), stats.shape[2]  # (runs, 2, n, k)
    diffs = []
    for _ in range(samples):
        drawn = stats[rng.integers(n_runs, size=n_runs)]
        weights = np.bincount(rng.integers(n, size=n), minlength=n).astype(np.float64)
        summed = np.einsum("n,rsnk->rsk", weights, drawn)  # (runs, 2, k)
        diffs.append(np.mean([_score(metric, s) - _score(metric, b) for b, s in summed]))
    low, high = np.percentile(diffs, [2.5, 97.5])
    return float(low), float(high)
