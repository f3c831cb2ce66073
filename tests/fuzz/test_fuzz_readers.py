"""Fuzz: the corpus readers (``read_lines``, ``decode_lines``, ``read_parallel``) on random
bytes, random Unicode and random line endings.

The line convention they must keep (the one sacrebleu and ``wc -l`` use, so that a corpus, its
references and its translations stay aligned): only ``\\n`` ends a line; ``\\r`` right before
it (CRLF) or at the very end of the file is not part of the line; a lone ``\\r`` and the other
Unicode line separators (``\\x85``, ``\\u2028``, ``\\x0b``, ...) are kept inside the line; a
missing final newline loses nothing. Bytes that are not UTF-8 give a one-line ``XindaError``
naming the file and the 1-based line; so does a file of one line with a lone ``\\r`` inside: its
lines end in CR only (old Mac line endings), and its sentences would run together.
"""

from __future__ import annotations

import gzip
import io
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from xinda.data.prepare import read_parallel
from xinda.errors import XindaError
from xinda.utils import decode_lines, read_lines

# separators that str.splitlines() would split on, but a corpus line may hold
ODD_SEPARATORS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
# (no U+FEFF: whether a byte-order mark at the start of a file is kept is left open here)
CHARS = st.one_of(st.characters(exclude_categories=("Cs",), exclude_characters="\n\ufeff"),
                  st.sampled_from(ODD_SEPARATORS + " \t"))
# a line's content: anything but \n, and not ending in \r (that \r would read as part of CRLF)
LINES = st.text(CHARS, max_size=12).filter(lambda line: not line.endswith("\r"))
ENDINGS = st.sampled_from(["\n", "\r\n"])
PRINTABLE = st.text(st.characters(exclude_categories=("Cs", "Cc", "Zl", "Zp"),
                                  exclude_characters="\ufeff"), max_size=12)


@st.composite
def files(draw, lines=LINES) -> tuple[list[str], str]:
    """(lines, the file text): each line ends in \\n or \\r\\n, the last one maybe in nothing."""
    content = draw(st.lists(lines, max_size=8))
    text = "".join(line + draw(ENDINGS) for line in content)
    if content and draw(st.booleans()):  # no newline at the end of the file
        text = text.removesuffix("\n").removesuffix("\r")
        if not content[-1]:
            content = content[:-1]  # an empty last line without its newline is no line
    assume(not cr_only(text))
    return content, text


def cr_only(text: str) -> bool:
    """Whether ``text`` is one line with a lone \\r inside: CR-only line endings, an error."""
    first, _, rest = text.partition("\n")
    return "\r" in first.rstrip("\r") and not rest


def reference_lines(text: str) -> list[str]:
    """The convention above, stated directly on decoded text."""
    parts = text.split("\n")
    if parts[-1] == "":  # the text ended with \n (or was empty): no line after it
        parts.pop()
    return [part.rstrip("\r") for part in parts]


def _write(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(gzip.compress(data, mtime=0) if name.endswith(".gz") else data)
    return path


@given(file=files())
def test_decode_lines_gives_back_the_lines(file):
    lines, text = file
    assert list(decode_lines(io.BytesIO(text.encode("utf-8")), "<stdin>")) == lines


@given(file=files(), gz=st.booleans())
def test_read_lines_gives_back_the_lines_plain_or_gzip(file, gz):
    lines, text = file
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), "corpus.en.gz" if gz else "corpus.en", text.encode("utf-8"))
        assert list(read_lines(path)) == lines


# line breaks, valid UTF-8 (é, 😀), truncated or stray continuation bytes, an encoded surrogate
BYTE_PIECES = [b"\n", b"\r", b"\r\n", b"a", b"\xc3\xa9", b"\xf0\x9f\x98\x80", b"\xe4\xb8", b"\xad",
               b"\xff", b"\x00", b"\xed\xa0\x80"]


@given(data=st.one_of(st.binary(max_size=60),
                      st.lists(st.sampled_from(BYTE_PIECES), max_size=20).map(b"".join)))
