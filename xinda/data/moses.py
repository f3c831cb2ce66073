"""Moses pre-tokenisation (sacremoses) and its inverse, with what sacremoses could not undo.

``moses_tokenize`` keeps whole the runs its detokeniser would not rejoin (times, clitics, URLs,
in-word punctuation, characters of several code points, HTML entities ...: the ``_MOSES_KEEP_*``
patterns); ``moses_detokenize`` gives it the quotation marks it cannot pair as ones it pairs.
Used by ``xinda.data.text.TextPipeline``.
"""

from __future__ import annotations

import bisect
import re
from functools import cache

# Kept whole by the Moses tokeniser, whose detokeniser could not rejoin them: times, ratios
# and ranges ("10:30:45" would come back as "10:30: 45", "9:00–10:00" as "9:00 – 10:00")
# and, where sacremoses has no apostrophe rules, clitics ("geht's" would come back as
# "geht 's", read as an opening quote).
_MOSES_KEEP_TIMES = r"(?<!\d)\d+(?:[:–]\d+)+"
_MOSES_KEEP_CLITICS = r"(?<![\w'])[^\W\d_]+'(?:s|t|d|m|ll|re|ve)\b"
# The typographic apostrophe and single quotes, which no sacremoses rule knows, stay on the
# letters they touch ("geht’s", "l’homme", "hab’", "‘Hello’" would come back as "geht ’ s"...).
_MOSES_KEEP_CURLY = r"[‘’][^\W\d_]+(?:’[^\W\d_]*)*|(?<![^\W\d_])[^\W\d_]+(?:’[^\W\d_]*)+"
# "R&D", "and/or", "info@acme.com", "1/2", "50,000/L", "snake_case" stay whole (they would
# come back as "R & D"..., and "50, 000/L": a match starting after the comma would split it).
# A number starts after no digit, nor after a digit and "." or "," (else each number of
# "0.5,1.5,..." started a search to the list's end: a 29 kB line took 10 s to pre-tokenise).
_MOSES_KEEP_IN_WORD = r"(?:(?<!\d)(?<!\d[.,])\d+(?:[.,]\d+)+|(?<!\w)\w+)(?:[&/@_]\w+)+"
# Hashtags, mentions and numbers ("#2", "@user") and "C++", "C#" (they came back as "# 2"...).
_MOSES_KEEP_SIGNS = r"(?<!\w)[#@]\w+|(?<!\w)\w+(?:\+\+|#)(?![\w+#])"
# URLs ("http: / / www..." came back) without the punctuation that ends a sentence after them,
# and quoted words in a compound: „Open“-Schild, „Mongolian BBQ“-Reklame (not "„Open“ -Schild").
_MOSES_KEEP_URLS = r"(?<![\w/])(?:https?|ftp)://[!-~]*[a-z0-9/_=#&%~+-]"
_MOSES_KEEP_QUOTED = r"(?<!\w)[„\"“‚‘][^\W\d_]+(?: [^\W\d_]+){0,4}[“”\"‘’]-\w+"  # up to 5 words
# Characters of several code points, which sacremoses cut at each mark, never to be rejoined:
# a letter with combining marks NFC cannot compose ("Ọ̀rẹ́" came back as "Ọ ̀ rẹ ́"), keycaps,
# emoji with a variation selector or skin tone, ZWJ sequences (👨‍👩‍👧) and flags (🇩🇪).
_COMBINING = ("\u0300-\u036f\u0483-\u0489\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff"
              "\ufe20-\ufe2f\ufe0e\ufe0f")
_EMOJI = "\u2600-\u27bf\U0001f000-\U0001faff"
_EMOJI_MODS = "\ufe0e\ufe0f\U0001f3fb-\U0001f3ff\U000e0020-\U000e007f"
_MOSES_KEEP_CLUSTERS = (
    f"(?<![\\w{_COMBINING}])[#*]?\\w*(?:[{_COMBINING}]+\\w*)+|"
    f"[{_EMOJI}][{_EMOJI_MODS}]*(?:\u200d[{_EMOJI}][{_EMOJI_MODS}]*)+|"
    f"[{_EMOJI}][{_EMOJI_MODS}]+|[\U0001f1e6-\U0001f1ff]{{2}}")
# HTML entities, as IWSLT's and Multi30k's texts hold them ("&amp;" came back as "& amp;")
_MOSES_KEEP_ENTITIES = (r"(?<!\w)\w*(?:&(?:#x?[0-9a-f]+|amp|lt|gt|quot|apos|nbsp|[lr][sd]quo|"
                        r"[mn]dash|hellip|euro|copy|reg|trade);\w*)+")  # with its word
