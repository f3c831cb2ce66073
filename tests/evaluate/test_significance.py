"""Paired significance tests (xinda.evaluate.significance) against exact enumeration, sacreBLEU
and the symmetries they must have."""

from __future__ import annotations

import itertools
import random

import pytest
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from xinda.errors import XindaError
from xinda.evaluate import significance
from xinda.evaluate.metrics import corpus_scores, rouge_scores
from xinda.evaluate.significance import paired_tests

WORDS = ["a", "the", "cat", "dog", "man", "woman", "sits", "runs", "on", "in", "park", "street",
         "red", "blue", "small", "big"]


def corpus(n: int, seed: int, edit: float, gap: float = 0.1
           ) -> tuple[list[str], list[str], list[str]]:
    """References, a baseline's and a system's outputs: each system word replaced with
    probability ``edit``, each baseline word with ``edit + gap``."""
    rng = random.Random(seed)
    refs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))) for _ in range(n)]

    def noisy(p: float) -> list[str]:
        return [" ".join(w if rng.random() > p else rng.choice(WORDS) for w in r.split())
                for r in refs]
    return refs, noisy(edit + gap), noisy(edit)


def exact_randomization_p(metric, base: list[str], system: list[str], refs: list[str]) -> float:
    """The exact two-sided p: the share of all 2^n swap patterns whose |difference| is at
    least the observed one (the quantity approximate randomization estimates)."""
    def diff(a, b):
        return abs(metric.corpus_score(b, [refs]).score - metric.corpus_score(a, [refs]).score)

    observed, hits, total = diff(base, system), 0, 0
    for swap in itertools.product([False, True], repeat=len(refs)):
        a = [s if k else b for k, b, s in zip(swap, base, system)]
        b = [b if k else s for k, b, s in zip(swap, base, system)]
        hits += diff(a, b) >= observed - 1e-9
        total += 1
    return hits / total


@pytest.mark.parametrize("seed", [1, 2])
def test_randomization_p_estimates_the_exact_two_sided_p(seed):
    refs, base, system = corpus(9, seed, 0.2)
    exact = exact_randomization_p(CHRF(), base, system, refs)
    [result] = paired_tests(base, system, refs, ["chrf"], trials=20_000, samples=10)
    assert result.p == pytest.approx(exact, abs=0.012)  # binomial sd at 20k trials < 0.004


@pytest.mark.parametrize("chunk", [None, 3000])
def test_without_ties_p_is_sacrebleus_paired_ar(chunk, monkeypatch):
    """300 sentences, most different: no trial ties, so >= and sacreBLEU's > count alike; in
    chunks of trials too (before a review, chunks of 10 trials x 300 sentences drew other
    random bits than sacreBLEU's one piece: p 0.0403 where it says 0.0433)."""
    if chunk:
        monkeypatch.setattr(significance, "CHUNK_VALUES", chunk)
    refs, base, system = corpus(300, 3, 0.3, gap=0.02)  # p about 0.13: not at the floor
    [ours] = paired_tests(base, system, refs, ["bleu"], trials=2000, samples=10)
    assert 0.05 < ours.p < 0.5
    _, scores = PairedTest([("b", base), ("s", system)], {"BLEU": BLEU()}, [refs],
                           test_type="ar", n_samples=2000)()
    assert ours.p == pytest.approx(scores["BLEU"][1].p_value)
    assert (ours.baseline, ours.system) == pytest.approx(
        (scores["BLEU"][0].score, scores["BLEU"][1].score))


@pytest.mark.parametrize("changed", [0, 1])
def test_identical_outputs_or_one_changed_sentence_are_not_significant(changed):
    """sacreBLEU's --paired-ar gives both p = 1/(trials + 1), 'significant'; every swap pattern
    ties with the observed difference here (0, or the one sentence either way round)."""
    refs, base, _ = corpus(50, 4, 0.3)
    system = list(base)
    if changed:
        system[0] = refs[0]
    for result in paired_tests(base, system, refs, ["bleu", "ter"], trials=500, samples=200):
        assert result.p == 1.0 and result.differing == changed
        if not changed:
            assert result.ci95 == (0.0, 0.0)


def test_the_bootstrap_interval_mirrors_when_the_systems_swap_and_brackets_a_clear_gain():
    refs, base, system = corpus(150, 5, 0.1)
    [forward] = paired_tests(base, system, refs, ["bleu"], trials=10, samples=400)
    [backward] = paired_tests(system, base, refs, ["bleu"], trials=10, samples=400)
    assert backward.ci95 == pytest.approx((-forward.ci95[1], -forward.ci95[0]))
    assert forward.difference > 0 and forward.ci95[0] > 0  # a 10-point edit-rate gap
    assert forward.ci95[0] < forward.difference < forward.ci95[1]


def test_a_system_that_is_the_references_wins_every_resample():
    refs, base, _ = corpus(40, 6, 0.3)
    [result] = paired_tests(base, refs, refs, ["chrf"], trials=300, samples=300)
    assert result.system == pytest.approx(100.0) and result.ci95[0] > 0
    assert result.p == pytest.approx(1 / 301)  # no shuffle reaches the full gap
    assert "|ar:300|bs:300|seed:12345" in result.signature


