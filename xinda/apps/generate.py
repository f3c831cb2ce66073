"""Writing couplets and poems with a trained model: the prompts become source lines, the rules
of ``rules`` constrain the search, and the output pieces become characters again.

A line whose rules no hypothesis can satisfy comes back as an ``Output`` with ``error`` set
(never a line that breaks them).
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from xinda.apps import couplet, poetry
from xinda.apps.corpus import to_simplified
from xinda.apps.poetry import FORMS, source_text, template
from xinda.apps.rules import CharacterTable, CoupletRules, PoemRules
from xinda.config import MAX_ROWS, DecodeConfig
from xinda.decode.translator import Translation, Translator
from xinda.errors import XindaError
from xinda.evaluate.generation import is_han, is_punctuation
from xinda.utils import check_lines, visible_text

log = logging.getLogger("xinda")


@dataclass(frozen=True)
class Output:
    text: str  # "" when error is set
    score: float
    error: str | None = None


@dataclass(frozen=True)
class PoemPrompt:
    keywords: tuple[str, ...] = ()  # words the poem is about (the source side)
    form: int = 7  # characters per line: 5 or 7
    acrostic: str = ""  # 藏头: the first character of each line (then as many lines)

    def check(self, where: str) -> None:
        if type(self.form) is not int or self.form not in FORMS:  # (5.0 and True are not)
            raise XindaError(f"{where}: form must be {' or '.join(map(str, FORMS))}, "
                             f"got {self.form!r}")
        if isinstance(self.keywords, str) or not isinstance(self.keywords, (tuple, list)):
            hint = (f" (split_keywords({self.keywords!r}) splits one string)"
                    if isinstance(self.keywords, str) else "")
            raise XindaError(f"{where}: keywords must be a tuple of words, got "
                             f"{type(self.keywords).__name__}{hint}")
        for k, word in enumerate(self.keywords, start=1):
            if not isinstance(word, str) or not visible_text(word).strip():
                raise XindaError(f"{where}: keyword {k} must be a word, got {word!r}")
        bad = [ch for ch in self.acrostic if not is_han(ch)]
        if bad:
            raise XindaError(f"{where}: acrostic characters must be Han characters, got "
                             f"{''.join(bad)!r}")
        if not self.keywords and not self.acrostic:
            raise XindaError(f"{where}: give keywords or an acrostic")

    def length(self) -> int:
        """The poem's characters, punctuation included (``template``)."""
        return template(self.form, len(self.acrostic) or 4)[1]

    def fixed(self) -> str:
        """The characters the poem must hold: its acrostic and its punctuation marks."""
        return self.acrostic + "".join(template(self.form, len(self.acrostic) or 4)[0].values())

    def source(self) -> str:
        """The source line the model reads: the form word, then the keywords (or, without
        keywords, the acrostic characters)."""
        return source_text(self.form, self.keywords or tuple(self.acrostic))


def _outputs(results: list[list[Translation]], texts: list[list[str]]) -> list[list[Output]]:
    return [[Output("", float("-inf"), t.error) if t.error else Output(text, t.score)
             for t, text in zip(nbest, line_texts)]
            for nbest, line_texts in zip(results, texts)]


def first_line_characters(line: str) -> str:
    """``line`` without whitespace, control characters, invisible format characters (a BOM,
    zero-width spaces) and combining marks (accents, variation selectors): what takes a
    position in a couplet."""
    return "".join(c for c in visible_text(line)
                   if c != " " and unicodedata.category(c) not in ("Cf", "Mn", "Me"))


def is_first_line(line: str) -> bool:
    """Whether ``line`` can start a couplet: it has a character besides punctuation."""
    return not all(map(is_punctuation, first_line_characters(line)))


def as_written(text: str, table: CharacterTable) -> str:
    """``text`` with each character the model cannot write, but can in its simplified form
    (OpenCC ``t2s``, one character at a time), in that form: a traditional prompt to a model
    of simplified text, as the recipes' corpora are, reads and is kept apart (``no_copy``) as
    the characters the model knows."""
    def written(ch: str) -> str:
        if table.writable(ch) or len(simple := to_simplified(ch)) != 1:
            return ch
        return simple if table.writable(simple) else ch
    return "".join(map(written, text))


