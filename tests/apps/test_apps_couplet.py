"""The couplet corpus writer on a tiny fake shared folder, and its command line."""

import subprocess
import sys

import pytest

from xinda.apps.__main__ import main
from xinda.apps.couplet import write_couplet_corpus
from xinda.errors import XindaError


def read(path):
    return path.read_text(encoding="utf-8").splitlines()


def test_writes_simplified_lines_without_spaces(couplet_shared, tmp_path):
    out = tmp_path / "raw"
    prefixes = write_couplet_corpus(couplet_shared, out)
    assert prefixes == {split: str(out / split) for split in ("train", "valid", "test", "wb14123")}
    assert read(out / "train.up") == ["宏规则天地", "乾坤资化育"]  # OpenCC's phrase: not 干坤
    assert read(out / "train.down") == ["书引藤为架", "风雨见经纶"]  # read from .gz
    assert read(out / "valid.up") == ["两岸猿声啼"] and read(out / "test.down") == ["处处闻啼鸟"]
    assert read(out / "wb14123.up") == ["腾飞上铁，锐意"]
    assert read(out / "wb14123.down") == ["鼓舞下江，雄心"]


def test_missing_shared_folder_is_one_clear_error(tmp_path):
    with pytest.raises(XindaError, match=r"nowhere/poetry-couplets: corpus folder not found"):
        write_couplet_corpus(tmp_path / "nowhere", tmp_path / "raw")
    assert not (tmp_path / "raw").exists()


def test_missing_wb14123_folder_is_named(couplet_shared, tmp_path):
    for path in (couplet_shared / "couplet").iterdir():
        path.unlink()
    (couplet_shared / "couplet").rmdir()
    with pytest.raises(XindaError, match=r"couplet: corpus folder not found"):
        write_couplet_corpus(couplet_shared, tmp_path / "raw")


def test_misaligned_sides_are_an_error(couplet_shared, tmp_path):
    valid_up = couplet_shared / "poetry-couplets" / "valid.up"
    valid_up.write_text("宏 規\n書 引\n", encoding="utf-8")
    with pytest.raises(XindaError, match=r"not line-aligned: .*valid.up has 2, .*valid.down has 1"):
        write_couplet_corpus(couplet_shared, tmp_path / "raw")


def test_command_line(couplet_shared, tmp_path, capsys):
    assert main(["couplet", str(couplet_shared), str(tmp_path / "raw")]) == 0
    assert f"wb14123: {tmp_path / 'raw' / 'wb14123'}" in capsys.readouterr().out
    assert main(["couplet", str(tmp_path / "nowhere"), str(tmp_path / "raw")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("xinda: error: ") and err.count("\n") == 1


def test_a_line_held_out_after_simplification_leaves_training(couplet_shared, tmp_path):
    """The shared data was de-duplicated in traditional characters: 騰飛上鐵，銳意 in train
    becomes the wb14123 test line 腾飞上铁，锐意 once simplified (9 of the 4000 wb14123 pairs
    were in the recipe's training data)."""
    from apps.conftest import COUPLETS, write

    train = [*COUPLETS["train"], ("騰 飛 上 鐵 ， 銳 意", "風 雨 見 經 綸")]
    for side, index in (("up", 0), ("down", 1)):
        write(couplet_shared / "poetry-couplets" / f"train.{side}.gz",
              [pair[index] for pair in train])
    out = tmp_path / "raw"
    proc = subprocess.run([sys.executable, "-m", "xinda.apps", "couplet", str(couplet_shared),
                           str(out)], capture_output=True, text=True, check=True)
    assert read(out / "train.up") == ["宏规则天地", "乾坤资化育"]
    assert not set(read(out / "train.up")) & set(read(out / "wb14123.up"))
    assert "train: 1 dropped, shared with valid/test/wb14123" in proc.stderr  # (was silent)
