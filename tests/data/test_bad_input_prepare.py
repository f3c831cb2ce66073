"""Bad corpora for ``xinda prepare``: broken .gz files, directories where files belong, control
characters and a corpus too small for the requested vocabulary."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import numpy as np
import pytest

from xinda.config import DataConfig, load_config
from xinda.data.manifest import load_split, load_vocabularies
from xinda.data.prepare import corpus_file, filter_train, prepare
from xinda.errors import XindaError
from xinda.utils import decode_lines, has_control_chars, read_lines, replace_control_chars

WORDS = ["the", "a", "cat", "dog", "man", "sees", "likes", "big", "small", "red", "house", "car",
         "and", "runs", "home"]


def lines(n: int, offset: int = 0) -> list[str]:
    """``n`` distinct short sentences."""
    return [f"{WORDS[(i + offset) % 15]} {WORDS[(i // 15) % 15]} {WORDS[(i * 7) % 15]} {i}"
            for i in range(n)]


def write(path: Path, text: list[str]) -> Path:
    path.write_text("".join(f"{x}\n" for x in text), encoding="utf-8")
    return path


def corpus(folder: Path, name: str, src: list[str], tgt: list[str]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    write(folder / f"{name}.en", src)
    write(folder / f"{name}.de", tgt)
    return str(folder / name)


def config(tmp_path: Path, **kw) -> DataConfig:
    base = {"src_lang": "en", "tgt_lang": "de", "vocab_size": 40, "out_dir": str(tmp_path / "bin"),
            "normalize": "none"}
    return DataConfig(**(base | kw))


def prepare_error(cfg: DataConfig) -> str:
    with pytest.raises(XindaError) as info:
        prepare(cfg, log=lambda _: None)
    message = str(info.value)
    assert "\n" not in message
    return message


GZ_TEXT = "".join(f"{x}\n" for x in lines(3000)).encode()


def broken_gz(kind: str) -> bytes:
    data = gzip.compress(GZ_TEXT)
    if kind == "truncated":
        return data[:len(data) // 2]
    if kind == "crc":  # the CRC-32 in the trailer
        return data[:-8] + bytes(b ^ 0xFF for b in data[-8:-4]) + data[-4:]
    if kind == "corrupt":  # a flipped byte in the middle of the deflate stream
        mid = len(data) // 2
        return data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1:]
    if kind == "trailing":
        return data + b"not gzip"
    return GZ_TEXT  # "plain": not gzip at all


def read_error(path: Path) -> str:
    with pytest.raises(XindaError) as info:
        list(read_lines(path))
    return str(info.value)


# ---------------------------------------------------------------- compressed input


def test_truncated_gz_names_file_and_last_line(tmp_path):
    path = tmp_path / "train.en.gz"
    path.write_bytes(broken_gz("truncated"))
    with gzip.open(path, "rb") as f:  # what gzip itself manages to read before it stops
        complete = 0
        with pytest.raises(EOFError):
            for _ in f:
                complete += 1
    assert 0 < complete < 3000
    message = read_error(path)
    assert message == (f"{path}: truncated gzip file: the compressed data ends early "
                       f"(after line {complete})")


@pytest.mark.parametrize("kind, cause", [
    ("crc", "corrupt gzip file: CRC check failed"),
    ("corrupt", "corrupt gzip file: Error -3 while decompressing"),
    ("trailing", "corrupt gzip file: data after the compressed stream is not gzip"),
    ("plain", "not a gzip file"),
])
def test_corrupt_gz_names_file_and_cause(tmp_path, kind, cause):
    path = tmp_path / "train.en.gz"
    path.write_bytes(broken_gz(kind))
    message = read_error(path)
    assert message.startswith(f"{path}: {cause}"), message
    if kind in ("crc", "trailing"):  # detected at the end of the stream, after every line
        assert message.endswith("(after line 3000)")


def test_stream_errors_never_escape_as_eof_or_os_error():
    class Failing:
        def __init__(self, exc: BaseException):
            self.exc = exc

        def __iter__(self):
            yield b"one\n"
            raise self.exc

    for exc in (EOFError("eof"), OSError(5, "Input/output error"), zlib.error("bad")):
        with pytest.raises(XindaError, match=r"^<stdin>: .*\(after line 1\)$"):
            list(decode_lines(Failing(exc), "<stdin>"))


def test_prepare_truncated_gz_writes_nothing(tmp_path):
    prefix = corpus(tmp_path, "train", lines(3000), lines(3000, 1))
    gz = tmp_path / "train.de.gz"
    (tmp_path / "train.de").unlink()
    gz.write_bytes(broken_gz("truncated"))
    message = prepare_error(config(tmp_path, train=prefix))
    assert message.startswith(f"{gz}: truncated gzip file") and "after line " in message
    assert not (tmp_path / "bin").exists()


# ---------------------------------------------------------------- directories


def test_directory_is_not_reported_as_missing(tmp_path):
    (tmp_path / "train.en").mkdir()
    assert read_error(tmp_path / "train.en") == (
        f"{tmp_path / 'train.en'}: is a directory, not a file")
    with pytest.raises(XindaError) as info:
        corpus_file(str(tmp_path / "train"), "en")
    assert str(info.value) == f"{tmp_path / 'train.en'}: is a directory, not a corpus file"
    write(tmp_path / "train.de", ["x"])
    message = prepare_error(config(tmp_path, train=str(tmp_path / "train")))
    assert "train.en: is a directory" in message and "not found" not in message


def test_gz_beside_a_directory_is_used(tmp_path):
    (tmp_path / "train.en").mkdir()
    with gzip.open(tmp_path / "train.en.gz", "wb") as f:
        f.write(b"x\n")
    assert corpus_file(str(tmp_path / "train"), "en") == tmp_path / "train.en.gz"


def test_a_plain_and_a_gz_file_for_one_prefix_are_refused(tmp_path):
    """Before: gz7.en was read and gz7.en.gz, with other lines, silently ignored."""
    prefix = corpus(tmp_path, "gz7", lines(50), lines(50, 1))
    (tmp_path / "gz7.en.gz").write_bytes(gzip.compress(b"other\n" * 50))
    message = prepare_error(config(tmp_path, train=prefix))
    plain = tmp_path / "gz7.en"
    assert message == (f"{plain}: {plain}.gz exists too, and the corpus prefix {prefix} could "
                       "mean either: remove or rename one")
    assert not (tmp_path / "bin").exists()
    (tmp_path / "gz7.en").unlink()  # one of them: read as before
    assert corpus_file(prefix, "en") == tmp_path / "gz7.en.gz"


# ---------------------------------------------------------------- control characters


def test_control_chars_are_cc_except_tab():
    import unicodedata

    for code in range(0x3000):
        char = chr(code)
        assert has_control_chars(f"a{char}b") == (unicodedata.category(char) == "Cc"
                                                  and char != "\t"), hex(code)
    assert replace_control_chars("a\x00b\x1bc\x7f\td") == "a b c \td"


def test_training_pairs_with_control_chars_are_dropped(tmp_path, capsys):
    src, tgt = lines(200), lines(200, 1)
    src[3] = "the\x00cat sees"  # NUL
    tgt[7] = "der \x1b[31mhund"  # an ANSI escape
    src[9] = "tab\tis fine"  # tab: whitespace, kept
    src[11] = "carriage\rreturn"  # inside the line
    cfg = config(tmp_path, train=corpus(tmp_path, "train", src, tgt))
    manifest = prepare(cfg)
    report = manifest["filter_report"]
    assert report["dropped"]["control_chars"] == 3 and report["kept"] == 197
    assert manifest["splits"]["train"]["pairs"] == 197
    out = capsys.readouterr().out
    assert "train: read 200 pairs, kept 197; dropped:" in out and "control characters 3" in out
    vocab = load_vocabularies(cfg.out_dir).src
    pieces = {vocab.sp.id_to_piece(i) for i in range(vocab.pieces)}
    assert not any(has_control_chars(p) for p in pieces)  # sentencepiece never saw them


def test_control_chars_counted_before_other_filters(tmp_path):
    cfg = config(tmp_path, max_len=40)
    raw = (["a", "b\x00", "", "\x01"], ["x", "", "y", "z"])
    from xinda.data.arrays import TokenArrays

    src = TokenArrays.from_sequences([[5], [], [], [6]])
    tgt = TokenArrays.from_sequences([[5], [], [6], [7]])
    control = np.array([False, True, False, True])
    keep, report = filter_train(raw, src, tgt, cfg, control)
    assert keep.tolist() == [True, False, False, False]
    assert report["dropped"] == {"empty": 1, "too_long": 0, "length_ratio": 0, "duplicate": 0,
                                 "control_chars": 2}


def test_all_pairs_with_control_chars_is_an_error(tmp_path):
    src = [f"{x}\x00" for x in lines(20)]
    prefix = corpus(tmp_path, "train", src, lines(20, 1))
    message = prepare_error(config(tmp_path, train=prefix))
    assert message.startswith(f"{prefix}: all 20 training pairs were removed by filtering")
    assert "control characters 20" in message and "empty 0" in message


def test_valid_and_test_lines_are_cleaned_not_dropped(tmp_path):
    train = corpus(tmp_path, "train", lines(200), lines(200, 1))
    valid_src = ["the\x00cat", "plain line", "\x07", "a\tb"]
    valid_tgt = ["der hund", "ok\x7f", "leer", "c d"]
    valid = corpus(tmp_path, "valid", valid_src, valid_tgt)
    test = corpus(tmp_path, "test1", ["x\x0cy"], ["z"])
    logged: list[str] = []
    cfg = config(tmp_path, train=train, valid=valid, test={"test1": test})
    manifest = prepare(cfg, log=logged.append)
    assert manifest["splits"]["valid"]["pairs"] == 4  # every line kept
    assert manifest["splits"]["valid"]["control_chars_cleaned"] == 3
    assert manifest["splits"]["test1"]["control_chars_cleaned"] == 1
    said = "\n".join(logged)  # (each line may go on with its <unk> count)
    assert "valid: 4 pairs (not filtered; 3 lines with control characters cleaned" in said
    assert "test1: 1 pairs (not filtered; 1 lines with control characters cleaned" in said
    out = Path(cfg.out_dir)
    assert (out / "valid.src.txt").read_text(encoding="utf-8") == "the cat\nplain line\n \na\tb\n"
    assert (out / "valid.tgt.txt").read_text(encoding="utf-8") == "der hund\nok \nleer\nc d\n"
    vocabs = load_vocabularies(out)
    src, _ = load_split(out, "valid")
    assert vocabs.src.decode(src[0].tolist()) == "the cat"  # the space collapsed like any other
    assert len(src[2]) == 0  # a line of control characters only is an empty line


# ---------------------------------------------------------------- vocabulary size


def test_small_corpus_warns_about_vocab_size(tmp_path):
    prefix = corpus(tmp_path, "train", ["the cat sees the dog"], ["der hund"])
    logged: list[str] = []
    manifest = prepare(config(tmp_path, train=prefix, vocab_size=8000), log=logged.append)
    n = manifest["vocab_sizes"]["src"]
    assert manifest["vocab_sizes"] == {"src": n, "tgt": n} and 4 < n < 8000
    warnings = [x for x in logged if x.startswith("warning:")]
    assert warnings == [(f"warning: spm.model has {n} pieces, fewer than data.vocab_size 8000 "
                         "(the training text is too small)")]
    saved = json.loads((tmp_path / "bin" / "manifest.json").read_text(encoding="utf-8"))
    assert saved["vocab_sizes"] == {"src": n, "tgt": n}


@pytest.mark.parametrize("byte_fallback", [False, True])
def test_a_vocabulary_too_small_for_the_characters_names_xindas_settings(tmp_path,
                                                                         byte_fallback):
    """Before: "or set data.byte_fallback" also when it was set (found by review)."""
    chinese = ["".join(chr(0x4E00 + (i * 37 + j) % 500) for j in range(8)) for i in range(80)]
    cfg = config(tmp_path, train=corpus(tmp_path, "train", chinese, chinese), vocab_size=60,
                 byte_fallback=byte_fallback)
    message = prepare_error(cfg)
    assert "Increase data.vocab_size" in message and "(data.character_coverage)" in message
    assert ("or set data.byte_fallback" in message) is not byte_fallback
    assert ("256 byte pieces count too" in message) is byte_fallback


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_sentencepiece_sample_holds_only_pairs_that_are_kept(tmp_path, seed):
    """Before: pairs with an empty side took sample slots, and at seeds 1 and 3 the sample of
    2 held no target line, so training the target's model failed on a usable corpus."""
    src = lines(40)
    tgt = [line if i % 4 == 0 else "" for i, line in enumerate(lines(40, 1))]  # 10 usable
    cfg = config(tmp_path, train=corpus(tmp_path, "train", src, tgt), joint_vocab=False,
                 spm_sample=2, seed=seed)
    manifest = prepare(cfg, log=lambda _: None)
    assert manifest["splits"]["train"]["pairs"] == 10


