"""Decoding constraints: every returned hypothesis satisfies them (greedy, beam n-best and
samples, Transformer and RNN), neutral constraints change nothing, forced prefixes score like
teacher forcing, and a sentence no output can satisfy gets none."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xinda.config import DecodeConfig
from xinda.decode.constraints import (
    BanSourceTokens,
    BanTokens,
    Constraint,
    ExactLength,
    NoRepeatNgram,
    TargetPrefix,
    Template,
    apply_constraints,
    reindex,
)
from xinda.decode.sampling import SamplingConfig, sample
from xinda.decode.search import beam_search, greedy_search

SPECS = {"transformer": {"arch": "transformer", "d_model": 32, "heads": 4, "ffn_dim": 64,
                         "encoder_layers": 2, "decoder_layers": 2, "tie_output": False},
         "rnn": {"preset": "rnn-bahdanau", "embed_dim": 16, "hidden_dim": 16}}
LENGTHS = [7, 3, 5, 6]
WORDS = list(range(4, 30))  # the real tokens of the test vocabulary
FEW = settings(max_examples=30, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def random_model(make_model):
    """``random_model(family, seed, eos_bias=None)``: the tiny model of ``family`` with an EOS
    bias (default: one that gives outputs of varied lengths); the RNN gets decisive logits
    (unit-variance source embeddings, output scaled by 4) like tests/models' searchable."""
    def make(family: str, seed: int, eos_bias: float | None = None):
        bias = {"transformer": 1.0, "rnn": 0.5}[family] if eos_bias is None else eos_bias
        model = make_model(SPECS[family], seed, eos_bias=bias)
        if family == "rnn":
            with torch.no_grad():
                model.src_embed.weight.normal_()
                model.output.weight *= 4
        return model
    return make


def teacher_forced_logprob(model, src_row, tokens):
    """log P(tokens + EOS | src) by one teacher-forced pass (BOS/PAD excluded from the
    softmax support as the search does: their probability is ~0 and ignored)."""
    vocab = model.vocab
    src = src_row[src_row.ne(vocab.pad)][None]
    with torch.no_grad():
        logits, _ = model.decode(torch.tensor([[vocab.bos] + tokens]), model.encode(src))
    logp = torch.log_softmax(logits[0].double(), -1)
    return sum(float(logp[t, y]) for t, y in enumerate(tokens + [vocab.eos]))


def all_outputs(model, src, constraints, dec=None):
    """{search name: per sentence, the list of returned hypotheses}."""
    dec = dec or DecodeConfig(alpha=0.6, max_len_a=1.0, max_len_b=4)
    greedy = greedy_search(model, src, dec, constraints=constraints)
    beam = beam_search(model, src, dec.model_copy(update={"beam": 3, "nbest": 3}),
                       constraints=constraints)
    samples = sample(model, src, dec, SamplingConfig(n=3, seed=7), constraints=constraints)
    return {"greedy": [[] if h is None else [h] for h in greedy], "beam": beam,
            "sample": samples}


# --- random constraints on random models ----------------------------------------------------

@st.composite
def constraint_sets(draw):
    """Per sentence a consistent draw: banned tokens, an optional exact length, a prefix and
    template tokens (from the allowed ones, inside the exact length), optional source ban and
    n-gram rule. Returns (spec dict, constraints)."""
    n = len(LENGTHS)
    banned = draw(st.sets(st.sampled_from(WORDS), max_size=5))
    free = [w for w in WORDS if w not in banned]
    exact = draw(st.lists(st.none() | st.integers(0, 8), min_size=n, max_size=n))
    prefixes, fixed = [], []
    for length in exact:
        room = 8 if length is None else length
        prefixes.append(draw(st.lists(st.sampled_from(free), max_size=min(3, room))))
        fixed.append(draw(st.dictionaries(st.integers(len(prefixes[-1]), max(room - 1, 0)),
                                          st.sampled_from(free), max_size=3))
                     if room > len(prefixes[-1]) else {})
    ngram = draw(st.sampled_from([0, 0, 1, 2, 3]))
    spec = {"banned": banned, "exact": exact, "prefixes": prefixes, "fixed": fixed,
            "ngram": ngram}
    constraints = [BanTokens(banned), ExactLength(exact), TargetPrefix(prefixes),
                   Template(fixed)] + ([NoRepeatNgram(ngram)] if ngram else [])
    return spec, constraints


