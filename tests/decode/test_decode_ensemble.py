"""Ensembles: the mean of the members' log-probabilities, each with its own incremental cache."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from xinda.config import DecodeConfig
from xinda.data.text import TextPipeline
from xinda.decode.ensemble import Ensemble, check_same_vocabularies
from xinda.decode.search import beam_search, greedy_search
from xinda.errors import XindaError

TRANSFORMER = {"arch": "transformer", "d_model": 16, "heads": 2, "ffn_dim": 32,
               "encoder_layers": 1, "decoder_layers": 2, "tie_output": False}
RNN = {"arch": "rnn", "embed_dim": 8, "hidden_dim": 8, "dropout": 0.0,
       "attention_style": "bahdanau", "attention": "concat", "decoder_layers": 1}
DEC = DecodeConfig(beam=3, nbest=3, max_len_a=0.0, max_len_b=7)


def same(a, b) -> None:
    """Equal n-best lists: tokens exactly, scores to float precision."""
    assert [[h.tokens for h in row] for row in a] == [[h.tokens for h in row] for row in b]
    for row_a, row_b in zip(a, b):
        for h, g in zip(row_a, row_b):
            assert h.score == pytest.approx(g.score, abs=1e-4)


@pytest.mark.parametrize("spec", [TRANSFORMER, RNN], ids=["transformer", "rnn"])
def test_an_ensemble_of_one_model_is_that_model(make_model, make_src, spec):
    model = make_model(spec, eos_bias=1.0)
    src = make_src([6, 3, 5])
    same(beam_search(Ensemble([model]), src, DEC), beam_search(model, src, DEC))
    greedy = DecodeConfig(max_len_a=0.0, max_len_b=7)
    assert [h.tokens for h in greedy_search(Ensemble([model]), src, greedy)] == \
        [h.tokens for h in greedy_search(model, src, greedy)]


@pytest.mark.parametrize("spec", [TRANSFORMER, RNN], ids=["transformer", "rnn"])
def test_two_copies_are_one_model(make_model, make_src, spec):
    model = make_model(spec, eos_bias=1.0)
    src = make_src([6, 3, 5])
    same(beam_search(Ensemble([model, model]), src, DEC), beam_search(model, src, DEC))


def test_the_step_distribution_is_the_normalised_mean_of_log_probabilities(make_model,
                                                                            make_src, make_prev):
    a, b = make_model(TRANSFORMER, seed=1), make_model(TRANSFORMER, seed=2)
    src, prev = make_src([5, 4]), make_prev(2, 4)
    ensemble = Ensemble([a, b])
    with torch.no_grad():
        mean, _ = ensemble.decode(prev, ensemble.encode(src))
        expected = (torch.log_softmax(a(src, prev), -1) + torch.log_softmax(b(src, prev), -1)) / 2
    torch.testing.assert_close(mean, expected)
    # incremental decoding, token by token through both caches, gives the same numbers
    with torch.no_grad():
        enc, state = ensemble.encode(src), {}
        steps = [ensemble.decode(prev[:, t:t + 1], enc, state)[0] for t in range(prev.size(1))]
    torch.testing.assert_close(torch.cat(steps, 1), mean, atol=1e-5, rtol=1e-5)


def test_different_models_change_the_result(make_model, make_src):
    a, b = make_model(TRANSFORMER, seed=1, eos_bias=1.0), make_model(TRANSFORMER, seed=5)
    src = make_src([6, 3, 5])
    together = beam_search(Ensemble([a, b]), src, DEC)
    assert [[h.tokens for h in r] for r in together] != \
        [[h.tokens for h in r] for r in beam_search(a, src, DEC)]


def test_attention_only_when_every_member_has_it(make_model, make_src):
    """Before: a member without attention first gave None silently, last a TypeError."""
    with_attention = make_model(TRANSFORMER, eos_bias=1.0)
    without = make_model({**RNN, "attention": "none", "attention_style": "luong"})  # default
    src = make_src([6, 3])
    greedy = DecodeConfig(max_len_a=0.0, max_len_b=4)
    for members in ([with_attention, without], [without, with_attention]):
        ensemble = Ensemble(members)
        assert not ensemble.has_attention
        assert all(h.attention is None for h in greedy_search(ensemble, src, greedy, True))
        assert all(h.attention is None for row in beam_search(ensemble, src, DEC, True)
                   for h in row)
    both = Ensemble([with_attention, make_model(RNN)])
    assert both.has_attention
    assert all(h.attention is not None for h in greedy_search(both, src, greedy, True))


def test_members_with_other_vocabularies_are_refused(make_model, make_vocab):
    other = make_model(TRANSFORMER, vocab=make_vocab(tgt_size=40, joint=False))
    with pytest.raises(XindaError, match=r"^ensemble model 2 has other vocabularies .*tgt_size=40"):
        Ensemble([make_model(TRANSFORMER), other])


def test_members_prepared_with_other_text_settings_are_refused(tmp_path):
    """Before: only the sentencepiece files were compared, so a member prepared with another
    lowercasing or pre-tokenisation silently read the first model's preprocessed input."""
    spm = tmp_path / "spm.model"
    spm.write_bytes(b"the same sentencepiece model")
    vocab = SimpleNamespace(path=spm, size=8)
    moses = TextPipeline("NFKC", True, "moses", "en")

    def member(src_text):
        return SimpleNamespace(src_text=src_text, tgt_text=moses, src=vocab, tgt=vocab)

    dirs = [Path("a"), Path("b")]
    check_same_vocabularies(dirs, [member(moses), member(moses)])
    other = TextPipeline("NFKC", False, "none", "en")
    with pytest.raises(XindaError, match=r"^--ensemble b: its source text settings .*'lowercase'"
                                         r": False.* differ from a's"):
        check_same_vocabularies(dirs, [member(moses), member(other)])


def test_the_position_limit_is_the_smallest_members(make_model):
    """A member cannot read past its own max_positions: the ensemble takes the minimum,
    whichever member comes first, and the first member's other settings."""
    short = make_model(TRANSFORMER, max_positions=24)
    long = make_model(TRANSFORMER, seed=1, max_positions=64)
    for members in ([short, long], [long, short], [long, short, long]):
        ensemble = Ensemble(members)
        assert ensemble.cfg.max_positions == 24
        assert ensemble.cfg.model_copy(update={"max_positions": members[0].cfg.max_positions}) \
            == members[0].cfg
    assert [m.cfg.max_positions for m in (short, long)] == [24, 64]  # members left as they were


def test_the_attention_is_the_mean_of_the_members(make_model, make_src, make_prev):
    """The ensemble's source attention (B, T, S) is the plain mean of the members' weights."""
    members = [make_model(TRANSFORMER, seed=1), make_model(RNN, seed=2),
               make_model(TRANSFORMER, seed=3)]
    src, prev = make_src([5, 4]), make_prev(2, 4)
    with torch.no_grad():
        _, attn = Ensemble(members).decode(prev, Ensemble(members).encode(src), None, True)
        own = [m.decode(prev, m.encode(src), None, True)[1] for m in members]
    assert not torch.allclose(own[0], own[1], atol=1e-3)  # the members disagree
    torch.testing.assert_close(attn, (own[0] + own[1] + own[2]) / 3)
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 4))  # still a distribution
