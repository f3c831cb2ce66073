"""Greedy and beam search on tiny random Transformers.

An untrained model rarely ends a sentence on its own, so most tests add a bias to the EOS logit
(an output-layer bias on an untied output matrix) to get hypotheses of varied lengths.
"""

import itertools
import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from xinda.config import DecodeConfig
from xinda.data.vocab import VocabInfo
from xinda.decode.sampling import SamplingConfig, sample
from xinda.decode.search import (
    SearchStopped,
    _top_candidates,
    argmax,
    beam_search,
    greedy_search,
    length_penalty,
    max_lengths,
    stop_when,
)
from xinda.models.base import EncoderOut, SharedEncoderOut

TINY = {"arch": "transformer", "d_model": 32, "heads": 4, "ffn_dim": 64,
        "encoder_layers": 2, "decoder_layers": 2, "tie_output": False}


@pytest.fixture
def tiny_model(make_model):
    """``tiny_model(seed=0, eos_bias=1.0, vocab=None, **overrides)``: the TINY Transformer
    with a bias of ``eos_bias`` on the EOS logit."""
    def make(seed: int = 0, eos_bias: float = 1.0, **overrides):
        return make_model(TINY, seed, eos_bias=eos_bias, **overrides)
    return make


LENGTHS = [8, 3, 5, 8, 1, 6]


def teacher_forced_logprob(model, src_row, tokens):
    """log P(tokens + EOS | src) under the model, by one teacher-forced pass."""
    vocab = model.vocab
    src = src_row[src_row.ne(vocab.pad)][None]
    with torch.no_grad():
        logits, _ = model.decode(torch.tensor([[vocab.bos] + tokens]), model.encode(src))
    logp = torch.log_softmax(logits[0].double(), -1)
    target = tokens + [vocab.eos]
    return sum(float(logp[t, y]) for t, y in enumerate(target))


def reference_beam_search(model, src_row, k, alpha, max_len_a, max_len_b, stop="beam",
                          nbest=1):
    """One sentence, no incremental state, plain Python: the same algorithm as ``beam_search``
    (rank 2k candidates, finalise EOS among the top k, continue the best k non-EOS, stop at k
    finished hypotheses, or with stop "best" once a step's best candidate was EOS and
    ``nbest`` are finished, force EOS at the length limit)."""
    vocab = model.vocab
    src = src_row[src_row.ne(vocab.pad)][None]
    enc = model.encode(src)
    limit = int(max_lengths(torch.tensor([src.size(1)]), max_len_a, max_len_b, 1023)[0])
    beams, finished, best_ended = [([vocab.bos], 0.0)], [], False
    for step in range(limit):
        prev = torch.tensor([tokens for tokens, _ in beams])
        logits, _ = model.decode(prev, enc.reorder(torch.zeros(len(beams), dtype=torch.long)))
        logp = torch.log_softmax(logits[:, -1].double(), -1)
        logp[:, [vocab.pad, vocab.bos]] = -math.inf
        if step + 1 >= limit:
            eos_col = logp[:, vocab.eos].clone()
            logp[:] = -math.inf
            logp[:, vocab.eos] = eos_col
        cands = sorted(((score + float(logp[i, t]), i, t) for i, (_, score) in enumerate(beams)
                        for t in range(logp.size(1))), key=lambda c: -c[0])[: 2 * k]
        for score, i, t in cands[:k]:
            if t == vocab.eos and score > -math.inf and len(finished) < k:
                tokens = beams[i][0][1:]
                finished.append((tokens, score / length_penalty(len(tokens) + 1, alpha)))
        best_ended |= cands[0][2] == vocab.eos and cands[0][0] > -math.inf
        if len(finished) >= k or (stop == "best" and best_ended and len(finished) >= nbest):
            break
        beams = [(beams[i][0] + [t], score) for score, i, t in cands if t != vocab.eos][:k]
    return sorted(finished, key=lambda h: -h[1])


# --- length penalty and limits --------------------------------------------------------------