def test_a_full_disk_names_the_output(tmp_path, monkeypatch):
    """Before: "xinda: error: No space left on device", naming nothing."""
    import errno

    from xinda.data import train_stream

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(train_stream.pickle, "dump", full)
    cfg = config(tmp_path, train=corpus(tmp_path, "train", lines(50), lines(50, 1)))
    assert prepare_error(cfg) == f"{cfg.out_dir}: No space left on device"
    assert not (tmp_path / "bin").exists()


def test_separate_vocabularies_warn_per_model(tmp_path):
    prefix = corpus(tmp_path, "train", lines(300), lines(300, 1))
    logged: list[str] = []
    cfg = config(tmp_path, train=prefix, vocab_size=5000, joint_vocab=False)
    manifest = prepare(cfg, log=logged.append)
    sizes = manifest["vocab_sizes"]
    assert [x.split(" has ")[0] for x in logged if x.startswith("warning:")] == [
        "warning: spm.src.model", "warning: spm.tgt.model"]
    assert f"warning: spm.tgt.model has {sizes['tgt']} pieces" in "\n".join(logged)


def test_reached_vocab_size_gives_no_warning(tmp_path):
    prefix = corpus(tmp_path, "train", lines(300), lines(300, 1))
    logged: list[str] = []
    manifest = prepare(config(tmp_path, train=prefix, vocab_size=60), log=logged.append)
    assert manifest["vocab_sizes"] == {"src": 60, "tgt": 60}
    assert not [x for x in logged if x.startswith("warning:")]


