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