def test_length_penalty_hand_values():
    assert length_penalty(1, 1.0) == pytest.approx(1.0)
    assert length_penalty(7, 1.0) == pytest.approx(2.0)
    assert length_penalty(7, 0.5) == pytest.approx(math.sqrt(2.0))
    assert length_penalty(13, 2.0) == pytest.approx(9.0)
    assert length_penalty(20, 0.0) == pytest.approx(1.0)
    assert length_penalty(10, 0.6) == pytest.approx(((5 + 10) / 6) ** 0.6)
    torch.testing.assert_close(length_penalty(torch.tensor([1.0, 7.0]), 1.0),
                               torch.tensor([1.0, 2.0]))


def test_max_lengths_is_a_times_len_plus_b_capped():
    got = max_lengths(torch.tensor([3, 10, 1000, 0]), 1.5, 10, 100)
    assert got.tolist() == [14, 25, 100, 10]
    assert max_lengths(torch.tensor([0]), 0.0, 0, 100).tolist() == [1]


@pytest.mark.parametrize("a, b, length, limit", [
    (2.1, 0, 30, 63), (2.1, 10, 50, 115), (1.3, 10, 90, 127), (1.05, 0, 60, 63),
    (1.3, 10, 7, 19),  # 1.3 * 7 + 10 = 19.1
    (1.9999999, 0, 1, 1), (0.3333333, 5, 1, 5), (2.9999997, 0, 1, 2)])
def test_max_lengths_of_a_decimal_a_are_the_exact_products_floor(a, b, length, limit):
    """Before: 1.3 * 90 in binary floating point is 116.99999..., cut to 116 (found by review);
    then a 1e-6 tolerance rounded 1.9999999 * 1 up to 2."""
    assert max_lengths(torch.tensor([length]), a, b, 1000).tolist() == [limit]


@pytest.mark.parametrize("a", [1e19, 1e300, math.inf])
def test_a_huge_max_len_a_is_the_cap_not_an_overflow(a, tiny_model, make_src):
    """Before: a * |x| + b overflowed int64 to its minimum, clamped to 1: every output empty."""
    assert max_lengths(torch.tensor([3, 1]), a, 10, 100).tolist() == [100, 100]
    model = tiny_model(0, eos_bias=-1e4, max_positions=16)
    if math.isfinite(a):
        dec = DecodeConfig(max_len_a=a, max_len_b=0)
        assert len(greedy_search(model, make_src([5]), dec)[0].tokens) == 15


