"""GNMT coverage penalty: cp = beta * sum_i log(min(sum_j a_ij, 1))."""

from __future__ import annotations

import math

import pytest
import torch

from xinda.config import DecodeConfig
from xinda.decode.search import beam_search, coverage_penalty, length_penalty


def test_coverage_penalty_hand_example_ignores_padding():
    attention = torch.tensor([[0.5, 0.2, 0.0], [0.7, 0.1, 0.0]])  # (T=2, S=3), last is pad
    keep = torch.tensor([True, True, False])
    # column sums 1.2 -> min 1 -> log 0;  0.3 -> log 0.3;  pad column skipped
    assert coverage_penalty(attention, keep, 0.4) == pytest.approx(0.4 * math.log(0.3))
    assert coverage_penalty(attention, keep, 0.0) == 0.0


def test_beam_search_ranks_with_length_and_coverage_penalty(make_model, make_vocab):
    model = make_model({"arch": "transformer", "d_model": 16, "heads": 2, "ffn_dim": 32,
                        "encoder_layers": 1, "decoder_layers": 1, "tie_output": False},
                       seed=0, vocab=make_vocab(src_size=20, tgt_size=20))
    src = torch.tensor([[5, 6, 7, 3], [8, 9, 3, 0]])
    beta, alpha = 0.3, 0.6
    results = beam_search(model, src, DecodeConfig(beam=3, alpha=alpha, nbest=3, coverage=beta,
                                                   max_len_b=6))
    for row, hyps in enumerate(results):
        keep = src[row].ne(0)
        for h in hyps:
            expected = h.logprob / length_penalty(len(h.tokens) + 1, alpha) + \
                coverage_penalty(h.attention, keep, beta)
            assert h.score == pytest.approx(expected, rel=1e-5)
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


def test_a_full_sentence_keeps_the_steps_best_scores_not_log_probabilities():
    """Room for one more finished hypothesis, and two end at this step: the better final score
    (coverage included) is kept. Before: the higher log-probability, in 3 of 600 sentences a
    worse output than one the search had finished (found by review)."""
    from xinda.decode.search import Hypothesis, _Beams, _finalise

    bos = 1
    beams = _Beams(alive=torch.tensor([0]), tokens=torch.tensor([[bos, 5], [bos, 6]]),
                   scores=torch.zeros(1, 2), best_ended=torch.tensor([False]),
                   attention=torch.tensor([[[1.0, 0.0]], [[0.5, 0.5]]]))  # (N*K, t-1, S)
    finished = [[Hypothesis([7], 0.0, 0.0)]]
    top_scores = torch.tensor([[-1.0, -1.1, -2.0, -3.0]])  # rank 0 from beam 0, 1 from beam 1
    src_beam, is_eos = torch.tensor([[0, 1, 0, 1]]), torch.tensor([[True, True, False, False]])
    _finalise(beams, finished, top_scores, src_beam, is_eos, k=2, alpha=0.0,
              coverage=(1.0, torch.tensor([[True, True]])))
    assert [h.tokens for h in finished[0]] == [[7], [6]]
    assert finished[0][1].score == pytest.approx(-1.1 + 2 * math.log(0.5))
