"""Quatrain data: layout helpers, keywords and the corpus writer on a tiny fake shared folder."""

import json
import random

import pytest

from xinda.apps.poetry import (
    FORMS,
    keywords,
    poem_lines,
    poem_text,
    source_text,
    split_keywords,
    template,
    write_poetry_corpus,
)
from xinda.errors import XindaError

STORK_TOWER = ["白日依山尽", "黄河入海流", "欲穷千里目", "更上一层楼"]


def read(path):
    return path.read_text(encoding="utf-8").splitlines()


def test_template_by_hand():
    assert template(5) == ({5: "，", 11: "。", 17: "，", 23: "。"}, 24)
    marks, length = template(7, lines=8)
    assert length == 64 and sorted(marks) == [7, 15, 23, 31, 39, 47, 55, 63]
    assert "".join(marks[p] for p in sorted(marks)) == "，。" * 4
    with pytest.raises(ValueError):
        template(0)


def test_poem_text_follows_the_template_and_splits_back():
    text = poem_text(STORK_TOWER)
    assert text == "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。"
    marks, length = template(5)
    assert len(text) == length and all(text[p] == mark for p, mark in marks.items())
    assert poem_lines(text) == STORK_TOWER


def test_source_text():
    assert source_text(5, ["春", "江月"]) == "五言 春 江月"
    assert source_text(7, []) == "七言"
    with pytest.raises(XindaError, match="unknown poem form 6"):
        source_text(6, ["春"])


def test_keywords_split_at_spaces_and_ascii_or_chinese_commas():
    """Before: "春风，江月" (a Chinese comma) was one keyword, in the CLI and the server."""
    for text in ("春风 江月", "春风,江月", "春风，江月", " 春风、 江月；", "春风\u3000江月"):
        assert split_keywords(text) == ("春风", "江月"), text
    assert split_keywords(" ， ") == ()


def test_keywords_are_words_of_the_poem_in_text_order():
    title = "早发白帝城"
    lines = ["朝辞白帝彩云间", "千里江陵一日还", "两岸猿声啼不住", "轻舟已过万重山"]
    text = "\n".join([title, *lines])
    four = keywords(title, lines, 4)
    assert len(four) == 4 and all(len(w) == 2 and w in text for w in four)
    assert four == sorted(four, key=text.index)
    assert keywords(title, lines, 1)[0] in four  # the best-ranked one
    assert keywords(title, lines, 4) == four  # deterministic


def test_keywords_skip_title_numbering_and_fall_back_to_the_first_line():
    assert "其二" not in keywords("春日 其二", STORK_TOWER, 4)
    assert keywords("", ["一二三四五"] * 4, 3) == ["一二"]  # jieba's one word is 5 long


def test_writer_on_fake_shared(poetry_shared, tmp_path):
    out = tmp_path / "raw"
    prefixes = write_poetry_corpus(poetry_shared, out)
    assert prefixes == {split: str(out / split) for split in ("train", "valid", "test")}
    assert read(out / "train.poem") == [
        "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。",  # simplified, from the .gz
        "朝辞白帝彩云间，千里江陵一日还。两岸猿声啼不住，轻舟已过万重山。"]
    assert read(out / "test.kw") == ["五言 一二"]
    sources = read(out / "train.kw") + read(out / "valid.kw")
    poems = read(out / "train.poem") + read(out / "valid.poem")
    titles = ["登鹳雀楼", "早发白帝城", "春晓"]
    ids = ["t1", "t2", "v1"]
    for source, poem, title, poem_id in zip(sources, poems, titles, ids):
        form, *words = source.split(" ")
        assert form == FORMS[len(poem_lines(poem)[0])]
        drawn = random.Random(f"1:{poem_id}").randint(1, 4)
        assert words == keywords(title, poem_lines(poem), drawn)