# The patterns' leading runs are anchored by look-behinds: a match from inside a run would end
# where one from its start ends, and without the anchor the search retried from every
# character of the run, quadratic in its length (16,000 letters took 20 s).
_MOSES_APOSTROPHE_LANGS = ("en", "fr", "it")
# Quotation marks the detokeniser does not pair, given to it as ones it pairs (by parity) and
# put back after: "”" as '"' (with "„", "“", '"': “yes”, „ja“, ”ja”) and, but in French,
# which spaces them, "«" "»" as "`" («oui», »ja«).
_MOSES_STAND_INS = {"”": '"', "«": "`", "»": "`"}


@cache
def moses_has_rules(lang: str) -> bool:
    """Does sacremoses have Moses's per-language rules (non-breaking prefixes) for ``lang``?"""
    from sacremoses.corpus import NonbreakingPrefixes

    return lang in NonbreakingPrefixes().available_langs.values()


@cache
def _moses_tokenizer(lang: str):
    from sacremoses import MosesTokenizer

    return MosesTokenizer(lang=lang)


@cache
def _moses_protected(lang: str) -> tuple[str, ...]:
    first = (_MOSES_KEEP_URLS, _MOSES_KEEP_QUOTED, _MOSES_KEEP_TIMES, _MOSES_KEEP_CLUSTERS,
             _MOSES_KEEP_ENTITIES)
    if lang in _MOSES_APOSTROPHE_LANGS:
        return (*first, _MOSES_KEEP_CURLY, _MOSES_KEEP_IN_WORD, _MOSES_KEEP_SIGNS)
    return (*first, _MOSES_KEEP_CLITICS, _MOSES_KEEP_CURLY, _MOSES_KEEP_IN_WORD,
            _MOSES_KEEP_SIGNS)


@cache
def _moses_protected_compiled(lang: str) -> tuple[re.Pattern, ...]:
    return tuple(re.compile(p, re.IGNORECASE) for p in _moses_protected(lang))  # as sacremoses


def _protected_count(text: str, lang: str) -> int:
    """How many protected tokens sacremoses finds in ``text``."""
    return sum(len(pattern.findall(text)) for pattern in _moses_protected_compiled(lang))


def _moses_windows(words: list[str], counts: list[int], limit: int) -> list[tuple[str, int]]:
    """``words`` joined into runs of at most ``limit`` protected tokens (a single word may have
    more), with their counts; cut between two letters or digits where it can be (no Moses rule
    looks across such a space: the tokens are the same), else between any two words."""
    units: list[tuple[list[str], int]] = []
    start = 0
    for i in range(1, len(words) + 1):
        if i == len(words) or (words[i - 1][-1].isalnum() and words[i][0].isalnum()):
            n = sum(counts[start:i])
            units += ([(words[start:i], n)] if n <= limit
                      else [([w], c) for w, c in zip(words[start:i], counts[start:i])])
            start = i
    runs: list[list[str]] = []
    sizes: list[int] = []
    for unit, n in units:
        if runs and sizes[-1] + n <= limit:
            runs[-1] += unit
            sizes[-1] += n
        else:
            runs.append(list(unit))
            sizes.append(n)
    return [(" ".join(run), n) for run, n in zip(runs, sizes)]


def moses_tokenize(line: str, lang: str) -> str:
    """Moses tokenisation of a cleaned ``line``; one with more protected tokens (times,
    clitics...) than sacremoses allows is tokenised in windows of whole words."""
    tokenizer = _moses_tokenizer(lang)
    limit = getattr(tokenizer, "MAX_PROTECTED_TOKENS", 1000)  # (older ones garble 1000 and up)
    # each pattern's matches take 2+ characters: a pattern finds at most len(line) / 2
    most = len(_moses_protected(lang)) * len(line) // 2
    windows = [(line, _protected_count(line, lang) if most > limit else 0)]
    if windows[0][1] > limit:
        words = line.split(" ")
        windows = _moses_windows(words, [_protected_count(w, lang) for w in words], limit)
    return " ".join(tokenizer.tokenize(
        text, escape=False, aggressive_dash_splits=False, return_str=True,
        protected_patterns=list(_moses_protected(lang)) if n <= limit else None)
        for text, n in windows)


