"""Greedy and batched beam search over any ``Seq2SeqModel`` with incremental state.

Beam search keeps ``beam`` live hypotheses per sentence, ranks 2*beam candidates per step,
finalises those ending in EOS among the top ``beam`` ranks, and drops a sentence from the
batch once it has ``beam`` finished hypotheses (or hits its maximum length, where EOS is forced).
Finished hypotheses are ranked by the GNMT score log P(y|x) / lp(y) + cp(x; y).

Every search takes ``constraints`` (``xinda.decode.constraints``): each step's
log-probabilities pass through them, no hypothesis is extended by a disallowed (-inf) token,
and a sentence with no output that satisfies them gets none (greedy: None; beam: []).
``decode_rows`` is the row-wise loop that greedy search and sampling share.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from fractions import Fraction

import torch
from torch import Tensor

from xinda.config import DecodeConfig
from xinda.decode.constraints import Constraint, apply_constraints, length_bounds
from xinda.errors import XindaError
from xinda.models.base import Seq2SeqModel


@dataclass
class Hypothesis:
    tokens: list[int]  # target ids without BOS and EOS
    score: float  # log-probability / length penalty + coverage penalty (ranks the n-best)
    logprob: float  # sum of token log-probabilities, EOS included
    attention: Tensor | None = field(default=None, repr=False)  # (len + 1, S) incl. EOS row


def length_penalty(length: int | Tensor, alpha: float):
    """GNMT length penalty (Wu et al. 2016, eq. 14): lp(Y) = ((5 + |Y|) / 6)^alpha."""
    return ((5.0 + length) / 6.0) ** alpha


def coverage_penalty(attention: Tensor, src_keep: Tensor, beta: float) -> float:
    """GNMT coverage penalty (Wu et al. 2016, eq. 14):
    cp = beta * sum_i log(min(sum_j a_ij, 1)), i over (non-pad) source positions, j over
    target steps, with each sum floored at 1e-6: a position never attended (outside every
    local window, say) costs beta * log(1e-6), not -inf. attention (T, S), src_keep (S,) bool."""
    coverage = attention.sum(0)[src_keep].clamp(min=1e-6, max=1.0)  # (S_real,)
    return beta * float(coverage.log().sum())


def max_lengths(src_len: Tensor, a: float, b: int, limit: int) -> Tensor:
    """Per-sentence output limit floor(a * |x| + b), capped by the model's position table.

    ``a`` counts as the decimal it is written as (1.3 * 90 = 117, where binary floating point
    gives 116.99999...), in exact rational arithmetic, so a huge ``a`` is the cap, not an
    integer overflow."""
    if not math.isfinite(a):
        return torch.full_like(src_len, limit, dtype=torch.long)
    exact_a = Fraction(repr(float(a)))
    return torch.tensor([min(limit, max(1, math.floor(exact_a * n + b)))
                         for n in src_len.tolist()], dtype=torch.long, device=src_len.device)


class SearchStopped(Exception):
    """A search gave up at a decoder step because the ``stop_when`` check said so."""


_STOP_CHECK: ContextVar[Callable[[], bool] | None] = ContextVar("xinda_stop_check", default=None)


@contextmanager
def stop_when(check: Callable[[], bool]) -> Iterator[None]:
    """Within the block (in this thread), every search calls ``check()`` before each decoder
    step and raises ``SearchStopped`` once it returns True: how a server stops decoding for
    requests that gave up."""
    token = _STOP_CHECK.set(check)
    try:
        yield
    finally:
        _STOP_CHECK.reset(token)


def check_stop() -> None:
    """Raise ``SearchStopped`` if the ``stop_when`` check of this thread says so."""
    if (check := _STOP_CHECK.get()) is not None and check():
        raise SearchStopped("the search was stopped")


def _step_logprobs(model: Seq2SeqModel, last: Tensor, enc, state: dict, need_attention: bool,
                   force_eos: Tensor, ban_eos: Tensor | None = None
                   ) -> tuple[Tensor, Tensor | None]:
    """One decoder step -> log-probabilities (N, V) with BOS/PAD banned, EOS banned where
    ``ban_eos`` (N,) and forced where ``force_eos`` (N,) is True; plus the step's source
    attention (N, S) when asked."""
    check_stop()
    logits, attn = model.decode(last, enc, state, need_weights=need_attention)
    logp = torch.log_softmax(logits[:, -1].float(), dim=-1)  # (N, V)
    logp[:, model.vocab.pad] = float("-inf")
    logp[:, model.vocab.bos] = float("-inf")
    if ban_eos is not None and ban_eos.any():
        logp[ban_eos, model.vocab.eos] = float("-inf")
    if force_eos.any():
        eos_col = logp[:, model.vocab.eos].clone()
        logp[force_eos] = float("-inf")
        logp[force_eos, model.vocab.eos] = eos_col[force_eos]
    return logp, None if attn is None else attn[:, -1].float()


def _output_limits(model: Seq2SeqModel, enc, dec: DecodeConfig,
                   constraints: Sequence[Constraint] = ()) -> tuple[Tensor, Tensor]:
    """(B,) minimum lengths (EOS banned before) and (B,) output length limits incl. EOS:
    a * |x| + b moved by the constraints' declared lengths, at most the model's position table
    (the decoder reads BOS and the output before EOS: max_positions - 1 tokens + EOS)."""
    cap = model.cfg.max_positions
    limits = max_lengths((~enc.src_pad).sum(1), dec.max_len_a, dec.max_len_b, cap)
    return length_bounds(constraints, limits, cap)


Choose = Callable[[Tensor], Tensor]  # (R, V) log-probabilities, some finite -> (R,) token ids


def argmax(logp: Tensor, block: int = 32) -> Tensor:
    """The greedy choice: the most probable token of each row (R, V) -> (R,), the first one
    on ties, as ``Tensor.argmax``: the first block holding the row's maximum, then the first
    maximum in it (on CPU, argmax over whole rows takes ~14x amax's time)."""
    first = _block_maxima(logp, block).argmax(-1, keepdim=True)  # (R, 1)
    rows = torch.arange(logp.size(0), device=logp.device)[:, None, None]
    token, token_logp = _block_tokens(logp, rows, first, block)  # (R, 1, block)
    return token[:, 0].gather(1, token_logp[:, 0].argmax(-1, keepdim=True))[:, 0]


def _block_maxima(logp: Tensor, block: int) -> Tensor:
    """Each row's maximum over each ``block`` of consecutive tokens, the last block shorter
    where V is no multiple of it: (R, V) -> (R, ceil(V / block))."""
    rows, vocab = logp.shape
    full = vocab // block
    block_max = logp[:, :full * block].view(rows, full, block).amax(-1)  # (R, full)
    if full * block < vocab:
        block_max = torch.cat([block_max, logp[:, full * block:].amax(-1, keepdim=True)], 1)
    return block_max


def _block_tokens(logp: Tensor, rows: Tensor, blocks: Tensor, block: int
                  ) -> tuple[Tensor, Tensor]:
    """The tokens of ``blocks`` (N, P) of ``rows`` (broadcast to them) and their
    log-probabilities, each (N, P, block); the last block's padding is named as the last token
    and scored -inf."""
    vocab = logp.size(-1)
    token = (blocks * block)[:, :, None] + torch.arange(block, device=logp.device)
    beyond = token >= vocab
    token = token.clamp(max=vocab - 1)
    return token, logp[rows, token].masked_fill(beyond, -math.inf)


@torch.no_grad()
def greedy_search(model: Seq2SeqModel, src: Tensor, dec: DecodeConfig,
                  need_attention: bool = False, constraints: Sequence[Constraint] = ()
                  ) -> list[Hypothesis | None]:
    """Pick the most probable allowed token at every step. src (B, S) -> one hypothesis per
    sentence, None where the ``constraints`` leave no allowed token at some step (``dec``:
    max_len_a/b bound the length, alpha the GNMT length penalty of its score)."""
    hyps = decode_rows(model, src, dec, argmax, 1, need_attention, constraints)
    return [h[0] if h else None for h in hyps]


@torch.no_grad()
def decode_rows(model: Seq2SeqModel, src: Tensor, dec: DecodeConfig, choose: Choose, n: int,
                need_attention: bool = False, constraints: Sequence[Constraint] = ()
                ) -> list[list[Hypothesis]]:
    """Extend ``n`` independent rows per sentence one token at a time, each by ``choose``
    among its allowed tokens (greedy search: argmax; sampling: a draw). src (B, S) -> for each
    sentence its finished rows as hypotheses, best score first; a row that reaches a step
    where every token is disallowed is dropped."""
    vocab, device = model.vocab, src.device
    sentence = torch.arange(src.size(0), device=device).repeat_interleave(n)  # (R,)
    enc = model.encode(src)
    low, limits = (x[sentence] for x in _output_limits(model, enc, dec, constraints))
    if n > 1:
        enc = enc.expand(n)
    rows = sentence.numel()
    tokens = torch.full((rows, 1), vocab.bos, dtype=torch.long, device=device)
    logprob = torch.zeros(rows, device=device)
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    failed = torch.zeros(rows, dtype=torch.bool, device=device)
    alive = torch.arange(rows, device=device)  # rows still decoded (of unfinished sentences)
    attns, state = [], {}
    for step in range(int(limits.max())):
        logp, attn = _step_logprobs(model, tokens[alive, -1:], enc, state, need_attention,
                                    step + 1 >= limits[alive], step < low[alive])
        live = ~done[alive]
        if constraints:
            logp[live] = apply_constraints(constraints, step, tokens[alive[live]],
                                           sentence[alive[live]], logp[live])
        failed[alive] |= live & ~logp.isfinite().any(-1)
        done |= failed
        going = ~done[alive]
        best = torch.full_like(alive, vocab.pad)  # finished rows: PAD
        best[going] = choose(logp if going.all() else logp[going])  # (the latter copies R x V)
        logprob[alive] += logp.gather(1, best[:, None])[:, 0].masked_fill(~going, 0.0)
        tokens = torch.cat([tokens, torch.full_like(sentence, vocab.pad)[:, None]], dim=1)
        tokens[alive, -1] = best
        if attn is not None:
            attns.append(attn.new_zeros(rows, attn.size(1)).index_copy_(0, alive, attn))
        done[alive] |= best.eq(vocab.eos)
        if done.all():
            break
        alive, enc = _drop_finished_sentences(model, state, enc, alive, done[alive], n)
    hyps: list[list[Hypothesis]] = [[] for _ in range(src.size(0))]
    for i in (~failed).nonzero()[:, 0].tolist():
        attn = torch.stack([a[i] for a in attns]) if attns else None
        hyps[int(sentence[i])].append(
            _row_hypothesis(tokens[i, 1:], float(logprob[i]), dec.alpha, vocab.eos, attn))
    return [sorted(row, key=lambda h: -h.score) for row in hyps]


def _drop_finished_sentences(model: Seq2SeqModel, state: dict, enc, alive: Tensor,
                             done: Tensor, n: int):
    """Stop decoding the sentences whose ``n`` rows are all done: the decoder state and the
    encoder output keep the other sentences' rows. alive (A,) rows, done (A,) -> both again."""
    keep = ~done.view(-1, n).all(1).repeat_interleave(n)  # (A,)
    if keep.all():
        return alive, enc
    kept = keep.nonzero()[:, 0]
    model.reorder_state(state, kept)
    return alive[kept], enc.select(kept, n)


def _row_hypothesis(row: Tensor, logprob: float, alpha: float, eos: int,
                    attn: Tensor | None) -> Hypothesis:
    ids = row.tolist()
    length = ids.index(eos) if eos in ids else len(ids)
    attn = None if attn is None else attn[: length + 1]
    return Hypothesis(ids[:length], logprob / length_penalty(length + 1, alpha), logprob, attn)


@dataclass
class _Beams:
    """Live beam state: N sentences x K beams, flattened to N*K rows."""

    alive: Tensor  # (N,) original sentence index of each live sentence
    tokens: Tensor  # (N*K, t) ids so far, starting with BOS
    scores: Tensor  # (N, K) cumulative log-probabilities
    attention: Tensor | None  # (N*K, t-1, S) attention history, when asked
    best_ended: Tensor  # (N,) bool: a step's best candidate has ended in EOS


@torch.no_grad()
def beam_search(model: Seq2SeqModel, src: Tensor, dec: DecodeConfig,
                need_attention: bool = False, constraints: Sequence[Constraint] = ()
                ) -> list[list[Hypothesis]]:
    """Batched beam search of width ``dec.beam``. src (B, S) -> for each sentence its
    ``dec.nbest`` best hypotheses that satisfy the ``constraints`` (fewer if fewer were found;
    none where every beam ran into a dead end of them: no look-ahead).

    Finished hypotheses are ranked by log P / lp(dec.alpha) + cp(dec.coverage); a coverage
    weight > 0 needs a model that returns source attention."""
    vocab, k, coverage = model.vocab, dec.beam, dec.coverage
    need_attention = need_attention or coverage > 0
    if coverage > 0 and not model.has_attention:
        raise XindaError("the coverage penalty needs an attention model; this one has none")
    batch, device = src.size(0), src.device
    enc = model.encode(src)
    low, limits = _output_limits(model, enc, dec, constraints)
    src_keep = ~enc.src_pad  # (B, S) for the coverage penalty
    enc = enc.expand(k)  # k rows per sentence
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: keep one
    beams = _Beams(torch.arange(batch, device=device),
                   torch.full((batch * k, 1), vocab.bos, dtype=torch.long, device=device),
                   scores, None, torch.zeros(batch, dtype=torch.bool, device=device))
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    state: dict = {}
    for step in range(int(limits.max())):
        sentence = beams.alive.repeat_interleave(k)  # (N*K,)
        logp, attn = _step_logprobs(model, beams.tokens[:, -1:], enc, state, need_attention,
                                    step + 1 >= limits[sentence], step < low[sentence])
        if constraints:
            logp = apply_constraints(constraints, step, beams.tokens, sentence, logp)
        if attn is not None:
            hist = attn[:, None] if beams.attention is None else torch.cat(
                [beams.attention, attn[:, None]], 1)
            beams.attention = hist
        n = beams.alive.numel()
        top_scores, src_beam, token = _top_candidates(beams.scores, logp, 2 * k)  # (N, 2K)
        is_eos = token.eq(vocab.eos) & top_scores.gt(float("-inf"))
        _finalise(beams, finished, top_scores, src_beam, is_eos, k, dec.alpha,
                  (coverage, src_keep))
        keep_rank = (is_eos.long() * 2 * k + torch.arange(2 * k, device=device)).argsort(1)[:, :k]
        rows = (torch.arange(n, device=device)[:, None] * k + src_beam.gather(1, keep_rank))
        kept = top_scores.gather(1, keep_rank)  # (N, K) scores of the beams to continue
        done = _sentences_done(beams, finished, is_eos, dec) | kept.isneginf().all(1)
        if done.all():
            break
        live = ~done
        rows = rows[live].view(-1)  # (N'*K,) rows of the previous step to continue
        model.reorder_state(state, rows)
        if not live.all():  # finished sentences leave the encoder output too
            enc = enc.select(rows, k)
        new_tokens = token.gather(1, keep_rank)[live].view(-1, 1)
        beams = _Beams(beams.alive[live], torch.cat([beams.tokens[rows], new_tokens], 1),
                       kept[live], None if beams.attention is None else beams.attention[rows],
                       beams.best_ended[live])
    return [sorted(hyps, key=lambda h: -h.score)[:dec.nbest] for hyps in finished]


def _sentences_done(beams: _Beams, finished: list[list[Hypothesis]], is_eos: Tensor,
                    dec: DecodeConfig) -> Tensor:
    """(N,) whether each live sentence's search ends after this step. ``dec.stop`` "beam": once
    it has ``beam`` finished hypotheses (fairseq); "best": once a step's best candidate has
    ended in EOS and ``nbest`` hypotheses are finished (OpenNMT-py, CTranslate2).
    is_eos (N, 2K): which ranked candidates end in EOS."""
    count = torch.tensor([len(finished[i]) for i in beams.alive.tolist()],
                         device=is_eos.device)
    done = count.ge(dec.beam)
    if dec.stop == "best":
        beams.best_ended |= is_eos[:, 0]
        done |= beams.best_ended & count.ge(min(dec.nbest, dec.beam))
    return done


def _top_candidates(scores: Tensor, logp: Tensor, width: int, block: int = 32
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """The ``width`` best one-token extensions of each sentence's beams: beam scores (N, K) and
    log-probabilities (N*K, V) -> their scores, source beams and tokens, each (N, width).

    Exact, without ranking all K * V candidates: each beam's vocabulary is cut into blocks of
    ``block`` tokens, a block bounded by its beam's score + its best log-probability. A
    candidate outside the ``width`` best-bounded blocks has ``width`` blocks whose best
    candidates score at least as high, so only those blocks' tokens are ranked (torch.topk
    over whole rows is the slower part of a CPU step: 3.4x less time at 64 x 5 x 8000).
    Candidates scored -inf (fewer finite ones than ``width``) may name any pair, repeated."""
    n, k = scores.shape
    block_max = _block_maxima(logp, block)  # (N*K, blocks)
    blocks = block_max.size(1)
    bound = (scores[:, :, None] + block_max.view(n, k, blocks)).view(n, -1)  # (N, K*blocks)
    picked = bound.topk(min(width, bound.size(1)), dim=1).indices  # (N, P)
    beam = picked // blocks
    row = (torch.arange(n, device=logp.device)[:, None] * k + beam)[:, :, None]
    token, token_logp = _block_tokens(logp, row, picked % blocks, block)  # (N, P, block)
    cand = (scores.gather(1, beam)[:, :, None] + token_logp).view(n, -1)  # (N, P*block)
    top_scores, top_idx = cand.topk(width, dim=1)
    return top_scores, beam.gather(1, top_idx // block), token.view(n, -1).gather(1, top_idx)


def _finalise(beams: _Beams, finished: list[list[Hypothesis]], top_scores: Tensor,
              src_beam: Tensor, is_eos: Tensor, k: int, alpha: float,
              coverage: tuple[float, Tensor]) -> None:
    """Move EOS candidates ranked within the top ``k`` into ``finished``, the best scores
    first where a sentence has room for fewer (with a coverage penalty, one step's candidates
    rank otherwise than by log-probability). ``coverage`` = (beta, source keep mask (B, S) of
    every sentence) for the GNMT coverage penalty."""
    beta, src_keep = coverage
    length = beams.tokens.size(1)  # BOS + tokens so far = |y| incl. the new EOS
    ended: dict[int, list[Hypothesis]] = {}
    for n, rank in is_eos[:, :k].nonzero().tolist():
        sent = int(beams.alive[n])
        row = n * k + int(src_beam[n, rank])
        logprob = float(top_scores[n, rank])
        attn = None if beams.attention is None else beams.attention[row]
        score = logprob / length_penalty(length, alpha)
        if beta:
            score += coverage_penalty(attn, src_keep[sent], beta)
        ended.setdefault(sent, []).append(
            Hypothesis(beams.tokens[row, 1:].tolist(), score, logprob, attn))
    for sent, hyps in ended.items():
        room = k - len(finished[sent])
        finished[sent] += sorted(hyps, key=lambda h: -h.score)[:max(room, 0)]