def test_a_byte_order_mark_is_dropped_from_the_first_line_only():
    import io

    lines = list(decode_lines(io.BytesIO("\ufeffone\n\ufefftwo\n".encode()), "bom.txt"))
    assert lines == ["one", "\ufefftwo"]


def test_a_utf16_file_is_an_error_not_garbage(tmp_path):
    """Before: UTF-16 without a byte-order mark read as valid UTF-8 with NUL bytes, and prepare
    took it as a valid set of garbage (exit 0)."""
    import io

    train = corpus(tmp_path, "train", lines(200), lines(200, 1))
    valid = tmp_path / "valid"
    for lang, offset in (("en", 0), ("de", 1)):
        text = "".join(f"{x}\n" for x in lines(5, offset))
        (tmp_path / f"valid.{lang}").write_bytes(text.encode("utf-16-le"))
    message = prepare_error(config(tmp_path, train=train, valid=str(valid)))
    assert message == (f"{valid}.en:1: NUL bytes at every other position: UTF-16 text? "
                       "(convert it to UTF-8, e.g. with iconv -f UTF-16LE -t UTF-8)")
    assert "UTF-16" in error_of(decode_lines, "ok\n".encode("utf-16-be"))
    # before: a short line 1 hid the rest: read as spaced-out garbage (found by review)
    for first in ("1", "", "\r"):
        message = error_of(decode_lines, f"{first}\nTree a small\n".encode("utf-16-le"))
        assert message.startswith("x.txt:2: NUL bytes") and "UTF-16" in message, message
    # before: with a byte-order mark (iconv -t UTF-16, Windows tools) only "invalid UTF-8"
    for encoding in ("utf-16", "utf-16-le", "utf-16-be"):
        bom = {"utf-16-le": "\ufeff", "utf-16-be": "\ufeff"}.get(encoding, "")
        message = error_of(decode_lines, f"{bom}Tree\n".encode(encoding))
        assert message == ("x.txt: UTF-16 text (it starts with a UTF-16 byte-order mark); "
                           "convert it to UTF-8, e.g. with iconv -f UTF-16 -t UTF-8"), message
    # a stray NUL is a control character, as before (cleaned or dropped by the readers)
    assert list(decode_lines(io.BytesIO(b"a\x00b\nnot\x00ok\n"), "x.txt")) == ["a\x00b",
                                                                                "not\x00ok"]