def test_seed_changes_only_the_keyword_counts(poetry_shared, tmp_path):
    write_poetry_corpus(poetry_shared, tmp_path / "a", seed=1)
    write_poetry_corpus(poetry_shared, tmp_path / "b", seed=1)
    write_poetry_corpus(poetry_shared, tmp_path / "c", seed=2)
    for split in ("train", "valid"):
        assert read(tmp_path / "a" / f"{split}.kw") == read(tmp_path / "b" / f"{split}.kw")
        assert read(tmp_path / "a" / f"{split}.poem") == read(tmp_path / "c" / f"{split}.poem")
    # seed 1 draws 4 keywords for both train poems, seed 2 draws 1: the best-ranked of the 4
    four, one = read(tmp_path / "a" / "train.kw"), read(tmp_path / "c" / "train.kw")
    assert [len(line.split()) for line in one] == [2, 2]
    assert all(set(b.split()) < set(a.split()) for a, b in zip(four, one))


def test_missing_folder_and_bad_records(poetry_shared, tmp_path):
    with pytest.raises(XindaError, match="poetry-quatrains: corpus folder not found"):
        write_poetry_corpus(tmp_path / "nowhere", tmp_path / "raw")
    valid = poetry_shared / "poetry-quatrains" / "valid.jsonl"
    good = valid.read_text(encoding="utf-8")
    valid.write_text(good + "{not json\n", encoding="utf-8")
    with pytest.raises(XindaError, match=r"valid.jsonl:2: invalid JSON"):
        write_poetry_corpus(poetry_shared, tmp_path / "raw")
    record = {"id": "v2", "title": "殘句", "lines": ["白日依山盡", "黃河入海流"]}
    valid.write_text(good + json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")
    with pytest.raises(XindaError, match=r"valid.jsonl:2: not a quatrain"):
        write_poetry_corpus(poetry_shared, tmp_path / "raw")
    lines = ["白日依山盡", "黃河入海流", "欲窮千里目", "更上一層樓"]
    for bad in ({"title": None, "lines": lines}, {"title": "t", "lines": None},
                {"title": "t", "lines": [1, 2, 3, 4]}):  # before: AttributeError/TypeError
        valid.write_text(good + json.dumps({"id": "v2", **bad}, ensure_ascii=False) + "\n",
                         encoding="utf-8")
        with pytest.raises(XindaError, match=r"valid.jsonl:2: title must be a string"):
            write_poetry_corpus(poetry_shared, tmp_path / "raw")


def test_a_poem_held_out_after_simplification_leaves_training(poetry_shared, tmp_path):
    """The shared data was de-duplicated in traditional characters: a train poem that differs
    from the valid one only by 覺/觉 becomes the same poem once simplified (9 of the 1000 test
    poems were in the recipe's training data)."""
    import json

    from apps.conftest import QUATRAINS, write

    twin = {**QUATRAINS["valid"][0], "id": "t3",
            "lines": ["春眠不觉晓", *QUATRAINS["valid"][0]["lines"][1:]]}
    write(poetry_shared / "poetry-quatrains" / "train.jsonl.gz",
          [json.dumps(p, ensure_ascii=False) for p in [*QUATRAINS["train"], twin]])
    out = tmp_path / "raw"
    write_poetry_corpus(poetry_shared, out)
    assert len(read(out / "train.poem")) == 2
    assert not set(read(out / "train.poem")) & set(read(out / "valid.poem"))


def test_a_poem_sharing_a_line_with_a_held_out_one_leaves_training(poetry_shared, tmp_path):
    """Before: only the same whole poem was dropped; a variant (効/效, which simplification
    does not merge) or the same lines in another order stayed in training (16 of the 1000
    test poems shared 3 of their 4 lines with a training poem; found by review)."""
    import json

    from apps.conftest import QUATRAINS, write

    valid = QUATRAINS["valid"][0]["lines"]
    variants = [{"id": "t3", "title": "", "lines": ["春眠不觉晚", *valid[1:]]},
                {"id": "t4", "title": "", "lines": [*valid[2:], *valid[:2]]}]
    write(poetry_shared / "poetry-quatrains" / "train.jsonl.gz",
          [json.dumps(p, ensure_ascii=False) for p in [*QUATRAINS["train"], *variants]])
    out = tmp_path / "raw"
    write_poetry_corpus(poetry_shared, out)
    assert len(read(out / "train.poem")) == 2  # the two unrelated poems