def moses_detokenize(text: str, lang: str) -> str:
    """Moses detokenisation (no XML unescaping: tokenising escaped nothing)."""
    stand_ins = {"”": '"'} if lang == "fr" else _MOSES_STAND_INS
    marks = set(stand_ins) | set(stand_ins.values())
    originals = iter([c for c in text if c in marks])  # in order: detokenising keeps it
    tokens = text.translate(str.maketrans(stand_ins)).split()
    quotes = _OPENS not in text and _CLOSES not in text  # (a text of them keeps them)
    if quotes:
        base = re.split("[-_]", lang.lower())[0]  # (fr_FR, pt-BR)
        tokens = _single_quotes(tokens, possessives=base not in _NO_POSSESSIVE_S)
    out = _moses_detokenizer(lang).detokenize(tokens, unescape=False)
    if quotes:
        out = re.sub(f"{_OPENS} ?", "'", re.sub(f" ?{_CLOSES}", "'", out))
    return re.sub(f"[{''.join(set(stand_ins.values()))}]", lambda m: next(originals, m[0]), out)


_OPENS, _CLOSES = "\ue000", "\ue001"  # (private use) stand-ins for a ' token's two ways
_NO_POSSESSIVE_S = ("fr", "it", "es", "pt", "ca", "ro")  # languages without "the girls' school"
# a line-initial 'Tis or 'Twas is elided, not an opening quotation mark ('Round, 'Cause may be)
_ELISION = re.compile(r"'(?:tis|twas)\b", re.IGNORECASE)
# the word before a ' that may close alone: a word in s (girls' school, EES', w/Davis', the
# 1960s' music) or a number (4' wide), but not these English words in s
_POSSESSOR = re.compile(r".*[^\W_][sS]|\d+(?:[.,]\d+)*")
_NOT_POSSESSORS = frozenset({"as", "is", "was", "has", "his", "this", "does", "says", "us", "yes",
                             "thus", "plus"})


def _single_quotes(tokens: list[str], possessives: bool = True) -> list[str]:
    """Each lone ' token as a stand-in that opens or closes: paired in order, a line-initial
    "'Word" (kept whole, not an elision) opening, but for ``closing_alone``'s. (sacremoses
    joined every ' after a word in s to it: "likes ' jazz ' music" came back as "likes' jazz
    'music".)"""
    at = [i for i, token in enumerate(tokens) if token == "'"]
    opened = bool(tokens) and re.match(r"'\w", tokens[0]) is not None \
        and not _ELISION.match(tokens[0])
    alone = closing_alone(tokens, at, opened, possessives)
    out = list(tokens)
    for i in at:
        out[i], opened = (_CLOSES, opened) if i in alone else \
            (_CLOSES if opened else _OPENS, not opened)
    return out


def closing_alone(tokens: list[str], at: list[int], opened: bool = False,
                  possessives: bool = True) -> set[int]:
    """The lone ' tokens (at ``at``; ``opened``: one more opened before) that close alone.
    None when, paired in order, every ' after a possessor (``_POSSESSOR``; only numbers
    without ``possessives``) already closes a quotation ('cats' and 'dogs'). Else every one
    after a possessor when the others pair up; when they do not, the possessor's ' nearest
    another ' pairs with them instead (likes 'jazz'); with no possessor, the first ' before
    no word (a cafe'.)."""
    owned = [i for i in at if i and not (opened and i == 1)  # (closes a line-initial 'Word)
             and tokens[i - 1].lower() not in _NOT_POSSESSORS
             and _POSSESSOR.fullmatch(tokens[i - 1])
             and (possessives or tokens[i - 1][:1].isdigit())]
    closing = {i for k, i in enumerate(at) if (k + opened) % 2}
    if (len(at) + opened) % 2 == 0 and closing.issuperset(owned):
        return set()
    others = sorted(set(at) - set(owned))
    if (len(others) + opened) % 2 == 0:
        return set(owned)
    if owned:
        def distance(i: int) -> int:  # to the nearest other ' (others sorted: bisect)
            k = bisect.bisect(others, i)
            return min((abs(i - j) for j in others[max(k - 1, 0):k + 1]), default=0)
        return set(owned) - {min(owned, key=distance)}
    before_no_word = [i for i in at if i and not "".join(tokens[i + 1:i + 2])[:1].isalnum()]
    return set(before_no_word[:1])


@cache
def _moses_detokenizer(lang: str):
    from sacremoses import MosesDetokenizer

    return MosesDetokenizer(lang=lang)
