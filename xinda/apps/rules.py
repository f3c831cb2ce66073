"""The couplet and poem rules as decoding constraints (``xinda.decode.constraints``).

Both tasks are written character by character: the models are trained on text pre-tokenised
into characters, and sentencepiece writes each character as one piece "▁X" (the frequent
ones) or as two, "▁" then "X". ``CharacterTable`` reads a row's tokens back as characters, and
``CharacterRule`` turns a rule about character positions ("the character at position i must be
one of these") into the tokens allowed next: a one-piece character or "▁" at a character
boundary, the second piece of a two-piece character after "▁", and EOS exactly when the line
has its length in characters.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
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
FILL = "\u2047"  # "⁇": how a placeholder token (unk) reads back


@dataclass(frozen=True)
class CharacterTable:
    """How a vocabulary writes characters: char -> "▁X" id and/or bare "X" id."""

    one: dict[str, int]  # characters with a one-piece form "▁X"
    bare: dict[str, int]  # characters with a bare piece "X" (written after "▁")
    start: int  # the id of "▁"
    eos: int
    by_one: dict[int, str]  # the inverses
    by_bare: dict[int, str]

    @classmethod
    def of(cls, vocab: Vocab) -> CharacterTable:
        one, bare = {}, {}
        for i in range(len(vocab.sp)):
            piece = vocab.sp.id_to_piece(i)
            if vocab.sp.is_control(i) or vocab.sp.is_unknown(i):
                continue
            if len(piece) == 2 and piece[0] == WORD_START:
                one[piece[1]] = i
            elif len(piece) == 1 and piece != WORD_START:
                bare[piece] = i
        return cls(one, bare, vocab.sp.piece_to_id(WORD_START), vocab.eos,
                   {i: ch for ch, i in one.items()}, {i: ch for ch, i in bare.items()})

    def writable(self, ch: str) -> bool:
        return ch in self.one or ch in self.bare

    def check(self, ch: str, what: str) -> str:
        """``ch``, or a XindaError naming ``what`` it is when the model cannot write it."""
        if not self.writable(ch):
            raise XindaError(f"{what} {ch!r} is not a character this model can write")
        return ch

    def read(self, tokens: Sequence[int], fill: int | None = None) -> tuple[list[str], bool]:
        """The characters of ``tokens`` and whether the last one is still open (after "▁");
        the ``fill`` token reads as one character, FILL."""
        chars, open_ = [], False
        for t in tokens:
            if t == fill:
                chars.append(FILL)
            elif t == self.start:
                open_ = True
                continue
            elif open_ and t in self.by_bare:
                chars.append(self.by_bare[t])
            elif t in self.by_one:
                chars.append(self.by_one[t])
            open_ = False
        return chars, open_


class CharacterRule(Constraint):
    """Base of the character-level rules: subclasses say how long each line is (``chars``)
    and which characters may stand at position i (``choices``: a set, or None for any Han
    character, minus ``excluded``)."""

    def __init__(self, table: CharacterTable, fill: int | None = None):
        self.table, self.fill = table, fill
        self.han_one = [i for ch, i in table.one.items() if is_han(ch)]
        self.han_bare = [i for ch, i in table.bare.items() if is_han(ch)]

    def chars(self, sentence: int) -> int:
        raise NotImplementedError

    def choices(self, sentence: int, written: list[str]) -> Collection[str] | None:
        """The characters allowed at position ``len(written)``; None: any Han character."""
        return None

    def excluded(self, sentence: int, written: list[str]) -> Collection[str]:
        """Characters not allowed at position ``len(written)`` (with ``choices`` None)."""
        return ()

    def min_length(self, sentence: int) -> int:
        return self.chars(sentence)  # tokens: one per character at least

    def max_length(self, sentence: int) -> int:
        return 2 * self.chars(sentence)  # two per character at most

    def apply(self, step: int, prefix: Tensor, sentence: Tensor, logp: Tensor) -> Tensor:
        allowed = torch.zeros_like(logp, dtype=torch.bool)  # (R, V)
        for row, (tokens, s) in enumerate(zip(prefix[:, 1:].tolist(), sentence.tolist())):
            written, open_ = self.table.read(tokens, self.fill)
            if not open_ and len(written) >= self.chars(s):
                allowed[row, self.table.eos] = True
                continue
            self._allow(allowed[row], self.choices(s, written),
                        self.excluded(s, written), open_)
        return allowed

    def _allow(self, row: Tensor, choices: Collection[str] | None, excluded: Collection[str],
               open_: bool) -> None:
        """Mark in ``row`` (V,) the tokens that write an allowed character next."""
        t = self.table
        if choices is not None:
            if self.fill is not None and FILL in choices and not open_:
                row[self.fill] = True
            # after "▁": the bare piece; at a boundary: "▁X", else "▁" to open a two-piece one
            first = [t.bare.get(ch) if open_ else t.one.get(ch, t.start if ch in t.bare else None)
                     for ch in choices]
            row[[i for i in first if i is not None]] = True
            return
        row[self.han_bare if open_ else self.han_one] = True
        if not open_ and self.han_bare:
            row[t.start] = True
        pieces = t.bare if open_ else t.one  # "▁" stays: other characters start with it
        row[[pieces[ch] for ch in excluded if ch in pieces]] = False


class CoupletRules(CharacterRule):
    """The second line of each first line ``ups[s]``: as many characters; at a punctuation
    position the placeholder ``fill`` (the caller writes the first line's mark there);
    elsewhere a Han character that repeats the one at position j exactly where the first line
    repeats position j (``repetition_pattern``) and is new otherwise; optionally never the
    first line's character at the same position (``no_copy``) and, when the first line ends
    on an oblique tone, a level-tone last character (``tone``)."""

    def __init__(self, ups: Sequence[str], table: CharacterTable, fill: int,
                 no_copy: bool = False, tone: bool = False):
        super().__init__(table, fill)
        self.ups = list(ups)
        self.patterns = [repetition_pattern(up) for up in self.ups]
        self.no_copy, self.tone = no_copy, tone
        writable = [ch for ch in (*table.one, *table.bare) if is_han(ch)] if tone else []
        self.level = {ch for ch in writable if level_oblique(ch) == "平"}  # for ``tone`` only

    def chars(self, sentence: int) -> int:
        return len(self.ups[sentence])

    def choices(self, sentence: int, written: list[str]) -> Collection[str] | None:
        up, i = self.ups[sentence], len(written)
        if is_punctuation(up[i]):
            return {FILL}
        j = self.patterns[sentence][i]
        if j is not None:
            return {written[j]}
        if self.tone and i == len(up) - 1 and level_oblique(up[i]) == "仄":
            return self.level - set(written) - ({up[i]} if self.no_copy else set())
        return None

    def excluded(self, sentence: int, written: list[str]) -> Collection[str]:
        up = self.ups[sentence]
        return {*written, up[len(written)]} if self.no_copy else set(written)


class PoemRules(CharacterRule):
    """Poems of ``lengths[s]`` characters in lines of ``forms[s]``: the marks of
    ``layouts[s]`` (position -> mark) at their positions, Han characters elsewhere,
    ``heads[s]`` (the acrostic, or "") at the line starts, and with ``rhyme`` the last
    character of line 4 in the rhyme group of line 2's."""

    def __init__(self, layouts: Sequence[dict[int, str]], lengths: Sequence[int],
                 forms: Sequence[int], heads: Sequence[str], table: CharacterTable,
                 rhyme: bool = False):
        super().__init__(table)
        self.layouts, self.lengths, self.forms = list(layouts), list(lengths), list(forms)
        self.heads, self.rhyme = list(heads), rhyme
        self.groups: dict[str | None, set[str]] = {}
        for ch in (*table.one, *table.bare) if rhyme else ():  # for ``rhyme`` only
            if is_han(ch):
                self.groups.setdefault(rhyme_group(ch), set()).add(ch)

    def chars(self, sentence: int) -> int:
        return self.lengths[sentence]

    def choices(self, sentence: int, written: list[str]) -> Collection[str] | None:
        i, form = len(written), self.forms[sentence]
        line, column = divmod(i, form + 1)
        if i in self.layouts[sentence]:
            return {self.layouts[sentence][i]}
        if column == 0 and line < len(self.heads[sentence]):
            return {self.heads[sentence][line]}
        if self.rhyme and line == 3 and column == form - 1:
            group = rhyme_group(written[2 * form])  # line 2's last character
            return self.groups.get(group) if group is not None else None
        return None