# --- greedy vs beam -------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_beam_of_one_equals_greedy(seed, tiny_model, make_src):
    model = tiny_model(seed)
    src = make_src(LENGTHS, seed)
    greedy = greedy_search(model, src, DecodeConfig(alpha=0.6))
    beam = beam_search(model, src, DecodeConfig(beam=1, alpha=0.6))
    assert len(greedy) == len(beam) == len(LENGTHS)
    assert any(len(h.tokens) > 0 for h in greedy)
    for g, b in zip(greedy, beam):
        assert len(b) == 1
        assert b[0].tokens == g.tokens
        assert b[0].logprob == pytest.approx(g.logprob, abs=1e-4)
        assert b[0].score == pytest.approx(g.score, abs=1e-4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_beam_search_matches_unbatched_reference(seed, tiny_model, make_src):
    model = tiny_model(seed)
    src = make_src(LENGTHS, seed)
    for k, alpha in ((3, 0.0), (4, 1.0)):
        config = DecodeConfig(beam=k, alpha=alpha, nbest=k, max_len_a=1.0, max_len_b=5)
        got = beam_search(model, src, config)
        with torch.no_grad():
            for row in range(len(LENGTHS)):
                ref = reference_beam_search(model, src[row], k, alpha, 1.0, 5)
                assert [h.tokens for h in got[row]] == [tokens for tokens, _ in ref]
                assert [h.score for h in got[row]] == pytest.approx([s for _, s in ref],
                                                                      abs=1e-4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stop_at_best_ended_matches_unbatched_reference(seed, tiny_model, make_src):
    """stop "best" (OpenNMT-py, CTranslate2): a sentence ends once a step's best candidate is
    EOS and nbest hypotheses are finished; each result is the reference's."""
    model = tiny_model(seed, eos_bias=2.0)
    src = make_src(LENGTHS, seed)
    for k, alpha, nbest in ((3, 0.0, 1), (4, 1.0, 1), (4, 1.0, 3)):
        config = DecodeConfig(beam=k, alpha=alpha, nbest=nbest, max_len_a=1.0, max_len_b=5,
                              stop="best")
        got = beam_search(model, src, config)
        with torch.no_grad():
            for row in range(len(LENGTHS)):
                ref = reference_beam_search(model, src[row], k, alpha, 1.0, 5, "best", nbest)
                assert [h.tokens for h in got[row]] == [tokens for tokens, _ in ref][:nbest]
                assert [h.score for h in got[row]] == pytest.approx(
                    [s for _, s in ref][:nbest], abs=1e-4)


def test_stop_at_best_ended_keeps_a_hypothesis_of_the_full_search(tiny_model, make_src):
    """Both rules follow the same beams; "best" only stops sooner. Its answer is one of the
    beam hypotheses the full search finishes, scoring no better than the full search's best."""
    model = tiny_model(1, eos_bias=2.0)
    src = make_src(LENGTHS, 1)
    for alpha in (0.0, 1.0):
        full = beam_search(model, src, DecodeConfig(beam=4, alpha=alpha, nbest=4))
        early = beam_search(model, src, DecodeConfig(beam=4, alpha=alpha, stop="best"))
        for e, f in zip(early, full):
            assert len(e) == 1 and len(f) == 4
            assert tuple(e[0].tokens) in {tuple(h.tokens) for h in f}
            assert e[0].score <= f[0].score + 1e-6


@pytest.mark.parametrize("beam", [1, 4])
def test_batch_rows_are_independent(beam, tiny_model, make_src):
    model = tiny_model(1)
    src = make_src(LENGTHS, 1)
    together = beam_search(model, src, DecodeConfig(beam=beam, nbest=beam))
    greedy_together = greedy_search(model, src, DecodeConfig())
    for row, n in enumerate(LENGTHS):
        alone = beam_search(model, src[row:row + 1, :n], DecodeConfig(beam=beam, nbest=beam))[0]
        assert [h.tokens for h in alone] == [h.tokens for h in together[row]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in together[row]],
                                                         abs=1e-4)
        greedy_alone = greedy_search(model, src[row:row + 1, :n], DecodeConfig())[0]
        assert greedy_alone.tokens == greedy_together[row].tokens


def test_wide_beam_is_exhaustive_and_beats_greedy(tiny_model, make_src, make_vocab):
    """Two real target tokens and at most 3 tokens + EOS: 15 possible outputs. A beam of 16
    holds every prefix, so beam search lists every output with its exact log-probability, and
    its best is the true optimum (hence at least greedy's)."""
    vocab = make_vocab(tgt_size=5, bos=1, eos=2, joint=False)
    model = tiny_model(3, eos_bias=0.0, vocab=vocab)
    src = make_src([5, 3], 3, vocab=vocab)
    outputs = [list(seq) for n in range(4) for seq in itertools.product([3, 4], repeat=n)]
    for alpha in (0.0, 1.0):
        beams = beam_search(model, src, DecodeConfig(beam=16, alpha=alpha, nbest=16,
                                                     max_len_a=0.0, max_len_b=4))
        greedy = greedy_search(model, src, DecodeConfig(alpha=alpha, max_len_a=0.0, max_len_b=4))
        for row in range(2):
            exact = {tuple(y): teacher_forced_logprob(model, src[row], y) for y in outputs}
            found = {tuple(h.tokens): h.logprob for h in beams[row]}
            assert found.keys() == exact.keys()
            for y, logprob in found.items():
                assert logprob == pytest.approx(exact[y], abs=1e-4)
            best = max(exact, key=lambda y: exact[y] / length_penalty(len(y) + 1, alpha))
            assert tuple(beams[row][0].tokens) == best
            assert beams[row][0].score >= greedy[row].score - 1e-4
            if alpha == 0.0:
                assert beams[row][0].logprob >= greedy[row].logprob - 1e-4


def test_beam_best_is_usually_no_worse_than_greedy(tiny_model, make_src):
    """Not an invariant (beam search can prune the greedy path), but it should hold on most
    sentences at alpha = 0, where both rank by raw log-probability."""
    wins = total = 0
    for seed in range(3):
        model = tiny_model(seed)
        src = make_src(LENGTHS, seed)
        greedy = greedy_search(model, src, DecodeConfig(alpha=0.0))
        beam = beam_search(model, src, DecodeConfig(beam=5, alpha=0.0))
        for g, b in zip(greedy, beam):
            total += 1
            wins += b[0].logprob >= g.logprob - 1e-4
    assert wins >= 0.8 * total


# --- hypotheses -----------------------------------------------------------------------------

@pytest.mark.parametrize("nbest", [1, 3, 4])
def test_nbest_has_nbest_entries_sorted_by_score(nbest, tiny_model, make_src):
    model = tiny_model(2)
    src = make_src(LENGTHS, 2)
    for hyps in beam_search(model, src, DecodeConfig(beam=4, alpha=1.0, nbest=nbest)):
        assert len(hyps) == nbest
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == nbest  # distinct hypotheses


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_score_is_logprob_over_length_penalty(alpha, tiny_model, make_src):
    model = tiny_model(0)
    src = make_src(LENGTHS, 0)
    beams = beam_search(model, src, DecodeConfig(beam=3, alpha=alpha, nbest=3))
    hyps = [h for row in beams for h in row]
    hyps += greedy_search(model, src, DecodeConfig(alpha=alpha))
    for h in hyps:
        assert h.score == pytest.approx(h.logprob / length_penalty(len(h.tokens) + 1, alpha),
                                        rel=1e-6)
        assert h.logprob < 0


def test_logprob_is_model_probability_of_tokens_plus_eos(tiny_model, make_src, vocab):
    model = tiny_model(1)
    src = make_src(LENGTHS, 1)
    beams = beam_search(model, src, DecodeConfig(beam=3, nbest=3))
    greedy = greedy_search(model, src, DecodeConfig())
    for row in range(len(LENGTHS)):
        for h in beams[row] + [greedy[row]]:
            assert not {vocab.bos, vocab.eos, vocab.pad} & set(h.tokens)
            assert h.logprob == pytest.approx(teacher_forced_logprob(model, src[row], h.tokens),
                                              abs=1e-3)


# --- length limits --------------------------------------------------------------------------

@pytest.mark.parametrize(("a", "b"), [(1.5, 10), (1.0, 2), (0.5, 3)])
def test_max_length_respected_and_eos_forced_there(a, b, tiny_model, make_src):
    """With EOS all but forbidden, every hypothesis runs to the limit, where EOS is forced:
    the output incl. EOS has floor(a * src_len + b) tokens (src_len counts the source EOS)."""
    model = tiny_model(0, eos_bias=-1e4)
    src = make_src(LENGTHS, 0)
    greedy = greedy_search(model, src, DecodeConfig(max_len_a=a, max_len_b=b))
    results = {"greedy": [[h] for h in greedy],
               "beam": beam_search(model, src,
                                   DecodeConfig(beam=3, nbest=3, max_len_a=a, max_len_b=b))}
    for hyps_per_row in results.values():
        for n, hyps in zip(LENGTHS, hyps_per_row):
            for h in hyps:
                assert len(h.tokens) <= a * n + b
                assert len(h.tokens) + 1 == max(int(a * n + b), 1)


def test_random_model_output_length_bounded(tiny_model, make_src):
    model = tiny_model(2, eos_bias=0.0)
    src = make_src(LENGTHS, 2)
    for row, n in enumerate(LENGTHS):
        for h in beam_search(model, src, DecodeConfig(beam=2, max_len_a=1.2, max_len_b=2))[row]:
            assert len(h.tokens) <= 1.2 * n + 2


def test_output_length_capped_by_position_table(tiny_model, make_src):
    model = tiny_model(0, eos_bias=-1e4, max_positions=16)
    src = make_src([12], 0)
    # the decoder reads BOS + 15 tokens (16 positions), then EOS is forced; before: 14 tokens
    assert len(greedy_search(model, src, DecodeConfig())[0].tokens) == 15
    assert len(beam_search(model, src, DecodeConfig(beam=2))[0][0].tokens) == 15


# --- attention ------------------------------------------------------------------------------

def _check_attention(h, n_real, width):
    assert h.attention is not None
    assert h.attention.shape == (len(h.tokens) + 1, width)
    torch.testing.assert_close(h.attention.sum(-1), torch.ones(len(h.tokens) + 1),
                               atol=1e-5, rtol=1e-5)
    assert torch.all(h.attention[:, n_real:] == 0)
    assert torch.all(h.attention >= 0)


def test_need_attention_rows_sum_to_one_over_real_source_positions(tiny_model, make_src):
    model = tiny_model(1)
    src = make_src(LENGTHS, 1)
    width = src.size(1)
    beams = beam_search(model, src, DecodeConfig(beam=3, nbest=3), need_attention=True)
    greedy = greedy_search(model, src, DecodeConfig(), need_attention=True)
    for row, n in enumerate(LENGTHS):
        for h in beams[row]:
            _check_attention(h, n, width)
        _check_attention(greedy[row], n, width)


def test_attention_of_batched_beam_equals_attention_alone(tiny_model, make_src):
    model = tiny_model(1)
    src = make_src(LENGTHS, 1)
    together = beam_search(model, src, DecodeConfig(beam=3), need_attention=True)
    for row, n in enumerate(LENGTHS):
        alone = beam_search(model, src[row:row + 1, :n], DecodeConfig(beam=3),
                            need_attention=True)[0][0]
        assert alone.tokens == together[row][0].tokens
        torch.testing.assert_close(together[row][0].attention[:, :n], alone.attention,
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("search", ["beam", "greedy", "sample"])
def test_a_hypothesis_attention_is_the_models_attention_over_its_tokens(search, tiny_model,
                                                                       make_src):
    """Each hypothesis's attention rows are those of one teacher-forced pass over its own
    tokens (coverage penalties and plots read them). Before, only self-consistency was
    tested: a wrong reorder of the attention history within a sentence passed (found by
    review)."""
    model, dec = tiny_model(1), DecodeConfig(beam=3, nbest=3)
    src = make_src(LENGTHS, 1)
    found = {"beam": lambda: beam_search(model, src, dec, need_attention=True),
             "greedy": lambda: [[h] for h in greedy_search(model, src, dec, True)],
             "sample": lambda: sample(model, src, dec, SamplingConfig(n=3, seed=1), True)}
    for row, hyps in enumerate(found[search]()):
        one = src[row:row + 1, :LENGTHS[row]]
        for h in hyps:
            with torch.no_grad():
                _, attn = model.decode(torch.tensor([[model.vocab.bos] + h.tokens]),
                                       model.encode(one), need_weights=True)
            torch.testing.assert_close(h.attention[:, :LENGTHS[row]], attn[0].float(),
                                       atol=1e-5, rtol=1e-5)


def test_no_attention_unless_asked(tiny_model, make_src):
    model = tiny_model(0)
    src = make_src([4, 2], 0)
    assert all(h.attention is None for h in greedy_search(model, src, DecodeConfig()))
    assert all(h[0].attention is None for h in beam_search(model, src, DecodeConfig(beam=2)))


@pytest.mark.parametrize(("need_attention", "coverage"), [(False, 0.0), (True, 0.0),
                                                          (True, 0.4)])
def test_shared_encoder_output_decodes_as_copied_rows(need_attention, coverage, tiny_model,
                                                      make_src, monkeypatch):
    """The Transformer's beams share one memory row per sentence (``SharedEncoderOut``): the
    hypotheses, scores and attention equal those of an encoder output copied per beam, also
    when sentences finish (and leave the batch) at different steps."""
    model = tiny_model(2)
    src = make_src(LENGTHS, 2)
    dec = DecodeConfig(beam=3, nbest=3, coverage=coverage)
    shared = beam_search(model, src, dec, need_attention=need_attention)
    encode = model.encode
    monkeypatch.setattr(model, "encode", lambda s: EncoderOut(encode(s).memory,
                                                              encode(s).src_pad))
    copied = beam_search(model, src, dec, need_attention=need_attention)
    assert isinstance(encode(src), SharedEncoderOut)
    assert len({max(len(h.tokens) for h in hyps) for hyps in shared}) > 1  # end at different steps
    for ours, theirs in zip(shared, copied):
        assert [h.tokens for h in ours] == [h.tokens for h in theirs]
        assert [h.score for h in ours] == pytest.approx([h.score for h in theirs], abs=1e-5)
        if need_attention:
            for a, b in zip(ours, theirs):
                torch.testing.assert_close(a.attention, b.attention)



def test_an_expanded_shared_encoder_output_refuses_an_arbitrary_row_order():
    """Before: ``reorder`` after ``expand`` gave one memory row per decoder row while the
    Transformer's cross-attention cache kept one per sentence: the next step failed on a shape
    (found by review). ``select``, which keeps each sentence's rows together, is the way."""
    out = SharedEncoderOut(torch.randn(2, 3, 4), torch.zeros(2, 3, dtype=torch.bool))
    assert out.reorder(torch.tensor([1, 0])).memory.size(0) == 2  # before expand: one per row
    expanded = out.expand(2)
    with pytest.raises(ValueError, match="select"):
        expanded.reorder(torch.tensor([2, 3, 0, 1]))
    kept = expanded.select(torch.tensor([2, 3, 2, 2]), 2)  # sentence 1's rows, twice
    torch.testing.assert_close(kept.memory, out.memory[[1, 1]])

# --- stopping a search from outside (a server's timed-out requests) -----------------------

@pytest.mark.parametrize("search", ["greedy", "beam", "sample"])
def test_a_stop_check_ends_the_search_before_the_next_step(search, tiny_model, make_src):
    """``stop_when``: the check runs before every decoder step; once True, SearchStopped."""
    model = tiny_model(0, eos_bias=-1e4)  # no EOS: the search would run to its length limit
    src, dec = make_src(LENGTHS, 0), DecodeConfig(beam=3, max_len_a=0, max_len_b=20)
    run = {"greedy": lambda: greedy_search(model, src, dec),
           "beam": lambda: beam_search(model, src, dec),
           "sample": lambda: sample(model, src, dec, SamplingConfig(n=2, seed=1))}[search]
    checks = []
    with stop_when(lambda: checks.append(None) or len(checks) > 4), \
            pytest.raises(SearchStopped):
        run()
    assert len(checks) == 5  # four decoder steps ran, the fifth did not
    assert run()  # outside the block the search runs again, to the end


# --- stop "best" on a scripted model ---------------------------------------------------------

class ScriptedModel:
    """A decoder whose next-token distribution is fixed per output prefix: ``script`` maps a
    prefix (token ids after BOS) to {token: probability}, the rest of the mass spread evenly
    over the other tokens but PAD and BOS (which get none); an unscripted prefix continues
    with token 6 (p 0.9, EOS 0.02). ``steps`` counts decoder calls."""

    V = 8  # pad 0, unk 1, bos 2, eos 3, real tokens 4..7

    def __init__(self, script: dict[tuple[int, ...], dict[int, float]]):
        self.vocab = VocabInfo(src_size=self.V, tgt_size=self.V, pad=0, bos=2, eos=3,
                               joint=True)
        self.cfg = SimpleNamespace(max_positions=1024)
        self.has_attention = False
        self.script, self.steps = script, 0

    def encode(self, src):
        return EncoderOut(torch.zeros(*src.shape, 1), src.eq(self.vocab.pad))

    def decode(self, prev, enc, state, need_weights=False):
        self.steps += 1
        state["prefix"] = torch.cat([state["prefix"], prev], 1) if state else prev
        rows = []
        for prefix in state["prefix"][:, 1:].tolist():
            given = self.script.get(tuple(prefix), {6: 0.9})
            others = [t for t in (1, 3, 4, 5, 6, 7) if t not in given]
            probs = torch.full((self.V,), (1.0 - sum(given.values())) / len(others))
            probs[[0, 2]] = 0.0
            for token, p in given.items():
                probs[token] = p
            rows.append(probs.log())
        return torch.stack(rows)[:, None], None

    def reorder_state(self, state, order):
        state["prefix"] = state["prefix"].index_select(0, order)


def scripted_beam(script, stop, beam, nbest):
    """(steps, [(tokens, logprob)]) of beam search on ``ScriptedModel(script)``: alpha 0 (the
    score is the log-probability), output limit 6 tokens incl. EOS."""
    model = ScriptedModel(script)
    dec = DecodeConfig(beam=beam, nbest=nbest, alpha=0.0, max_len_a=0.0, max_len_b=6, stop=stop)
    [hyps] = beam_search(model, torch.tensor([[5, 3]]), dec)
    return model.steps, [(h.tokens, h.logprob) for h in hyps]


def test_stop_best_waits_for_the_best_candidate_to_end():
    """Beam 3, nbest 1. Step 1: EOS ranks 2nd (p .3): the empty output is finished, but the
    best candidate (token 4, p .5) has not ended, so "best" goes on. Step 2: 4 EOS (.5 x .9)
    is the best candidate: "best" stops there with it; "beam" (2 of 3 finished) runs on to the
    length limit, 6 steps. Guards the stop rule's best-ended condition: stopping on any finished
    hypothesis, or on the 2nd candidate, would stop after step 1 with the empty output."""
    script = {(): {4: 0.5, 3: 0.3, 5: 0.1}, (4,): {3: 0.9}}
    steps, hyps = scripted_beam(script, "best", beam=3, nbest=1)
    assert steps == 2
    assert [tokens for tokens, _ in hyps] == [[4]]
    assert hyps[0][1] == pytest.approx(math.log(0.5 * 0.9), abs=1e-5)
    assert scripted_beam(script, "beam", beam=3, nbest=1)[0] == 6


def test_stop_best_remembers_that_the_best_ended_at_an_earlier_step():
    """Beam 3, nbest 2. Step 1: EOS is the best candidate (p .5), one finished. Step 2: 4 EOS
    (.3 x .4) ranks 2nd behind 4 6 (.3 x .5): the second finished hypothesis. "best" stops
    there (the best ended at step 1, nbest are finished); "beam" (2 of 3) runs on to the
    limit. Guards that the best-ended mark persists over steps."""
    script = {(): {3: 0.5, 4: 0.3, 5: 0.1}, (4,): {6: 0.5, 3: 0.4}}
    steps, hyps = scripted_beam(script, "best", beam=3, nbest=2)
    assert steps == 2
    assert [tokens for tokens, _ in hyps] == [[], [4]]
    assert [lp for _, lp in hyps] == pytest.approx([math.log(0.5), math.log(0.3 * 0.4)],
                                                   abs=1e-5)
    assert scripted_beam(script, "beam", beam=3, nbest=2)[0] == 6


# --- the candidates of a beam step ----------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 40), st.integers(1, 9),
       st.integers(1, 8), st.integers(0, 2**31 - 1))
def test_top_candidates_are_the_best_of_all_k_times_v(n, k, vocab, width, block, seed):
    """The blocked ranking returns what ranking all K * V candidates of a sentence returns:
    the same scores, in order, each finite one the score of the (beam, token) named beside
    it, no pair twice among those. Dead beams (-inf) and banned tokens (-inf) included; ``block``
    from 1 to beyond V."""
    width = min(width, k * vocab)
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(n, k, generator=gen)
    scores[torch.rand(n, k, generator=gen) < 0.3] = float("-inf")
    logp = torch.randn(n * k, vocab, generator=gen)
    logp[torch.rand(n * k, vocab, generator=gen) < 0.2] = float("-inf")
    top, beam, token = _top_candidates(scores, logp, width, block)
    every = (scores[:, :, None] + logp.view(n, k, vocab)).view(n, -1)  # (N, K*V)
    assert torch.equal(top, every.topk(width, dim=1).values)
    rows = torch.arange(n)[:, None] * k + beam
    finite = top.isfinite()
    assert torch.equal((scores.gather(1, beam) + logp[rows, token])[finite], top[finite])
    assert token.lt(vocab).all()
    named = [[p for p, s in zip(ps, ss) if s > float("-inf")]
             for ps, ss in zip((beam * vocab + token).tolist(), top.tolist())]
    assert all(len(set(p)) == len(p) for p in named)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5), st.integers(1, 40), st.integers(1, 8), st.integers(0, 2**31 - 1))
def test_blocked_argmax_is_argmax_with_its_first_tie(rows, vocab, block, seed):
    """Few distinct values (ties everywhere), -inf, whole -inf rows, V below, at and beyond
    ``block``: the same index as ``Tensor.argmax`` (the first maximum)."""
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.randint(0, 3, (rows, vocab), generator=gen).float()
    logp[torch.rand(rows, vocab, generator=gen) < 0.3] = float("-inf")
    logp[0, :] = float("-inf") if seed % 5 == 0 else logp[0, :]
    assert torch.equal(argmax(logp, block), logp.argmax(-1))
    assert torch.equal(argmax(logp.T.contiguous().T, block), logp.argmax(-1))  # (strided)