def test_bad_requests_are_refused():
    refs, base, system = corpus(5, 7, 0.2)
    with pytest.raises(XindaError, match="baseline has 4 lines but hypotheses have 5"):
        paired_tests(base[:4], system, refs)
    with pytest.raises(XindaError, match="no paired test for 'rouge'"):
        paired_tests(base, system, refs, ["bleu", "rouge"])
    with pytest.raises(XindaError, match="at least one trial"):
        paired_tests(base, system, refs, trials=0)
    with pytest.raises(XindaError, match="bogus"):  # as corpus_scores (before: accepted)
        paired_tests(base, system, refs, ["chrf"], tokenize="bogus")


@pytest.mark.parametrize("tokenize, lowercase", [(None, False), (None, True), ("intl", False)])
def test_the_scores_are_corpus_scores_with_the_same_options(tokenize, lowercase):
    """Three reference streams; the metrics given as on the command line."""
    refs, base, system = corpus(30, 8, 0.2)
    streams = [refs, corpus(30, 9, 0.2)[1], [r.upper() for r in refs]]
    results = paired_tests(base, system, streams, "bleu, chrf++,TER", tokenize, lowercase,
                           trials=50, samples=50)
    for hyps, side in ((base, "baseline"), (system, "system")):
        expected = corpus_scores(hyps, streams, ("bleu", "chrf++", "ter"), tokenize, lowercase)
        assert [getattr(r, side) for r in results] == pytest.approx([e.score for e in expected])
    assert [r.metric for r in results] == ["BLEU", "chrF2++", "TER"]
    assert str(results[2]).startswith("TER (lower is better): ")


def test_chinese_is_scored_in_characters_and_case_only_changes_are_not_differences():
    refs = ["我们今天去公园散步", "他在读一本书", "天气很好"]
    base = ["我们今天去公园", "他读一本书", "天气不错"]
    [zh] = paired_tests(base, refs, refs, ["bleu"], trials=50, samples=50)
    assert zh.system == pytest.approx(100.0) and "tok:zh" in zh.signature
    words = ["A cat sits", "a dog runs", "two men"]
    [same] = paired_tests(words, [w.lower() for w in words], words, ["bleu"], lowercase=True,
                          trials=50, samples=50)
    assert same.differing == 0 and same.p == 1.0


def test_the_two_level_interval_holds_the_runs_spread_and_the_test_sets():
    """Runs that disagree in sign (a gain in one, a loss in the other): each run's own
    bootstrap lies on its side of 0, the two-level interval spans both; swapping the systems
    mirrors it; identical outputs give (0, 0)."""
    refs, worse, better = corpus(60, 3, 0.2, gap=0.3)
    runs = [(worse, better), (better, worse)]
    [up] = paired_tests(worse, better, [refs])
    [down] = paired_tests(better, worse, [refs])
    assert up.ci95[0] > 0 > down.ci95[1]
    low, high = significance.two_level_interval(runs, [refs], samples=300)
    assert low < down.ci95[1] < 0 < up.ci95[0] < high
    mirrored = significance.two_level_interval([(b, a) for a, b in runs], [refs], samples=300)
    assert mirrored == pytest.approx((-high, -low))
    assert significance.two_level_interval([(refs, refs), (worse, worse)], [refs],
                                           samples=50) == (0.0, 0.0)
    with pytest.raises(XindaError, match="hypotheses have 59 lines"):
        significance.two_level_interval([(worse, better[:-1])], [refs])
    with pytest.raises(XindaError, match="a resample at least"):
        significance.two_level_interval(runs, [refs], samples=0)
    # iterators read once (before a review: used up by the checks, then a numpy error)
    assert significance.two_level_interval(((iter(a), iter(b)) for a, b in runs), [refs],
                                           samples=300) == (low, high)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: corpus_scores(["a"], ["a"], None), "metrics: expected names such as"),
    (lambda: corpus_scores(["a"], None), "references: expected a list of strings .* NoneType"),
    (lambda: corpus_scores(["a"], 5), "references: expected a list of strings .* got int"),
    (lambda: rouge_scores(["a"], ["a"], "zzz"), "unknown tokenizer 'zzz'"),  # was: words
    (lambda: paired_tests(["a"], ["a"], ["a"], None), "metrics: expected names"),
    (lambda: paired_tests(["a"], ["a"], ["a"], trials=10.5), "whole numbers.* 10.5 and 1000"),
    (lambda: paired_tests(["a"], ["a"], ["a"], samples="10"), "whole numbers.* and '10'"),
    (lambda: significance.two_level_interval([(["a"], ["a"], ["a"])], ["a"]),
     r"runs: expected \(baseline, system\) pairs"),  # was: too many values to unpack
    (lambda: significance.two_level_interval([(["a"], ["a"])], ["a"], samples=2.5),
     "samples=2.5"),
])
def test_scoring_arguments_of_the_wrong_type_are_one_line_errors(call, message):
    """Before: TypeErrors, and an unknown ROUGE tokenizer fell back to words silently (found
    by review)."""
    with pytest.raises(XindaError, match=message):
        call()


def test_counts_may_be_numpy_integers():
    import numpy as np

    [result] = paired_tests(["a b c d"], ["a b c d"], ["a b c d"], "bleu", trials=np.int64(10),
                            samples=np.int64(10))
    assert result.difference == 0
    low, high = significance.two_level_interval([(["a b c d"], ["a b c d"])], ["a b c d"],
                                                samples=np.int64(10))
    assert low == high == 0


def test_metrics_may_be_any_iterable_of_names():
    scores = corpus_scores(["a b c d"], ["a b c d"], (m for m in ["bleu", "chrf"]))
    assert [s.score for s in scores] == pytest.approx([100, 100])
