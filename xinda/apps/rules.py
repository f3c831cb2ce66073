"""The couplet and poem rules as decoding constraints (``xinda.decode.constraints``).

Both tasks are written character by character: the models are trained on text pre-tokenised
into characters, and sentencepiece writes each character as one piece "▁X" (the frequent
ones) or as two, "▁" then "X". ``CharacterTable`` reads a row's tokens back as characters, and
``CharacterRule`` turns a rule about character positions ("the character at position i must be
one of these") into the tokens allowed next: a one-piece character or "▁" at a character
boundary, the second piece of a two-piece character after "▁", and EOS exactly when the line
has its length in characters. Each character is written one way only: in one piece where the
vocabulary has "▁X" (as sentencepiece writes it), else in two, so that no text is written
twice in an n-best list.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from functools import cache

import torch
from torch import Tensor

from xinda.data.vocab import WORD_START, Vocab
from xinda.decode.constraints import Constraint
from xinda.errors import XindaError
from xinda.evaluate.generation import (
    LEVEL,
    OBLIQUE,
    is_han,
    is_punctuation,
    last_han,
    level_oblique,
    repetition_pattern,
    rhyme_group,
)

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
    @cache  # one scan of the vocabulary per model: each request and batch asks for it
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


@dataclass(frozen=True)
class Pool:
    """Many allowed characters at once: ``chars`` minus the few in ``minus``. A rule keeps
    each ``chars`` set, so its token masks are built once (``CharacterRule.masks``)."""

    chars: frozenset[str]
    minus: frozenset[str] = frozenset()


Choice = Collection[str] | Pool | None


@dataclass
class _Marks:
    """One step's mask, collected row by row and then written with a few tensor operations:
    rows that start from a pool's mask (by ``open_``), then tokens allowed and taken off."""

    on: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))  # rows, ids
    off: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))
    pools: dict[frozenset[str] | None, tuple[list[int], list[int]]] = field(
        default_factory=dict)  # pool -> (rows, open_ as 0/1)

    @staticmethod
    def add(pairs: tuple[list[int], list[int]], row: int, ids: list[int]) -> None:
        pairs[0].extend([row] * len(ids))
        pairs[1].extend(ids)

    def mask(self, rule: CharacterRule, logp: Tensor) -> Tensor:
        """(R, V) bool: the allowed tokens of each row."""
        allowed = torch.zeros_like(logp, dtype=torch.bool)
        for chars, (rows, opens) in self.pools.items():
            masks = rule.masks(chars, logp.size(-1), logp.device)
            allowed[rows] = masks[torch.tensor(opens, dtype=torch.long, device=logp.device)]
        allowed[self.on] = True
        allowed[self.off] = False
        return allowed


class CharacterRule(Constraint):
    """Base of the character-level rules: subclasses say how long each line is (``chars``)
    and which characters may stand at position i (``choices``: a few characters, a ``Pool``,
    or None for any Han character minus ``excluded``).

    ``apply`` reads each row's characters in Python but builds the mask with a few tensor
    operations over all rows: many-character choices come from masks built once per set."""

    def __init__(self, table: CharacterTable, fill: int | None = None):
        self.table, self.fill = table, fill
        self.han = frozenset(ch for ch in (*table.one, *table.bare) if is_han(ch))
        self._masks: dict[tuple[frozenset[str] | None, int, torch.device], Tensor] = {}
        self._bare_only: dict[frozenset[str], frozenset[str]] = {}

    def chars(self, sentence: int) -> int:
        raise NotImplementedError

    def choices(self, sentence: int, written: list[str]) -> Choice:
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
        marks = _Marks()
        for row, (tokens, s) in enumerate(zip(prefix[:, 1:].tolist(), sentence.tolist())):
            written, open_ = self.table.read(tokens, self.fill)
            if len(written) >= self.chars(s):
                # the line is complete: EOS; a dead (-inf) beam row that wrote "▁" more: nothing
                marks.add(marks.on, row, [] if open_ else [self.table.eos])
                continue
            choice = self.choices(s, written)
            if choice is None or isinstance(choice, Pool):
                key = None if choice is None else choice.chars
                marks.pools.setdefault(key, ([], []))[0].append(row)
                marks.pools[key][1].append(int(open_))
                minus = self.excluded(s, written) if choice is None else choice.minus
                marks.add(marks.off, row, self._taken(choice, minus, open_))
            else:
                marks.add(marks.on, row, self._tokens(choice, open_))
        return marks.mask(self, logp)

    def _tokens(self, choices: Collection[str], open_: bool) -> list[int]:
        """The tokens that write one of a few ``choices`` next."""
        t, two = self.table, self.bare_only(frozenset(choices))
        if open_:  # after "▁": the bare piece of a two-piece character
            return [t.bare[ch] for ch in two]
        # at a boundary: "▁X", or "▁" to open a two-piece one
        ids = [t.one[ch] for ch in choices if ch in t.one] + [t.start] * bool(two)
        return ids + [self.fill] * (self.fill is not None and FILL in choices)

    def _taken(self, pool: Pool | None, minus: Collection[str], open_: bool) -> list[int]:
        """The tokens to take off a pool's mask (None: any Han character): those of the
        characters ``minus``, and "▁" when no two-piece character of the pool is left."""
        t = self.table
        pieces = t.bare if open_ else t.one
        ids = [pieces[ch] for ch in minus if ch in pieces]
        chars = self.han if pool is None else pool.chars
        if not open_ and self.bare_only(chars) <= set(minus):
            ids.append(t.start)
        return ids

    def bare_only(self, chars: frozenset[str]) -> frozenset[str]:
        """The characters of ``chars`` written in two pieces ("▁" + bare): those without a
        one-piece form."""
        if chars not in self._bare_only:
            t = self.table
            self._bare_only[chars] = frozenset(
                ch for ch in chars if ch not in t.one and ch in t.bare)
        return self._bare_only[chars]

    def masks(self, chars: frozenset[str] | None, size: int, device: torch.device) -> Tensor:
        """(2, size) bool, built once: the tokens that write a character of ``chars`` (None:
        any Han character) next at a character boundary (row 0) and after "▁" (row 1)."""
        key = (chars, size, device)
        if key not in self._masks:
            t, pool = self.table, self.han if chars is None else chars
            two = self.bare_only(pool)
            mask = torch.zeros(2, size, dtype=torch.bool)
            mask[0, [t.one[ch] for ch in pool if ch in t.one]] = True
            mask[0, t.start] = bool(two)  # "▁" opens a two-piece character
            mask[1, [t.bare[ch] for ch in two]] = True
            self._masks[key] = mask.to(device)
        return self._masks[key]