def violations(tokens: list[int], s: int, spec: dict) -> list[str]:
    out = []
    if set(tokens) & spec["banned"]:
        out.append("banned token")
    if spec["exact"][s] is not None and len(tokens) != spec["exact"][s]:
        out.append("length")
    if tokens[: len(spec["prefixes"][s])] != spec["prefixes"][s]:
        out.append("prefix")
    if any(p >= len(tokens) or tokens[p] != t for p, t in spec["fixed"][s].items()):
        out.append("template")
    n = spec["ngram"]
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)] if n else []
    if len(grams) != len(set(grams)):
        out.append("repeated n-gram")
    return out


@pytest.mark.parametrize("family", ["transformer", "rnn"])
@FEW
@given(drawn=constraint_sets(), seed=st.integers(0, 3))
def test_every_output_satisfies_random_constraints(family, drawn, seed, random_model, make_src):
    spec, constraints = drawn
    model = random_model(family, seed)
    src = make_src(LENGTHS, seed)
    for name, results in all_outputs(model, src, constraints).items():
        for s, hyps in enumerate(results):
            for h in hyps:
                assert violations(h.tokens, s, spec) == [], (name, s, h.tokens)
                assert math.isfinite(h.logprob)
            if not spec["ngram"]:  # consistent draws are satisfiable
                assert hyps, (name, s)


@pytest.mark.parametrize("family", ["transformer", "rnn"])
def test_source_ban_holds_and_logprobs_are_the_models(family, random_model, make_src, vocab):
    model = random_model(family, 1)
    src = make_src(LENGTHS, 1, low=4)
    constraints = [BanSourceTokens(src, vocab), NoRepeatNgram(2)]
    for results in all_outputs(model, src, constraints).values():
        for s, hyps in enumerate(results):
            assert hyps
            for h in hyps:
                assert not set(h.tokens) & set(src[s].tolist())
                assert h.logprob == pytest.approx(
                    teacher_forced_logprob(model, src[s], h.tokens), abs=1e-3)


# --- neutral constraints, forced prefixes ---------------------------------------------------

@pytest.mark.parametrize("family", ["transformer", "rnn"])
def test_neutral_constraints_equal_plain_search(family, random_model, make_src):
    """A template with no fixed tokens (and rules that never fire) gives the same hypotheses
    and scores as no constraints, which is the search as it was before constraints."""
    model = random_model(family, 2)
    src = make_src(LENGTHS, 2)
    neutral = [Template([{}] * len(LENGTHS)), BanTokens([]), NoRepeatNgram(50),
               ExactLength([None] * len(LENGTHS)), TargetPrefix([[]] * len(LENGTHS))]
    plain, constrained = all_outputs(model, src, ()), all_outputs(model, src, neutral)
    for name in plain:
        assert [[(h.tokens, h.score, h.logprob) for h in hyps] for hyps in plain[name]] == \
            [[(h.tokens, h.score, h.logprob) for h in hyps] for hyps in constrained[name]]
    assert len({len(h[0].tokens) for h in plain["greedy"]}) > 1  # varied, non-trivial outputs


@pytest.mark.parametrize("family", ["transformer", "rnn"])
def test_forced_prefix_scores_as_teacher_forcing(family, random_model, make_src):
    """The forced part of a hypothesis is scored exactly by the model: a prefix forced with its
    own length as the exact length has the teacher-forced log P(prefix + EOS); a free
    continuation adds the teacher-forced log-probabilities of its tokens."""
    model = random_model(family, 3)
    src = make_src(LENGTHS, 3)
    prefixes = [[5, 9, 9, 12], [7], [20, 4], [29, 28, 27]]
    exact = [TargetPrefix(prefixes), ExactLength([len(p) for p in prefixes])]
    for results in all_outputs(model, src, exact).values():
        for s, hyps in enumerate(results):
            assert hyps and all(h.tokens == prefixes[s] for h in hyps)
            assert hyps[0].logprob == pytest.approx(
                teacher_forced_logprob(model, src[s], prefixes[s]), abs=1e-4)
    for results in all_outputs(model, src, [TargetPrefix(prefixes)]).values():
        for s, hyps in enumerate(results):
            for h in hyps:
                assert h.tokens[: len(prefixes[s])] == prefixes[s]
                assert h.logprob == pytest.approx(
                    teacher_forced_logprob(model, src[s], h.tokens), abs=1e-4)


# --- unsatisfiable constraints and lengths --------------------------------------------------

