"""Greedy and batched beam search over any ``Seq2SeqModel`` with incremental state.

Beam search keeps ``beam`` live hypotheses per sentence, ranks 2*beam candidates per step,
finalises those ending in EOS among the top ``beam`` ranks, and drops a sentence from the
batch once it has ``beam`` finished hypotheses (or hits its maximum length, where EOS is forced).
Finished hypotheses are ranked by the GNMT length-normalised score log P(y|x) / lp(y).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from xinda.config import DecodeConfig
from xinda.errors import XindaError
from xinda.models.base import Seq2SeqModel


@dataclass
class Hypothesis:
    tokens: list[int]  # target ids without BOS and EOS
    score: float  # log-probability / length penalty (what the ranking uses)
    logprob: float  # sum of token log-probabilities, EOS included
    attention: Tensor | None = field(default=None, repr=False)  # (len + 1, S) incl. EOS row


def length_penalty(length: int | Tensor, alpha: float):
    """GNMT length penalty (Wu et al. 2016, eq. 14): lp(Y) = ((5 + |Y|) / 6)^alpha."""
    return ((5.0 + length) / 6.0) ** alpha


def coverage_penalty(attention: Tensor, src_keep: Tensor, beta: float) -> float:
    """GNMT coverage penalty (Wu et al. 2016, eq. 14):
    cp = beta * sum_i log(min(sum_j a_ij, 1)), i over (non-pad) source positions, j over
    target steps. attention (T, S), src_keep (S,) bool."""
    coverage = attention.sum(0)[src_keep].clamp(min=1e-6, max=1.0)  # (S_real,)
    return beta * float(coverage.log().sum())


def max_lengths(src_len: Tensor, a: float, b: int, limit: int) -> Tensor:
    """Per-sentence output limit a * |x| + b, capped by the model's position table."""
    return (src_len.float() * a + b).long().clamp(min=1, max=limit)


def _step_logprobs(model: Seq2SeqModel, last: Tensor, enc, state: dict, need_attention: bool,
                   force_eos: Tensor) -> tuple[Tensor, Tensor | None]:
    """One decoder step -> log-probabilities (N, V) with BOS/PAD banned and EOS forced where
    ``force_eos`` (N,) is True; plus the step's source attention (N, S) when asked."""
    logits, attn = model.decode(last, enc, state, need_weights=need_attention)
    logp = torch.log_softmax(logits[:, -1].float(), dim=-1)  # (N, V)
    logp[:, model.vocab.pad] = float("-inf")
    logp[:, model.vocab.bos] = float("-inf")
    if force_eos.any():
        eos_col = logp[:, model.vocab.eos].clone()
        logp[force_eos] = float("-inf")
        logp[force_eos, model.vocab.eos] = eos_col[force_eos]
    return logp, None if attn is None else attn[:, -1].float()


def _output_limits(model: Seq2SeqModel, enc, dec: DecodeConfig) -> Tensor:
    """(B,) output length limits: a * |x| + b, below the model's position table (BOS first)."""
    return max_lengths((~enc.src_pad).sum(1), dec.max_len_a, dec.max_len_b,
                       model.cfg.max_positions - 1)


@torch.no_grad()
def greedy_search(model: Seq2SeqModel, src: Tensor, dec: DecodeConfig,
                  need_attention: bool = False) -> list[Hypothesis]:
    """Pick the most probable token at every step. src (B, S) -> one hypothesis per sentence
    (``dec``: max_len_a/b bound the length, alpha the GNMT length penalty of its score)."""
    vocab = model.vocab
    enc = model.encode(src)
    limits = _output_limits(model, enc, dec)
    batch = src.size(0)
    tokens = torch.full((batch, 1), vocab.bos, dtype=torch.long, device=src.device)
    logprob = torch.zeros(batch, device=src.device)
    done = torch.zeros(batch, dtype=torch.bool, device=src.device)
    attns, state = [], {}
    for step in range(int(limits.max())):
        logp, attn = _step_logprobs(model, tokens[:, -1:], enc, state, need_attention,
                                    step + 1 >= limits)
        best_lp, best = logp.max(dim=-1)  # (B,)
        best = best.masked_fill(done, vocab.pad)
        logprob += best_lp.masked_fill(done, 0.0)
        tokens = torch.cat([tokens, best[:, None]], dim=1)
        if attn is not None:
            attns.append(attn)
        done |= best.eq(vocab.eos)
        if done.all():
            break
    return [_greedy_hypothesis(tokens[i, 1:], float(logprob[i]), dec.alpha, vocab.eos,
                               torch.stack([a[i] for a in attns]) if attns else None)
            for i in range(batch)]