class CoupletRules(CharacterRule):
    """The second line of each first line ``ups[s]``: as many characters; at a punctuation
    position the placeholder ``fill`` (the caller writes the first line's mark there);
    elsewhere a Han character that repeats the one at position j exactly where the first line
    repeats position j (``repetition_pattern``) and is new otherwise; optionally never the
    first line's character at the same position (``no_copy``) and, when the first line ends
    on an oblique tone, a level-tone last character (``tone``, ``tone_position``).
    ``given``: the first lines as the user wrote them, when ``ups`` are them as the model
    reads them (``as_written``: 髮 and 發 both read 发): the repetitions and the tone are
    theirs."""

    def __init__(self, ups: Sequence[str], table: CharacterTable, fill: int,
                 no_copy: bool = False, tone: bool = False,
                 given: Sequence[str] | None = None):
        super().__init__(table, fill)
        self.ups, given = list(ups), list(ups if given is None else given)
        self.patterns = [repetition_pattern(line) for line in given]
        self.no_copy = no_copy
        level = (ch for ch in self.han if level_oblique(ch) == LEVEL)
        self.level = frozenset(level if tone else ())  # ``tone``
        self.tone_at = [tone_position(line) if tone else None for line in given]

    def chars(self, sentence: int) -> int:
        return len(self.ups[sentence])

    def choices(self, sentence: int, written: list[str]) -> Choice:
        up, i = self.ups[sentence], len(written)
        if is_punctuation(up[i]):
            return {FILL}
        j = self.patterns[sentence][i]
        if j is not None:
            return {written[j]}
        if i == self.tone_at[sentence]:
            return Pool(self.level, frozenset(written) | ({up[i]} if self.no_copy else set()))
        return None

    def excluded(self, sentence: int, written: list[str]) -> Collection[str]:
        up = self.ups[sentence]
        return {*written, up[len(written)]} if self.no_copy else set(written)


def tone_position(up: str) -> int | None:
    """Where a second line of ``up`` must have a level tone (上仄下平, as ``tone_rule_rate``
    scores it): when the last Han character of ``up`` is oblique, the second line's last
    character (its last Han one, at ``up``'s last position without punctuation), or the
    first position of that character when it repeats an earlier one; else None."""
    end = last_han(up)
    if end is None or level_oblique(end) != OBLIQUE:
        return None
    last = max(i for i, ch in enumerate(up) if not is_punctuation(ch))
    first = repetition_pattern(up)[last]
    return last if first is None else first


class PoemRules(CharacterRule):
    """Poems of ``lengths[s]`` characters in lines of ``forms[s]``: the marks of
    ``layouts[s]`` (position -> mark) at their positions, Han characters elsewhere,
    ``heads[s]`` (the acrostic, or "") at the line starts, and with ``rhyme`` the last
    character of line 4 in the rhyme group of line 2's (which must have one)."""

    def __init__(self, layouts: Sequence[dict[int, str]], lengths: Sequence[int],
                 forms: Sequence[int], heads: Sequence[str], table: CharacterTable,
                 rhyme: bool = False):
        super().__init__(table)
        self.layouts, self.lengths, self.forms = list(layouts), list(lengths), list(forms)
        self.heads, self.rhyme = list(heads), rhyme
        groups: dict[str | None, set[str]] = {}
        for ch in (*table.one, *table.bare) if rhyme else ():  # for ``rhyme`` only
            if is_han(ch):
                groups.setdefault(rhyme_group(ch), set()).add(ch)
        self.groups = {group: frozenset(chars) for group, chars in groups.items()}
        # line 2's last character needs a rhyme group (pypinyin lacks a reading of some)
        self.rhymable = frozenset().union(*(c for g, c in self.groups.items() if g is not None))

    def chars(self, sentence: int) -> int:
        return self.lengths[sentence]

    def choices(self, sentence: int, written: list[str]) -> Choice:
        i, form = len(written), self.forms[sentence]
        line, column = divmod(i, form + 1)
        if i in self.layouts[sentence]:
            return {self.layouts[sentence][i]}
        if column == 0 and line < len(self.heads[sentence]):
            return {self.heads[sentence][line]}
        if self.rhyme and line == 1 and column == form - 1:
            return Pool(self.rhymable)
        if self.rhyme and line == 3 and column == form - 1:
            group = rhyme_group(written[2 * form])  # line 2's last character
            return Pool(self.groups[group])
        return None