@pytest.mark.parametrize("family", ["transformer", "rnn"])
def test_unsatisfiable_sentence_gets_no_output(family, random_model, make_src):
    """Sentence 1 fixes position 5 but must have 3 tokens; sentence 3 is forced to a banned
    token. They get no hypothesis (greedy: None), the others theirs."""
    model = random_model(family, 0)
    src = make_src(LENGTHS, 0)
    constraints = [Template([{}, {5: 9}, {}, {0: 11}]), ExactLength([None, 3, None, None]),
                   BanTokens([11])]
    assert greedy_search(model, src, DecodeConfig(), constraints=constraints)[1] is None
    for name, results in all_outputs(model, src, constraints).items():
        assert results[1] == [] and results[3] == [], name
        assert results[0] and results[2], name


def test_banning_eos_leaves_no_output(random_model, make_src, vocab):
    model = random_model("transformer", 0)
    src = make_src(LENGTHS, 0)
    for results in all_outputs(model, src, [BanTokens([vocab.eos])]).values():
        assert results == [[]] * len(LENGTHS)


def test_declared_lengths_extend_and_tighten_the_limit(random_model, make_src):
    """With EOS all but impossible, outputs run to the limit: 0 * |x| + 3 = 3 incl. EOS by
    default, up to a template position 6 (7 tokens), down to an exact length 1."""
    model = random_model("transformer", 0, -1e4)
    src = make_src(LENGTHS, 0)
    dec = DecodeConfig(max_len_a=0.0, max_len_b=3)
    cases = [((), [2] * 4), ([Template([{6: 8}, {}, {}, {1: 9}])], [7, 2, 2, 2]),
             ([ExactLength([1, None, 9, 0])], [1, 2, 9, 0])]
    for constraints, lengths in cases:
        for results in all_outputs(model, src, constraints, dec).values():
            assert [len(hyps[0].tokens) for hyps in results] == lengths


# --- the hooks ------------------------------------------------------------------------------

class Repeat(Constraint):
    """Custom: output position i repeats the token at position j < i."""

    def __init__(self, i: int, j: int):
        self.i, self.j = i, j

    def allowed_tokens(self, step, tokens, sentence):
        return [tokens[self.j]] if step == self.i else None

    def min_length(self, sentence):
        return self.i + 1


class LastIn(Constraint):
    """Custom: the last token (before EOS) is one of ``ids``; the output is not empty."""

    def __init__(self, ids: set[int], eos: int):
        self.ids, self.eos = ids, eos

    def banned_tokens(self, step, tokens, sentence):
        return [self.eos] if not tokens or tokens[-1] not in self.ids else []


@pytest.mark.parametrize("family", ["transformer", "rnn"])
def test_custom_subclasses_hold(family, random_model, make_src, vocab):
    model = random_model(family, 1)
    src = make_src(LENGTHS, 1)
    ends = set(range(4, 18))
    found = 0
    for results in all_outputs(model, src, [Repeat(3, 1), LastIn(ends, vocab.eos)]).values():
        for hyps in results:
            for h in hyps:
                assert h.tokens[3] == h.tokens[1] and h.tokens[-1] in ends
            found += len(hyps)
    assert found > 0  # a look-ahead rule: greedy may miss it, beam and sampling less often


def test_no_repeat_ngram_hand_example():
    prefix = torch.tensor([[2, 5, 6, 5], [2, 7, 7, 7], [2, 5, 6, 7]])  # BOS first
    logp = torch.zeros(3, 10)
    out = NoRepeatNgram(2).apply(3, prefix, torch.arange(3), logp.clone())
    assert out[0].isinf().nonzero()[:, 0].tolist() == [6]  # "5 6" seen: 6 after 5 banned
    assert out[1].isinf().nonzero()[:, 0].tolist() == [7]
    assert not out[2].isinf().any()
    out = NoRepeatNgram(1).apply(3, prefix, torch.arange(3), logp.clone())
    assert out[2].isinf().nonzero()[:, 0].tolist() == [5, 6, 7]


def test_bool_masks_and_reindexed_sentences():
    """A bool mask is applied as -inf; ``reindex`` shows the caller's sentence indices."""
    prefixes = TargetPrefix([[4], [5], [6]])
    rows = torch.tensor([0, 1])  # the search's sentences 0 and 1 = the caller's 2 and 0
    logp = apply_constraints(reindex([prefixes], [2, 0]), 0, torch.full((2, 1), 2), rows,
                             torch.zeros(2, 10))
    assert logp.isfinite().nonzero().tolist() == [[0, 6], [1, 4]]
    assert reindex([ExactLength([1, 2, 3])], [2, 0])[0].max_length(0) == 3


def test_source_ban_keeps_special_tokens(vocab):
    ban = BanSourceTokens(torch.tensor([[5, 6, vocab.eos, vocab.pad]]), vocab)
    assert ban.banned_tokens(0, [], 0) == [5, 6]