def error_of(read, data: bytes) -> str:
    import io

    with pytest.raises(XindaError) as err:
        list(read(io.BytesIO(data), "x.txt"))
    return str(err.value)


def test_translation_cleans_control_characters_like_prepare():
    from xinda.data.text import TextPipeline

    pipe = TextPipeline("NFKC", False, "none", "en")
    assert pipe.clean("a\x00b\x1b[0mc\x7f d\te") == "a b [0mc d e"
    assert pipe.clean("\x00\x01\x02") == ""


# ---------------------------------------------------------------- a failed re-run


def dataset_files(out_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out_dir.iterdir())}


@pytest.mark.parametrize("change", [{"max_len": 1},  # every pair filtered out: fails at the end
                                    {"seed": 2, "vocab_size": 90, "max_len": 1}])  # new spm first
def test_a_failed_rerun_leaves_the_earlier_dataset_as_it_was(tmp_path, change):
    train = corpus(tmp_path, "train", lines(200), lines(200, 1))
    valid = corpus(tmp_path, "valid", lines(5, 3), lines(5, 4))
    prepare(config(tmp_path, train=train, valid=valid), log=lambda _: None)
    before = dataset_files(tmp_path / "bin")
    assert "all 200 training pairs were removed" in prepare_error(
        config(tmp_path, train=train, valid=valid, **change))
    assert dataset_files(tmp_path / "bin") == before  # nothing new, nothing left behind
    load_vocabularies(tmp_path / "bin")
    assert len(load_split(tmp_path / "bin", "valid")[0]) == 5


