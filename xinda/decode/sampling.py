"""Sampling search: draw ``n`` outputs per sentence from the model's (reshaped) distribution.

Each step divides the allowed log-probabilities by a temperature, keeps the ``top_k`` most
probable tokens (Fan et al. 2018, "Hierarchical neural story generation") and then the
nucleus, the smallest set of tokens whose probability sums to at least ``top_p`` (Holtzman et
al. 2020, "The curious case of neural text degeneration"), and draws the next token from what
is left, renormalised. Draws come from one ``torch.Generator`` seeded by ``seed``: the same seed
gives the same samples, whatever the global RNG. A sample's score is the model's own
log-probability (constraints applied, but not temperature, top-k or top-p) over the GNMT length
penalty, so that samples rank like beam hypotheses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from pydantic import ValidationError
from torch import Tensor

from xinda.config import DecodeConfig, format_validation_error
from xinda.decode.constraints import Constraint
from xinda.decode.search import Choose, Hypothesis, argmax, decode_rows
from xinda.errors import XindaError
from xinda.models.base import Seq2SeqModel

NEG_INF = float("-inf")


def _default(name: str):
    """The default of ``DecodeConfig.<name>`` (each default is defined once, there)."""
    return DecodeConfig.model_fields[name].default


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling settings; the fields and defaults of ``DecodeConfig``'s sampling section."""

    temperature: float = _default("temperature")  # > 0; -> 0: greedy
    top_k: int = _default("top_k")  # 0 = all tokens
    top_p: float = _default("top_p")  # in (0, 1]
    n: int = _default("samples")  # samples per input sentence
    seed: int = _default("seed")

    @classmethod
    def from_decode(cls, dec: DecodeConfig) -> SamplingConfig | None:
        """The sampling settings of ``dec``, or None when it asks for beam/greedy search."""
        if not dec.sampling:
            return None
        return cls(dec.temperature, dec.top_k, dec.top_p, dec.samples, dec.seed)

    def __post_init__(self):
        try:  # DecodeConfig's checks (before: seed 2**64, top_k 2.5 or n True were tracebacks)
            DecodeConfig(sampling=True, temperature=self.temperature, top_k=self.top_k,
                         top_p=self.top_p, samples=self.n, seed=self.seed)
        except ValidationError as err:
            raise XindaError(format_validation_error(err, "sampling settings")) from None

    def generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        """A fresh generator seeded with ``seed``."""
        return torch.Generator(device=device).manual_seed(self.seed)


def top_k_filter(scores: Tensor, k: int) -> Tensor:
    """scores (R, V) with all but the ``k`` highest of each row at -inf (Fan et al. 2018)."""
    if k <= 0 or k >= scores.size(-1):
        return scores
    keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(
        -1, scores.topk(k, dim=-1).indices, True)  # exactly k (a tie at the k-th: any of them)
    return scores.masked_fill(~keep, NEG_INF)


def top_p_filter(scores: Tensor, p: float) -> Tensor:
    """scores (R, V) with every token outside the nucleus at -inf: the nucleus is the smallest
    set of most probable tokens whose softmax probability sums to >= p (Holtzman et al. 2020,
    eq. 2), and the tokens tied with its least probable one (which of them the sort put first
    would otherwise decide, by token id). The most probable token always stays."""
    if p >= 1.0:
        return scores
    ordered, order = scores.sort(dim=-1, descending=True)  # (R, V)
    probs = ordered.softmax(dim=-1)
    outside = (probs.cumsum(dim=-1) - probs) >= p  # mass before the token already >= p
    outside[:, 0] = False  # even where p rounds to 0 in the scores' dtype
    edge = ordered.masked_fill(outside, float("inf")).amin(dim=-1, keepdim=True)
    outside = ordered < edge  # (ties with the edge stay)
    return scores.masked_fill(outside.scatter(1, order, outside), NEG_INF)


def cooled(logp: Tensor, temperature: float) -> Tensor:
    """logp (R, V), each row with a finite entry, over ``temperature``, shifted so that each
    row's maximum is 0: however cold, the best token keeps a finite score; however hot (past
    logp's dtype), banned tokens stay at -inf and the others tie (-inf / inf is NaN)."""
    shifted = logp - logp.max(dim=-1, keepdim=True).values
    return torch.where(shifted.isfinite(), shifted / temperature, NEG_INF)


def sampler(cfg: SamplingConfig, generator: torch.Generator) -> Choose:
    """The ``choose`` of ``decode_rows`` that draws one token per row: logp (R, V) -> (R,).
    A temperature whose reciprocal overflows logp's dtype is greedy (argmax)."""
    def choose(logp: Tensor) -> Tensor:
        if cfg.temperature * torch.finfo(logp.dtype).max < 1:
            return argmax(logp)
        scores = top_p_filter(top_k_filter(cooled(logp, cfg.temperature), cfg.top_k),
                              cfg.top_p)
        probs = scores.softmax(dim=-1)  # (R, V)
        return torch.multinomial(probs, 1, generator=generator)[:, 0]
    return choose


@torch.no_grad()
def sample(model: Seq2SeqModel, src: Tensor, dec: DecodeConfig, cfg: SamplingConfig,
           need_attention: bool = False, constraints: Sequence[Constraint] = (),
           generator: torch.Generator | None = None) -> list[list[Hypothesis]]:
    """src (B, S) -> for each sentence ``cfg.n`` samples, best score first (``dec``: max_len_a/b
    bound the length, alpha the length penalty of the score). A sample that reaches a step where
    the ``constraints`` allow no token is dropped, so a sentence may get fewer (none: no output
    satisfies them). ``generator`` (default: ``cfg.generator()`` on src's device) lets a caller
    draw several batches from one stream."""
    generator = generator or cfg.generator(src.device)
    return decode_rows(model, src, dec, sampler(cfg, generator), cfg.n, need_attention,
                       constraints)
