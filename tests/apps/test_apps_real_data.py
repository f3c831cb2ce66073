"""The corpus writers on the real shared data (../shared/data, never committed): skipped with
the reason when it is absent. To stay fast, the train splits are cut to their first lines."""

import gzip
import itertools
import json
from pathlib import Path

import pytest

from xinda.apps.corpus import to_simplified
from xinda.apps.couplet import write_couplet_corpus
from xinda.apps.poetry import FORMS, poem_lines, poem_text, template, write_poetry_corpus
from xinda.evaluate.generation import is_han, rhyme_rate

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
HEAD = 200  # train lines kept


def _need(*names: str) -> None:
    missing = [name for name in names if not (SHARED / name).is_dir()]
    if missing:
        pytest.skip(f"real data absent: {', '.join(str(SHARED / m) for m in missing)} "
                    "not found (the shared data folder is not part of the repository)")


def _mirror(name: str, tmp_path: Path) -> Path:
    """tmp_path/shared/name with the real files linked, except train files: their first
    ``HEAD`` lines, gzipped."""
    folder = tmp_path / "shared" / name
    folder.mkdir(parents=True)
    for path in (SHARED / name).iterdir():
        if path.name.startswith("train."):
            with gzip.open(path, "rb") as f:
                (folder / path.name).write_bytes(gzip.compress(b"".join(itertools.islice(f, HEAD))))
        else:
            (folder / path.name).symlink_to(path)
    return tmp_path / "shared"


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_real_couplets(tmp_path):
    _need("poetry-couplets", "couplet")
    with gzip.open(SHARED / "poetry-couplets" / "train.up.gz", "rb") as f:
        assert sum(1 for _ in f) == 252654
    _mirror("poetry-couplets", tmp_path)
    shared = _mirror("couplet", tmp_path)
    out = tmp_path / "raw"
    write_couplet_corpus(shared, out)
    counts = {"train": HEAD, "valid": 1000, "test": 1000, "wb14123": 4000}
    for split, count in counts.items():
        up, down = _lines(out / f"{split}.up"), _lines(out / f"{split}.down")
        assert len(up) == len(down) == count
        assert all(line and " " not in line for line in up + down)
        assert all(len(a) == len(b) for a, b in zip(up, down))
    assert all(len(line) in (5, 7) and all(map(is_han, line))
               for line in _lines(out / "valid.up") + _lines(out / "test.down"))


def test_real_quatrains(tmp_path):
    _need("poetry-quatrains")
    out = tmp_path / "raw"
    write_poetry_corpus(_mirror("poetry-quatrains", tmp_path), out)
    # dropped for a line shared with a later split: 2 of the first HEAD training poems
    # (variants of held-out ones: 又/有, 鶑/莺 in one line, 3 lines the same) and a valid poem
    # (今年未得归, a line of a test poem)
    for split, count in {"train": HEAD - 2, "valid": 999, "test": 1000}.items():
        sources, poems = _lines(out / f"{split}.kw"), _lines(out / f"{split}.poem")
        assert len(sources) == len(poems) == count
        for source, poem in zip(sources, poems):
            form, *words = source.split(" ")
            size = len(poem_lines(poem)[0])
            marks, length = template(size)
            assert form == FORMS[size] and len(poem) == length
            assert all(poem[p] == mark for p, mark in marks.items())
            assert 1 <= len(words) <= 4 and all(len(w) == 2 for w in words)
    records = [json.loads(line) for line in _lines(SHARED / "poetry-quatrains" / "valid.jsonl")]
    titles = {poem_text([to_simplified(x) for x in r["lines"]]): to_simplified(r["title"])
              for r in records}  # by poem: the split lost one
    sources, poems = _lines(out / "valid.kw"), _lines(out / "valid.poem")
    for source, poem in zip(sources, poems):
        assert all(word in f"{titles[poem]}\n{poem}" for word in source.split(" ")[1:])
    assert rhyme_rate(_lines(out / "valid.poem")) > 75  # the references mostly rhyme
