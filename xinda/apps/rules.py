"""The couplet and poem rules as decoding constraints (``xinda.decode.constraints``).

Both tasks are written one character per output position: the models are trained on text
pre-tokenised into characters, so a character is the piece "▁X" (or, for a rare one, "▁" +
"X"). ``CharacterTable`` keeps the one-piece characters; every rule below allows only those
at the free positions, so output position i is character i and the rules can speak of
positions. A character without a one-piece form cannot be written (it is rare by
construction: sentencepiece kept the frequent characters whole).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from xinda.data.vocab import Vocab
from xinda.decode.constraints import Constraint
from xinda.errors import XindaError
from xinda.evaluate.generation import (
    is_han,
    is_punctuation,
    level_oblique,
    repetition_pattern,
    rhyme_group,
)

WORD_START = "\u2581"  # sentencepiece's "▁"


@dataclass(frozen=True)
class CharacterTable:
    """The one-piece characters of a vocabulary: char -> id, id -> char, and a (V,) mask."""

    ids: dict[str, int]
    chars: dict[int, str]
    mask: Tensor  # (V,) bool, True for the ids of Han characters

    @classmethod
    def of(cls, vocab: Vocab) -> CharacterTable:
        ids = {}
        for i in range(len(vocab.sp)):
            piece = vocab.sp.id_to_piece(i)
            if len(piece) == 2 and piece[0] == WORD_START and not vocab.sp.is_control(i):
                ids[piece[1]] = i
        mask = torch.zeros(vocab.size, dtype=torch.bool)
        mask[[i for ch, i in ids.items() if is_han(ch)]] = True
        return cls(ids, {i: ch for ch, i in ids.items()}, mask)

    def id(self, ch: str, what: str) -> int:
        """The id of ``ch``; XindaError naming ``what`` it is when the model cannot write it."""
        if ch not in self.ids:
            raise XindaError(f"{what} {ch!r} is not a character this model can write")
        return self.ids[ch]

    def text(self, tokens: Sequence[int]) -> str:
        return "".join(self.chars.get(t, "?") for t in tokens)


class CoupletRules(Constraint):
    """The second line of each first line ``ups[s]``: as long as it; at a punctuation position
    the placeholder ``fill`` (the caller writes the first line's mark there); elsewhere a Han
    character that repeats the one at position j exactly where the first line repeats position
    j (``repetition_pattern``) and is new otherwise; optionally never the first line's character
    at the same position (``no_copy``) and, when the first line ends on an oblique tone, a
    level-tone last character (``tone``)."""

    def __init__(self, ups: Sequence[str], table: CharacterTable, fill: int,
                 no_copy: bool = False, tone: bool = False):
        self.ups, self.table, self.fill = list(ups), table, fill
        self.patterns = [repetition_pattern(up) for up in self.ups]
        self.no_copy, self.tone = no_copy, tone
        self.level = table.mask.clone()
        self.level[[i for ch, i in table.ids.items() if level_oblique(ch) != "平"]] = False

    def length(self, sentence: int) -> int:
        return len(self.ups[sentence])

    def apply(self, step: int, prefix: Tensor, sentence: Tensor, logp: Tensor) -> Tensor:
        allowed = self.table.mask.to(logp.device).expand_as(logp).clone()  # (R, V)
        for row, (tokens, s) in enumerate(zip(prefix[:, 1:].tolist(), sentence.tolist())):
            up = self.ups[s]
            if step >= len(up):
                allowed[row] = True  # the end: the search's length rule forces EOS
                continue
            if is_punctuation(up[step]):
                allowed[row] = False
                allowed[row, self.fill] = True
                continue
            j = self.patterns[s][step]
            if j is not None:
                allowed[row] &= torch.arange(allowed.size(1), device=logp.device) == tokens[j]
                continue
            allowed[row, tokens] = False  # a new character
            if self.no_copy and up[step] in self.table.ids:
                allowed[row, self.table.ids[up[step]]] = False
            if self.tone and step == len(up) - 1 and level_oblique(up[step]) == "仄":
                allowed[row] &= self.level.to(logp.device)
        return allowed


class PoemRules(Constraint):
    """Poems of ``lines[s]`` lines of ``forms[s]`` characters: the marks of ``layouts[s]``
    (position -> token) at their positions, Han characters elsewhere, ``heads[s]`` (acrostic:
    the first character of each line, or "") at the line starts, and with ``rhyme`` the last
    character of every even line in the rhyme group of line 2's."""

    def __init__(self, layouts: Sequence[dict[int, int]], lengths: Sequence[int],
                 forms: Sequence[int], heads: Sequence[Sequence[int]], table: CharacterTable,
                 rhyme: bool = False):
        self.layouts, self.lengths, self.forms = list(layouts), list(lengths), list(forms)
        self.heads, self.table, self.rhyme = list(heads), table, rhyme
        self.groups = {i: rhyme_group(ch) for ch, i in table.ids.items() if is_han(ch)}

    def length(self, sentence: int) -> int:
        return self.lengths[sentence]

    def apply(self, step: int, prefix: Tensor, sentence: Tensor, logp: Tensor) -> Tensor:
        allowed = self.table.mask.to(logp.device).expand_as(logp).clone()  # (R, V)
        for row, (tokens, s) in enumerate(zip(prefix[:, 1:].tolist(), sentence.tolist())):
            if step >= self.lengths[s]:
                allowed[row] = True  # the end: the search's length rule forces EOS
                continue
            line, column = divmod(step, self.forms[s] + 1)
            forced = self.layouts[s].get(step)
            if forced is None and column == 0 and line < len(self.heads[s]):
                forced = self.heads[s][line]
            if forced is not None:
                allowed[row] = False
                allowed[row, forced] = True
            elif self.rhyme and line % 2 == 1 and line > 1 and column == self.forms[s] - 1:
                group = self.groups.get(tokens[2 * self.forms[s]])  # line 2's last character
                if group is not None:
                    allowed[row, [i for i, g in self.groups.items() if g != group]] = False
        return allowed