def check_source_fits(translator: Translator, source: str, where: str,
                      options: dict | None = None) -> None:
    """A XindaError unless the model reads ``source`` whole: a cut source would give a second
    line as long as the whole first line written from a part of it, a poem without its last
    keywords. ``options``: what ``translate`` takes; its decode settings count
    (``decode.max_input_len``)."""
    dec = translator.decode_settings({k: v for k, v in (options or {}).items()
                                      if k in DecodeConfig.model_fields})
    limit = translator.source_limit(dec)
    if (size := len(translator.source_ids(source, False, where))) > limit:
        named = ("decode.max_input_len" if limit == dec.max_input_len
                 else "the model's position table")
        raise XindaError(f"{where} of {size} tokens; the model reads at most {limit} "
                         f"({named}): give a shorter one")


def check_output_fits(translator: Translator, length: int, where: str, fixed: str = ""
                      ) -> None:
    """A XindaError unless the model can write an output of ``length`` characters: a token
    each at least, two for each character of ``fixed`` (the output's acrostic and marks)
    that the vocabulary writes in two pieces (before, the search found none and said only
    that)."""
    one = CharacterTable.of(translator.tgt_vocab).one
    tokens = length + sum(ch not in one for ch in fixed)
    if tokens > (writes := translator.model.cfg.max_positions - 1):
        raise XindaError(f"{where}: the output takes at least {tokens} tokens; the model "
                         f"writes at most {writes} (its position table)")


TASKS = {couplet.SIDES: "couplet", poetry.SIDES: "poetry"}  # (src_lang, tgt_lang) -> task


def model_task(translator: Translator) -> str:
    """"couplet", "poetry" or "translate": what the model was prepared for, by its data's
    file suffixes (the recipes' corpora: up -> down, kw -> poem)."""
    data = translator.cfg.data
    return TASKS.get((data.src_lang, data.tgt_lang), "translate")


def _check_characters(translator: Translator, task: str) -> None:
    """The rules count output tokens as characters: the model's targets must have been
    pre-tokenised into characters. A model of another ``task`` is warned about (its outputs
    keep the rules, but it learnt another mapping; not refused: its data may be named
    otherwise)."""
    if (found := model_task(translator)) != task:
        data = translator.cfg.data
        log.warning("this model was prepared as a %s model (%s -> %s), not as a %s model (%s "
                    "-> %s)", found, data.src_lang, data.tgt_lang, task,
                    *next(sides for sides, name in TASKS.items() if name == task))
    pretok = translator.tgt_text.pretok
    if pretok != "char":
        raise XindaError(f"couplets and poems need a model whose targets are single characters "
                         f"(data.pretok_tgt: char); this one has pretok_tgt {pretok!r}")


def write_couplets(translator: Translator, ups: Sequence[str], nbest: int = 1,
                   no_copy: bool = False, tone: bool = False, **options) -> list[list[Output]]:
    """The ``nbest`` best second lines of each first line (``CoupletRules``); punctuation of
    the first line is copied to the same positions. ``options``: decode settings (beam, ...).
    Whitespace, control and format characters are not part of a first line
    (``first_line_characters``); a first line of nothing else, or of punctuation only, is a
    XindaError."""
    _check_characters(translator, "couplet")
    table = CharacterTable.of(translator.tgt_vocab)
    given = [first_line_characters(up) for up in check_lines(ups, "first lines")]
    lines = [as_written(line, table) for line in given]
    for i, line in enumerate(lines, start=1):
        if not is_first_line(line):
            raise XindaError(f"first line {i} is empty (or control characters or punctuation "
                             "only): a couplet needs a first line")
        check_source_fits(translator, line, f"first line {i}", options)
        check_output_fits(translator, len(line), f"first line {i}")
    rules = CoupletRules(lines, table, translator.tgt_vocab.unk, no_copy=no_copy, tone=tone,
                         given=given)
    _room_for(rules, len(lines), options)
    _beam_search(translator, options, nbest)
    results = translator.translate(lines, constraints=[rules], nbest=nbest, **options)
    texts = [[_restore_punctuation(t.text, up) for t in nbest_list]
             for nbest_list, up in zip(results, lines)]
    return _outputs(results, texts)


