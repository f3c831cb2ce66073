"""Step-wise decoding constraints (logit processors) shared by greedy, beam and sampling search.

At every step the search computes the model's log-probabilities for the next output position
of each row (a hypothesis, beam or sample), then passes them through each constraint in turn;
a constraint sets the log-probability of every token it disallows to -inf. A search never
extends a row with a -inf token, so a returned hypothesis satisfies every hard constraint; a
sentence left with no finite candidate has no output (reported per sentence, never replaced
by a violating one). There is no look-ahead: a search whose beams all run into a dead end
reports no output although one that satisfies the constraints may exist.

Constraints may also declare output lengths per sentence (``length``, ``min_length``,
``max_length``, counting the tokens before EOS): the search bans EOS before the minimum,
forces it at the maximum, and moves its own limit ``max_len_a * |x| + max_len_b`` up to the
minimum and down to the maximum (an exact length sets it).

Sentence indices are those of the caller's batch (row ``i`` of ``src``, or line ``i`` of
``Translator.translate``); a constraint holds per-sentence data indexed by them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch
from torch import Tensor

from xinda.data.vocab import VocabInfo

NEG_INF = float("-inf")


class Constraint:
    """Base class: override the batched hook ``apply`` or one of the per-row hooks
    ``allowed_tokens`` / ``banned_tokens``, and any of the length declarations. A constraint
    must not rely on state it changes while decoding (caches aside): with ``decode.workers``
    its hooks run in forked copies, whose changes the caller never sees.

    ``apply(step, prefix, sentence, logp)``:
        step      int, the 0-based output position being chosen (BOS not counted)
        prefix    (R, step + 1) long, each row's tokens so far, BOS first
        sentence  (R,) long, each row's sentence index in the caller's batch
        logp      (R, V) float, log-probabilities of the next token (-inf: already banned)
        returns   (R, V) float, ``logp`` with disallowed tokens at -inf (it may be modified in
                  place), or an (R, V) bool mask of allowed tokens that the search applies.
    Returning other finite values rescores tokens (a soft constraint): the hypotheses' scores
    then use them.

    Example, "output position i repeats the token at position j < i"::

        class Repeat(Constraint):
            def __init__(self, i, j):
                self.i, self.j = i, j

            def allowed_tokens(self, step, tokens, sentence):
                return [tokens[self.j]] if step == self.i else None
    """

    def apply(self, step: int, prefix: Tensor, sentence: Tensor, logp: Tensor) -> Tensor:
        cls = type(self)
        if (cls.allowed_tokens is Constraint.allowed_tokens
                and cls.banned_tokens is Constraint.banned_tokens):
            return logp
        allowed = torch.ones_like(logp, dtype=torch.bool)  # (R, V)
        for row, (tokens, sent) in enumerate(zip(prefix[:, 1:].tolist(), sentence.tolist())):
            only = self.allowed_tokens(step, tokens, sent)
            if only is not None:
                allowed[row] = False
                allowed[row, list(only)] = True
            banned = self.banned_tokens(step, tokens, sent)
            if banned:
                allowed[row, list(banned)] = False
        return allowed

    def allowed_tokens(self, step: int, tokens: list[int], sentence: int
                       ) -> Collection[int] | None:
        """Per row: the only tokens allowed at output position ``step`` after output
        ``tokens`` (BOS excluded, ``len(tokens) == step``), or None for no restriction."""
        return None

    def banned_tokens(self, step: int, tokens: list[int], sentence: int) -> Collection[int]:
        """Per row: tokens not allowed at output position ``step``."""
        return ()

    def sentences(self) -> int | None:
        """How many sentences it was built for (None: any number)."""
        return None

    def length(self, sentence: int) -> int | None:
        """The exact output length of ``sentence`` (tokens before EOS), or None."""
        return None

    def min_length(self, sentence: int) -> int | None:
        """At least this many tokens before EOS (default: ``length``)."""
        return self.length(sentence)

    def max_length(self, sentence: int) -> int | None:
        """At most this many tokens before EOS (default: ``length``)."""
        return self.length(sentence)


class TargetPrefix(Constraint):
    """Forced decoding: sentence s starts with ``prefixes[s]`` (target ids; [] = free)."""

    def __init__(self, prefixes: Sequence[Sequence[int]]):
        self.prefixes = [list(p) for p in prefixes]

    def sentences(self) -> int:
        return len(self.prefixes)

    def allowed_tokens(self, step, tokens, sentence):
        prefix = self.prefixes[sentence]
        return [prefix[step]] if step < len(prefix) else None

    def min_length(self, sentence):
        return len(self.prefixes[sentence]) or None


class Template(Constraint):
    """Sentence s has token ``fixed[s][i]`` at output position i; other positions are free.
    A fixed position p makes the output at least p + 1 tokens long."""

    def __init__(self, fixed: Sequence[dict[int, int]]):
        self.fixed = [dict(f) for f in fixed]

    def sentences(self) -> int:
        return len(self.fixed)

    def allowed_tokens(self, step, tokens, sentence):
        token = self.fixed[sentence].get(step)
        return None if token is None else [token]

    def min_length(self, sentence):
        return max(self.fixed[sentence], default=-1) + 1 or None


class ExactLength(Constraint):
    """Sentence s has exactly ``lengths[s]`` tokens before EOS (EOS banned before, forced
    there; the search's length limit becomes this length)."""

    def __init__(self, lengths: Sequence[int | None]):
        self.lengths = list(lengths)

    def sentences(self) -> int:
        return len(self.lengths)

    def length(self, sentence):
        return self.lengths[sentence]


class BanTokens(Constraint):
    """The target ids ``ids`` never appear in the output."""

    def __init__(self, ids: Collection[int]):
        self.ids = sorted(set(ids))

    def apply(self, step, prefix, sentence, logp):
        if self.ids:
            logp[:, self.ids] = NEG_INF
        return logp


class BanSourceTokens(Constraint):
    """No output token of sentence s is one of its source tokens ``src[s]`` (target ids:
    equal to the source ids with a joint vocabulary). The vocabulary's PAD, BOS and EOS are
    never banned."""

    def __init__(self, src: Tensor | Sequence[Sequence[int]], vocab: VocabInfo):
        rows = src.tolist() if isinstance(src, Tensor) else src
        special = {vocab.pad, vocab.bos, vocab.eos}
        self.tokens = [sorted(set(row) - special) for row in rows]

    def sentences(self) -> int:
        return len(self.tokens)

    def banned_tokens(self, step, tokens, sentence):
        return self.tokens[sentence]


class NoRepeatNgram(Constraint):
    """No n-gram occurs twice in the output (Paulus et al. 2018, "A deep reinforced model for
    abstractive summarization": a token that would complete an earlier n-gram is banned)."""

    def __init__(self, n: int):
        if n < 1:
            raise ValueError(f"NoRepeatNgram needs n >= 1, got {n}")
        self.n = n

    def apply(self, step, prefix, sentence, logp):
        n, out = self.n, prefix[:, 1:]  # (R, t) output so far
        if out.size(1) < n:
            return logp
        grams = out.unfold(1, n, 1)  # (R, t - n + 1, n)
        tail = out[:, out.size(1) - (n - 1):]  # (R, n - 1) the last n - 1 tokens
        hit = (grams[:, :, :-1] == tail[:, None]).all(-1)  # (R, t - n + 1)
        rows, cols = hit.nonzero(as_tuple=True)
        logp[rows, grams[rows, cols, -1]] = NEG_INF
        return logp


class _Reindexed(Constraint):
    """``inner`` seen through a map from the search's sentence indices to the caller's."""

    def __init__(self, inner: Constraint, index: Sequence[int]):
        self.inner, self.index = inner, list(index)
        self._index = torch.tensor(self.index, dtype=torch.long)

    def apply(self, step, prefix, sentence, logp):
        mapped = self._index.to(sentence.device)[sentence]
        return self.inner.apply(step, prefix, mapped, logp)

    def min_length(self, sentence):
        return self.inner.min_length(self.index[sentence])

    def max_length(self, sentence):
        return self.inner.max_length(self.index[sentence])


def reindex(constraints: Sequence[Constraint], index: Sequence[int]) -> list[Constraint]:
    """``constraints`` for a sub-batch whose sentence i is the caller's sentence ``index[i]``."""
    return [_Reindexed(c, index) for c in constraints]


def apply_constraints(constraints: Sequence[Constraint], step: int, prefix: Tensor,
                      sentence: Tensor, logp: Tensor) -> Tensor:
    """``logp`` (R, V) through every constraint in turn (bool masks applied as -inf)."""
    for constraint in constraints:
        out = constraint.apply(step, prefix, sentence, logp)
        logp = logp.masked_fill(~out, NEG_INF) if out.dtype == torch.bool else out
    return logp


def length_bounds(constraints: Sequence[Constraint], limits: Tensor,
                  cap: int) -> tuple[Tensor, Tensor]:
    """Per-sentence (min tokens before EOS (B,), output limit incl. EOS (B,)): the search's
    ``limits`` raised to every declared minimum + 1, lowered to every declared maximum + 1,
    and capped at ``cap`` (the model's position table)."""
    low = torch.zeros_like(limits)
    limits = limits.clone()
    for s in range(limits.numel()):
        mins = [m for c in constraints if (m := c.min_length(s)) is not None]
        maxs = [m for c in constraints if (m := c.max_length(s)) is not None]
        if mins:
            low[s] = max(mins)
            limits[s] = max(int(limits[s]), max(mins) + 1)
        if maxs:
            limits[s] = min(int(limits[s]), min(maxs) + 1)
    return low, limits.clamp(min=1, max=cap)