def test_an_interrupted_rerun_leaves_the_earlier_dataset_as_it_was(tmp_path, monkeypatch):
    """Ctrl-C while the training arrays are written, after the new sentencepiece model."""
    import xinda.data.prepare as prepare_module

    train = corpus(tmp_path, "train", lines(200), lines(200, 1))
    prepare(config(tmp_path, train=train), log=lambda _: None)
    before = dataset_files(tmp_path / "bin")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(prepare_module, "binarise_train", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare(config(tmp_path, train=train, seed=2), log=lambda _: None)
    assert dataset_files(tmp_path / "bin") == before


def test_a_rerun_replaces_the_dataset_whole(tmp_path):
    prepare(config(tmp_path, train=corpus(tmp_path, "a", lines(200), lines(200, 1))),
            log=lambda _: None)
    second = prepare(config(tmp_path, train=corpus(tmp_path, "b", lines(150), lines(150, 1))),
                     log=lambda _: None)
    assert second["splits"]["train"]["pairs"] == 150
    saved = json.loads((tmp_path / "bin" / "manifest.json").read_text(encoding="utf-8"))
    assert saved["splits"] == second["splits"]
    assert len(load_split(tmp_path / "bin", "train")[0]) == second["splits"]["train"]["pairs"]
    assert not list((tmp_path / "bin").glob(".*"))  # no staging folder left


def test_a_rerun_removes_the_staging_folder_of_a_killed_run(tmp_path):
    """Before: a run killed by SIGKILL or the OOM killer (no cleanup runs) left its staging
    folder, as large as the corpus, hidden in data.out_dir for good (found by review)."""
    train = corpus(tmp_path, "train", lines(200), lines(200, 1))
    left = tmp_path / "bin" / ".staging-killed"
    (left / ".spool-1").mkdir(parents=True)
    (left / ".spool-1" / "train.pkl").write_bytes(b"x" * 1000)
    prepare(config(tmp_path, train=train), log=lambda _: None)
    assert not list((tmp_path / "bin").glob(".*"))


def test_a_second_prepare_into_a_folder_being_written_is_refused(tmp_path):
    """Two prepares into one folder would replace each other's files; the second stops with a
    one-line error and leaves the folder as it was."""
    import fcntl

    from xinda.data.prepare import LOCK

    train = corpus(tmp_path, "train", lines(200), lines(200, 1))
    prepare(config(tmp_path, train=train), log=lambda _: None)
    before = dataset_files(tmp_path / "bin")
    with open(tmp_path / "bin" / LOCK, "a") as held:  # as a running prepare holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        message = prepare_error(config(tmp_path, train=train, seed=2))
        assert message.startswith(f"{tmp_path / 'bin'}: another xinda prepare is writing")
        assert dataset_files(tmp_path / "bin") == before | {LOCK: b""}
    (tmp_path / "bin" / LOCK).unlink()
    prepare(config(tmp_path, train=train, seed=2), log=lambda _: None)
    assert dataset_files(tmp_path / "bin").keys() == before.keys()


def test_a_rerun_removes_the_files_the_new_dataset_does_not_have(tmp_path):
    """Before: a test set dropped and separate vocabularies instead of a joint one left x.*
    and spm.model behind, and load_split still read x with the old vocabulary."""
    train = corpus(tmp_path, "train", lines(200), lines(200, 1))
    test = corpus(tmp_path, "x", lines(10, 3), lines(10, 4))
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "notes.md").write_text("mine")  # not the dataset's: stays
    prepare(config(tmp_path, train=train, test={"x": test}), log=lambda _: None)
    assert ((tmp_path / "bin" / "x.src.ids.npy").exists()
            and (tmp_path / "bin" / "spm.model").exists())
    prepare(config(tmp_path, train=train, joint_vocab=False), log=lambda _: None)
    left = {p.name for p in (tmp_path / "bin").iterdir()}
    assert not {name for name in left if name.startswith("x.")} and "spm.model" not in left
    assert {"spm.src.model", "spm.tgt.model", "notes.md"} <= left
    with pytest.raises(XindaError, match="no split 'x'"):
        load_split(tmp_path / "bin", "x")