def _beam_search(translator: Translator, options: dict, nbest: int) -> None:
    """Decode settings for beam search, also with a model whose ``decode.sampling`` is on: the
    outputs are the ``nbest`` best that keep the rules."""
    if options.get("sampling"):
        raise XindaError("couplets and poems are written by beam search: sampling is not "
                         "supported (use nbest for several outputs)")
    options["sampling"] = False
    # (at most MAX_ROWS: too large an nbest is then refused by its own name, not as the beam)
    options.setdefault("beam", min(max(nbest, translator.cfg.decode.beam), MAX_ROWS))


def _room_for(rules, n: int, options: dict) -> None:
    """Decode settings whose length limit leaves room for two tokens per character (the
    rules end each output at its length in characters)."""
    options.setdefault("max_len_a", 0.0)
    # (at least 2, which DecodeConfig asks for, when every line is empty)
    options.setdefault("max_len_b", max([rules.max_length(s) for s in range(n)] + [1]) + 1)


def _restore_punctuation(text: str, up: str) -> str:
    """Put the first line's punctuation marks at their positions of ``text``."""
    return "".join(u if is_punctuation(u) else c for c, u in zip(text, up))


def read_prompt(given: PoemPrompt, table: CharacterTable, where: str, rhyme: bool
                ) -> PoemPrompt:
    """``given`` as the model reads it (``as_written``), checked: its form, an acrostic the
    model can write, and with ``rhyme`` one of 4 lines or none; else a XindaError."""
    given.check(where)
    prompt = PoemPrompt(tuple(as_written(w, table) for w in given.keywords), given.form,
                        as_written(given.acrostic, table))
    if rhyme and 0 < len(prompt.acrostic) < 4:
        raise XindaError(f"{where}: the rhyme rule ties line 4 to line 2, and an acrostic of "
                         f"{len(prompt.acrostic)} writes {len(prompt.acrostic)} lines")
    for ch in prompt.acrostic:
        table.check(ch, f"{where}: acrostic character")
    return prompt


def _warn_unknown_keywords(translator: Translator, prompt: PoemPrompt, where: str) -> None:
    """A warning for keyword characters the model reads as <unk>: the poem is written
    without them (an acrostic it cannot write is refused, ``read_prompt``)."""
    unk = translator.src_vocab.unk
    unknown = "".join(dict.fromkeys(ch for word in prompt.keywords for ch in word
                                    if unk in translator.source_ids(ch, False)))
    if unknown:
        log.warning("%s: keyword characters %s are not in the model's vocabulary: it reads "
                    "each as <unk>", where, " ".join(unknown))


def write_poems(translator: Translator, prompts: Sequence[PoemPrompt], nbest: int = 1,
                rhyme: bool = False, **options) -> list[list[Output]]:
    """The ``nbest`` best poems of each prompt (``PoemRules``): 4 lines, or one per acrostic
    character, of exactly ``form`` characters, punctuated as ``template`` says."""
    _check_characters(translator, "poetry")
    table = CharacterTable.of(translator.tgt_vocab)
    sources, layouts, lengths, heads = [], [], [], []
    if isinstance(prompts, PoemPrompt) or not hasattr(prompts, "__iter__"):
        raise XindaError(f"prompts: expected a list of PoemPrompt, got "
                         f"{type(prompts).__name__} (wrap one prompt in a list: [prompt])")
    prompts = list(prompts)
    for i, given in enumerate(prompts, start=1):
        if not isinstance(given, PoemPrompt):
            raise XindaError(f"prompt {i}: expected a PoemPrompt, got {type(given).__name__}")
        prompt = read_prompt(given, table, f"prompt {i}", rhyme)
        _warn_unknown_keywords(translator, prompt, f"prompt {i}")
        check_source_fits(translator, prompt.source(), f"prompt {i}: the source", options)
        marks, length = template(prompt.form, len(prompt.acrostic) or 4)
        check_output_fits(translator, length, f"prompt {i}", prompt.fixed())
        layouts.append({pos: table.check(mark, "punctuation mark") for pos, mark in
                        marks.items()})
        lengths.append(length)
        heads.append(prompt.acrostic)
        sources.append(prompt.source())
    rules = PoemRules(layouts, lengths, [p.form for p in prompts], heads, table, rhyme=rhyme)
    _room_for(rules, len(prompts), options)
    _beam_search(translator, options, nbest)
    results = translator.translate(sources, constraints=[rules], nbest=nbest, **options)
    return _outputs(results, [[t.text for t in nbest_list] for nbest_list in results])