@example(data="UTF-16\n".encode("utf-16-le"))
@example(data="1\nUTF-16\n".encode("utf-16-le"))  # before: read as garbage (line 1 is short)
def test_random_bytes_give_the_lines_or_a_one_line_error_at_the_right_line(data, user_error):
    """Line by line: invalid UTF-8 is an error at its line; so is the first line of 4+ bytes
    if it has NUL at every other byte (UTF-16); else the lines are read."""
    expected, checked = None, False
    for lineno, raw in enumerate(io.BytesIO(data), start=1):  # split at b"\n" as it is
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            expected = (lineno, "invalid UTF-8")
            break
        body = raw.rstrip(b"\r\n")
        if not checked and len(body) >= 4:
            checked = True
            if set(body[0::2]) <= {0} or set(body[1::2]) <= {0}:
                expected = (lineno, "UTF-16")
                break
    if expected is None and cr_only(data.decode("utf-8")):
        expected = ("", "carriage return only")
    if expected is None:
        text = data.decode("utf-8")
        assert list(decode_lines(io.BytesIO(data), "corpus.en")) == reference_lines(text)
        return
    with pytest.raises(XindaError) as error:
        list(decode_lines(io.BytesIO(data), "corpus.en"))
    message = user_error(error.value)
    assert message.startswith(f"corpus.en{expected[0] and ':'}{expected[0]}: "), message
    assert expected[1] in message


@given(src=files(PRINTABLE), tgt=files(PRINTABLE), gz=st.sampled_from(["", "src", "tgt"]))
def test_read_parallel_gives_aligned_sides_or_a_one_line_error(src, tgt, gz, user_error):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _write(folder, "c.en.gz" if gz == "src" else "c.en", src[1].encode("utf-8"))
        _write(folder, "c.de.gz" if gz == "tgt" else "c.de", tgt[1].encode("utf-8"))
        try:
            got = read_parallel(str(folder / "c"), "en", "de")
        except XindaError as err:
            message = user_error(err)
            empty = not src[0] or not tgt[0]
            assert empty or len(src[0]) != len(tgt[0]), message
            assert re.search(r"empty corpus|ends after \d+ lines", message), message
            return
    assert got == (src[0], tgt[0])


@given(src=st.binary(max_size=30), tgt=st.binary(max_size=30))
def test_read_parallel_of_random_bytes(src, tgt, user_error):
    with tempfile.TemporaryDirectory() as tmp:
        _write(Path(tmp), "c.en", src)
        _write(Path(tmp), "c.de", tgt)
        try:
            got = read_parallel(str(Path(tmp) / "c"), "en", "de")
        except XindaError as err:
            user_error(err)
            return
    assert len(got[0]) == len(got[1]) > 0
    assert got == (reference_lines(src.decode("utf-8")), reference_lines(tgt.decode("utf-8")))


def test_a_lone_carriage_return_does_not_end_a_line():
    """A lone \\r is no line break (as for wc -l and sacrebleu): it stays inside its line."""
    assert list(decode_lines(io.BytesIO(b"a\rb\r\nc\rd\r"), "x")) == ["a\rb", "c\rd"]


@pytest.mark.parametrize("data", [b"one\rtwo\rthree\r", b"one\rtwo", b"\xef\xbb\xbfa\rb\n"])
def test_a_file_of_cr_only_line_endings_is_a_one_line_error(data, user_error, tmp_path):
    """Read as one line, its sentences ran together: a validation set of three pairs became
    one pair (before: silently; a training set's one pair was dropped as "control
    characters", and prepare then failed for an empty corpus)."""
    path = _write(tmp_path, "valid.en", data)
    with pytest.raises(XindaError) as error:
        list(read_lines(path))
    assert user_error(error.value).startswith(f"{path}: lines end in a carriage return only")


@pytest.mark.parametrize("name", ["corpus.en.GZ", "corpus.en"])
def test_gzip_data_is_read_whatever_its_name_says(tmp_path, name):
    """Before: corpus.en.GZ (or gzip data without the suffix) was read as plain text and failed
    with "invalid UTF-8 (byte 1: b'\\x8b')", no word of gzip (found by review)."""
    path = tmp_path / name
    path.write_bytes(gzip.compress("一\ntwo\n".encode()))
    assert list(read_lines(path)) == ["一", "two"]