def test_moses_rules_come_from_a_language_not_a_file_suffix(tmp_path):
    """Before: files named .doc/.sum gave Moses the "language" sum, without English rules:
    "O'Neil's" became "O ' Neil ' s", silently. Now a warning names the setting,
    and data.moses_lang_tgt gives the language."""
    (tmp_path / "c").mkdir()
    write(tmp_path / "c" / "train.doc", lines(300))
    write(tmp_path / "c" / "train.sum", [f"Mr. O'Neil's {x}" for x in lines(300, 1)])
    base = {"train": str(tmp_path / "c" / "train"), "src_lang": "doc", "tgt_lang": "sum",
            "pretok_tgt": "moses", "vocab_size": 60}
    logged: list[str] = []
    prepare(config(tmp_path, **base), log=logged.append)
    assert [x for x in logged if "Moses" in x] == [
        ("warning: data.tgt_lang 'sum' is not a language Moses has rules for (apostrophes, "
         "abbreviations): \"O'Neil's\" becomes \"O ' Neil ' s\"; set data.moses_lang_tgt, "
         "e.g. en")]
    logged.clear()
    manifest = prepare(config(tmp_path, **base, moses_lang_tgt="en"), log=logged.append)
    assert not [x for x in logged if "Moses" in x]
    tgt = load_vocabularies(tmp_path / "bin").tgt_text
    assert manifest["text"]["tgt"]["lang"] == "en"
    assert tgt.preprocess("Mr. O'Neil's car") == "Mr. O 'Neil 's car"


def test_unknown_characters_of_valid_and_test_sets_are_counted(tmp_path):
    """Before: nothing said that valid/test text held characters the vocabulary lacks."""
    train = corpus(tmp_path, "train", lines(300), lines(300, 1))
    valid = corpus(tmp_path, "valid", ["the cat", "the dog"], ["the ☃ cat", "the dog"])
    test = corpus(tmp_path, "test", ["the cat ☃☃"], ["the cat"])
    logged: list[str] = []
    manifest = prepare(config(tmp_path, train=train, valid=valid, test={"test": test},
                              vocab_size=60), log=logged.append)
    assert manifest["splits"]["valid"]["unk"] == {"src": 0, "tgt": 1}
    assert manifest["splits"]["test"]["unk"]["src"] >= 1
    assert ("valid: 2 pairs (not filtered; <unk> pieces: 0 source, 1 target, which "
            "data.byte_fallback true spells in bytes)") in logged


def test_a_lock_file_its_holder_removed_before_we_locked_it_is_not_our_lock(tmp_path,
                                                                           monkeypatch):
    """A prepare that opened the lock file just before its holder finished and removed it
    would lock the removed file, while a third locked a new one: two writers (found by
    review). It locks the file at the path instead."""
    import fcntl

    from xinda.data import lock

    path, real_flock, calls = tmp_path / ".lock", fcntl.flock, []

    def flock(handle, operation):
        if not calls:  # between our open and our lock, the holder finishes
            path.unlink()
        calls.append(operation)
        return real_flock(handle, operation)

    monkeypatch.setattr(lock.fcntl, "flock", flock)
    with lock.locked(path, "held: {path}"):
        assert len(calls) == 2 and path.exists()
        with open(path) as other, pytest.raises(BlockingIOError):  # a third process's try
            real_flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert not path.exists()


def test_a_test_set_without_a_name_says_how_to_name_it(tmp_path):
    """Before: "data.test: Input should be a valid dictionary" (found by review)."""
    for given in ("data/test", "[data/test, data/test2]"):
        (tmp_path / "c.yaml").write_text(f"data:\n  test: {given}\n")
        with pytest.raises(XindaError, match=r"data.test: .*give each test set a name: test: "
                                             r"\{test: data/test\}"):
            load_config(tmp_path / "c.yaml")
    (tmp_path / "c.yaml").write_text("data:\n  test:\n")  # nothing after it: no test set
    assert load_config(tmp_path / "c.yaml").data.test == {}
