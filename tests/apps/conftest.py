"""Fake shared data folders (the layout of ../shared/data, a few lines each) for the corpus
writers."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

# poetry-couplets: traditional characters, space-separated; 乾坤 shows that lines are
# converted whole, by OpenCC's phrase table (one character at a time, 乾 would become 干)
COUPLETS = {
    "train": [("宏 規 則 天 地", "書 引 藤 爲 架"), ("乾 坤 資 化 育", "風 雨 見 經 綸")],
    "valid": [("兩 岸 猿 聲 啼", "千 里 江 陵 還")],
    "test": [("春 眠 不 覺 曉", "處 處 聞 啼 鳥")],
}
WB14123 = [("腾 飞 上 铁 ， 锐 意", "鼓 舞 下 江 ， 雄 心")]  # already simplified

QUATRAINS = {
    "train": [
        {"id": "t1", "title": "登鸛雀樓", "form": "五言绝句",
         "lines": ["白日依山盡", "黃河入海流", "欲窮千里目", "更上一層樓"]},
        {"id": "t2", "title": "早發白帝城", "form": "七言绝句",
         "lines": ["朝辭白帝彩雲間", "千里江陵一日還", "兩岸猿聲啼不住", "輕舟已過萬重山"]},
    ],
    "valid": [{"id": "v1", "title": "春曉", "form": "五言绝句",
               "lines": ["春眠不覺曉", "處處聞啼鳥", "夜來風雨聲", "花落知多少"]}],
    "test": [{"id": "x1", "title": "", "form": "五言绝句",  # no keyword: the fallback
              "lines": ["一二三四五"] * 4}],
}


def write(path: Path, lines: list[str]) -> None:
    """Write ``lines`` to ``path``, gzipped when the name ends in .gz."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(f"{line}\n" for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


@pytest.fixture
def couplet_shared(tmp_path) -> Path:
    """A shared folder with poetry-couplets/ (train gzipped) and couplet/ (test only)."""
    shared = tmp_path / "shared"
    for split, pairs in COUPLETS.items():
        for side, index in (("up", 0), ("down", 1)):
            name = f"{split}.{side}" + (".gz" if split == "train" else "")
            write(shared / "poetry-couplets" / name, [pair[index] for pair in pairs])
    for side, index in (("up", 0), ("down", 1)):
        write(shared / "couplet" / f"test.{side}", [pair[index] for pair in WB14123])
    return shared


@pytest.fixture
def poetry_shared(tmp_path) -> Path:
    """A shared folder with poetry-quatrains/{train.jsonl.gz, valid.jsonl, test.jsonl}."""
    shared = tmp_path / "shared"
    for split, poems in QUATRAINS.items():
        name = f"{split}.jsonl" + (".gz" if split == "train" else "")
        write(shared / "poetry-quatrains" / name,
              [json.dumps(poem, ensure_ascii=False) for poem in poems])
    return shared