def _greedy_hypothesis(row: Tensor, logprob: float, alpha: float, eos: int,
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


@torch.no_grad()
def beam_search(model: Seq2SeqModel, src: Tensor, dec: DecodeConfig,
                need_attention: bool = False) -> list[list[Hypothesis]]:
    """Batched beam search of width ``dec.beam``. src (B, S) -> for each sentence its
    ``dec.nbest`` best hypotheses.

    Finished hypotheses are ranked by log P / lp(dec.alpha) + cp(dec.coverage); a coverage
    weight > 0 needs a model that returns source attention."""
    vocab, k, coverage = model.vocab, dec.beam, dec.coverage
    need_attention = need_attention or coverage > 0
    if coverage > 0 and not model.has_attention:
        raise XindaError("the coverage penalty needs an attention model; this one has none")
    batch, device = src.size(0), src.device
    enc = model.encode(src)
    limits = _output_limits(model, enc, dec)
    enc = enc.reorder(torch.arange(batch, device=device).repeat_interleave(k))
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: keep one
    beams = _Beams(torch.arange(batch, device=device),
                   torch.full((batch * k, 1), vocab.bos, dtype=torch.long, device=device),
                   scores, None)
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    state: dict = {}
    for step in range(int(limits.max())):
        force = (step + 1 >= limits[beams.alive]).repeat_interleave(k)
        logp, attn = _step_logprobs(model, beams.tokens[:, -1:], enc, state, need_attention, force)
        if attn is not None:
            hist = attn[:, None] if beams.attention is None else torch.cat(
                [beams.attention, attn[:, None]], 1)
            beams.attention = hist
        n = beams.alive.numel()
        cand = (beams.scores[:, :, None] + logp.view(n, k, -1)).view(n, -1)  # (N, K*V)
        top_scores, top_idx = cand.topk(2 * k, dim=1)  # (N, 2K)
        src_beam, token = top_idx // logp.size(-1), top_idx % logp.size(-1)
        is_eos = token.eq(vocab.eos) & top_scores.gt(float("-inf"))
        _finalise(beams, finished, top_scores, src_beam, is_eos, k, dec.alpha,
                  (coverage, ~enc.src_pad))
        keep_rank = (is_eos.long() * 2 * k + torch.arange(2 * k, device=device)).argsort(1)[:, :k]
        rows = (torch.arange(n, device=device)[:, None] * k + src_beam.gather(1, keep_rank))
        done = torch.tensor([len(finished[int(i)]) >= k for i in beams.alive], device=device)
        if done.all():
            break
        live = ~done
        rows = rows[live].view(-1)  # (N'*K,) rows of the previous step to continue
        model.reorder_state(state, rows)
        if not live.all():  # enc has one row per beam (N*K), like the state
            enc = enc.reorder(rows)
        new_tokens = token.gather(1, keep_rank)[live].view(-1, 1)
        beams = _Beams(beams.alive[live], torch.cat([beams.tokens[rows], new_tokens], 1),
                       top_scores.gather(1, keep_rank)[live],
                       None if beams.attention is None else beams.attention[rows])
    return [sorted(hyps, key=lambda h: -h.score)[:dec.nbest] for hyps in finished]


def _finalise(beams: _Beams, finished: list[list[Hypothesis]], top_scores: Tensor,
              src_beam: Tensor, is_eos: Tensor, k: int, alpha: float,
              coverage: tuple[float, Tensor]) -> None:
    """Move EOS candidates ranked within the top ``k`` into ``finished``.
    ``coverage`` = (beta, source keep mask (N*K, S)) for the GNMT coverage penalty."""
    beta, src_keep = coverage
    length = beams.tokens.size(1)  # BOS + tokens so far = |y| incl. the new EOS
    for n, rank in is_eos[:, :k].nonzero().tolist():
        sent = int(beams.alive[n])
        if len(finished[sent]) >= k:
            continue
        row = n * k + int(src_beam[n, rank])
        logprob = float(top_scores[n, rank])
        attn = None if beams.attention is None else beams.attention[row]
        score = logprob / length_penalty(length, alpha)
        if beta:
            score += coverage_penalty(attn, src_keep[row], beta)
        finished[sent].append(Hypothesis(beams.tokens[row, 1:].tolist(), score, logprob, attn))
