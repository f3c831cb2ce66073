"""``xinda prepare`` on the real corpora in ../shared/data (skipped where they are absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from xinda.config import DataConfig
from xinda.data.manifest import load_split, load_vocabularies
from xinda.data.prepare import prepare
from xinda.data.text import restore_wide_punctuation

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


def corpus(name: str) -> Path:
    path = SHARED / name
    if not path.is_dir():
        pytest.skip(f"{path} not found: the shared data sets are not on this machine")
    return path


def test_multi30k_valid_prepares_without_losing_pairs(tmp_path):
    data = corpus("multi30k")
    cfg = DataConfig(src_lang="en", tgt_lang="de", train=str(data / "valid"),
                     test={"test2016": str(data / "test2016")}, out_dir=str(tmp_path),
                     vocab_size=1000, pretok_src="moses", pretok_tgt="moses")
    manifest = prepare(cfg, log=lambda _: None)
    assert manifest["splits"]["train"]["pairs"] + sum(
        manifest["filter_report"]["dropped"].values()) == 1014
    assert manifest["splits"]["test2016"]["pairs"] == 1000
    src, tgt = load_split(tmp_path, "test2016")
    assert len(src) == len(tgt) == 1000
    vocabs = load_vocabularies(tmp_path, manifest)
    vocab, text = vocabs.tgt, vocabs.tgt_text
    raw = (data / "test2016.de").read_text(encoding="utf-8").splitlines()
    # ids -> pieces -> text -> Moses detokenisation gives back the raw reference
    restored = [text.postprocess(vocab.decode(tgt[i].tolist())) for i in range(50)]
    assert sum(r == o for r, o in zip(restored, raw[:50])) >= 45


def test_tatoeba_chinese_with_jieba(tmp_path):
    data = corpus("tatoeba-zh-en")
    cfg = DataConfig(src_lang="zh", tgt_lang="en", train=str(data / "valid"),
                     out_dir=str(tmp_path), vocab_size=1500, pretok_src="jieba")
    manifest = prepare(cfg, log=lambda _: None)
    assert manifest["text"]["src"]["pretok"] == "jieba"
    text = load_vocabularies(tmp_path, manifest).src_text
    raw = (data / "valid.zh").read_text(encoding="utf-8").splitlines()[:20]
    tokens = [text.preprocess(line).split() for line in raw]
    # jieba segments: words of one to a few characters, and most sentences hold several
    assert sum(len(words) > 2 for words in tokens) >= 15, tokens
    assert all(len(word) <= 8 for words in tokens for word in words), tokens
    for line, words in zip(raw, tokens):
        assert text.postprocess(" ".join(words)).replace(" ", "") == \
            restore_wide_punctuation(text.clean(line)).replace(" ", "")
