"""xinda prepare: reading, sentencepiece, filtering, binarisation, manifest and errors."""

import gzip
import random
from pathlib import Path

import numpy as np
import pytest

from xinda.config import DataConfig
from xinda.data.arrays import TokenArrays
from xinda.data.manifest import load_manifest, load_split, load_vocabularies
from xinda.data.prepare import prepare
from xinda.errors import XindaError

EN_DE = {
    "the": "der", "a": "ein", "cat": "katze", "dog": "hund", "man": "mann", "sees": "sieht",
    "likes": "mag", "big": "groß", "small": "klein", "red": "rot", "house": "haus",
    "car": "auto", "and": "und", "runs": "läuft", "home": "heim",
}


def make_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` distinct word-by-word 'translations' with 3-8 words and a final full stop."""
    rng, seen = random.Random(seed), {}
    while len(seen) < n:
        words = rng.choices(list(EN_DE), k=rng.randint(3, 8))
        en = " ".join(words).capitalize() + "."
        seen[en] = " ".join(EN_DE[w] for w in words).capitalize() + "."
    return list(seen.items())


def write_side(path, lines, gz=False):
    data = "".join(f"{line}\n" for line in lines).encode("utf-8")
    if gz:
        with gzip.open(f"{path}.gz", "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


def write_corpus(prefix, pairs, gz=False) -> str:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    write_side(prefix.parent / f"{prefix.name}.en", [s for s, _ in pairs], gz)
    write_side(prefix.parent / f"{prefix.name}.de", [t for _, t in pairs], gz)
    return str(prefix)


def config(tmp_path, **kw) -> DataConfig:
    base = {"src_lang": "en", "tgt_lang": "de", "vocab_size": 80, "out_dir": str(tmp_path / "bin"),
            "max_len_ratio": 3.0, "pretok_src": "moses", "pretok_tgt": "moses"}
    return DataConfig(**(base | kw))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """One joint-vocab preparation with train, valid (incl. an empty line) and a test set."""
    root = tmp_path_factory.mktemp("corpus")
    pairs = make_pairs(330)
    valid = [*pairs[300:310], ("", ""), ("Dog", "Hund und Katze und Haus und Auto")]
    cfg = config(
        root,
        train=write_corpus(root / "train", pairs[:300]),
        valid=write_corpus(root / "valid", valid),
        test={"test1": write_corpus(root / "test1", pairs[310:])},
    )
    return cfg, prepare(cfg, log=lambda _: None), valid


def test_outputs_and_manifest(prepared):
    cfg, manifest, valid = prepared
    out = cfg.out_dir
    assert load_manifest(out) == manifest
    assert manifest["format_version"] == 1 and manifest["joint_vocab"] is True
    assert manifest["spm"] == {"src": "spm.model", "tgt": "spm.model"}
    assert manifest["text"]["src"] == {"normalize": "NFKC", "lowercase": False, "pretok": "moses",
                                       "lang": "en"}
    assert set(manifest["splits"]) == {"train", "valid", "test1"}
    assert manifest["splits"]["train"]["pairs"] == 300
    assert manifest["splits"]["valid"]["pairs"] == len(valid)  # never filtered
    assert manifest["splits"]["test1"]["pairs"] == 20
    assert manifest["config"]["train"] == cfg.train
    assert manifest["filter_report"]["kept"] == 300
    vocab = load_vocabularies(out).src
    assert (vocab.pad, vocab.unk, vocab.bos, vocab.eos) == (0, 1, 2, 3)


def test_arrays_decode_to_preprocessed_text(prepared):
    cfg, manifest, valid = prepared
    src, tgt = load_split(cfg.out_dir, "valid")
    assert src.ids.dtype == np.int32 and src.offsets.dtype == np.int64
    assert len(src) == len(tgt) == len(valid) and len(src.offsets) == len(valid) + 1
    assert src.lengths[len(valid) - 2] == 0  # the empty line is kept, with no tokens
    assert int(src.lengths.sum()) == manifest["splits"]["valid"]["src_tokens"]
    vocabs = load_vocabularies(cfg.out_dir)
    for pipe, vocab, arrays, k in ((vocabs.src_text, vocabs.src, src, 0),
                                   (vocabs.tgt_text, vocabs.tgt, tgt, 1)):
        for i, pair in enumerate(valid):
            assert vocab.decode(arrays[i].tolist()) == pipe.preprocess(pair[k])


def test_raw_text_kept_for_valid_and_test(prepared):
    cfg, _, valid = prepared
    out = Path(cfg.out_dir)
    assert (out / "valid.tgt.txt").read_text(encoding="utf-8") == "".join(
        f"{t}\n" for _, t in valid)
    assert (out / "test1.src.txt").read_text(encoding="utf-8").count("\n") == 20
    assert not list(out.glob("train.*.txt"))


def test_separate_vocab_files(tmp_path):
    cfg = config(tmp_path, train=write_corpus(tmp_path / "train", make_pairs(200)),
                 joint_vocab=False, vocab_size=60)
    manifest = prepare(cfg, log=lambda _: None)
    assert manifest["joint_vocab"] is False
    assert manifest["spm"] == {"src": "spm.src.model", "tgt": "spm.tgt.model"}
    out = tmp_path / "bin"
    assert (out / "spm.src.model").is_file() and (out / "spm.tgt.model").is_file()
    assert not (out / "spm.model").exists()
    src_vocab = load_vocabularies(out, manifest).src
    assert "▁hund" not in src_vocab.encode_pieces("hund")  # German words only in tgt model
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temp files left


def test_spm_model_reuse(prepared, tmp_path):
    cfg, _, _ = prepared
    model = f"{cfg.out_dir}/spm.model"
    reuse = config(tmp_path, train=cfg.train, spm_model=model, joint_vocab=False)
    logged = []
    manifest = prepare(reuse, log=logged.append)
    assert manifest["spm"] == {"src": "spm.model", "tgt": "spm.model"}
    assert "warning: data.joint_vocab False has no effect with data.spm_model: the given " \
        "sentencepiece model is used as it is, for both sides" in logged  # (was silent)
    assert (tmp_path / "bin" / "spm.model").read_bytes() == Path(model).read_bytes()
    a, _ = load_split(cfg.out_dir, "train")
    b, _ = load_split(tmp_path / "bin", "train")
    assert np.array_equal(a.ids, b.ids)


def test_gz_input_read_like_plain(tmp_path):
    pairs = make_pairs(150, seed=3)
    plain = config(tmp_path / "p", train=write_corpus(tmp_path / "p" / "train", pairs))
    gz = config(tmp_path / "g", train=write_corpus(tmp_path / "g" / "train", pairs, gz=True))
    prepare(plain, log=lambda _: None)
    prepare(gz, log=lambda _: None)
    for a, b in zip(load_split(plain.out_dir, "train"), load_split(gz.out_dir, "train")):
        assert np.array_equal(a.ids, b.ids) and np.array_equal(a.offsets, b.offsets)


@pytest.mark.parametrize("chunk_size", [1000, 60])
def test_filter_report_counts(tmp_path, capsys, chunk_size):
    """The counts, and each dropped pair's line in filtered-train.tsv (before: counts only, so
    which pairs went could not be checked; found by review), also across chunks."""
    pairs = make_pairs(200, seed=5)
    long_en = " ".join(["the big red cat"] * 12) + "."
    crafted = pairs + [
        ("The dog runs.", ""),  # empty side
        (long_en, long_en.replace("the big red cat", "der groß rot katze")),  # too long
        ("Dog.", "Der hund und die katze und der mann und das auto und das haus."),  # ratio
        pairs[7],  # exact duplicate
    ]
    cfg = config(tmp_path, train=write_corpus(tmp_path / "train", crafted), max_len=40,
                 chunk_size=chunk_size)
    report = prepare(cfg)["filter_report"]
    dropped = {"empty": 1, "too_long": 1, "length_ratio": 1, "duplicate": 1, "control_chars": 0}
    assert report == {"read": 204, "kept": 200, "dropped": dropped}
    assert load_split(cfg.out_dir, "train")[0].lengths.max() <= 40
    assert ("train: read 204 pairs, kept 200; dropped: empty 1, too long 1, length ratio 1, "
            "duplicate 1, control characters 0 (their lines: filtered-train.tsv)"
            ) in capsys.readouterr().out
    assert (Path(cfg.out_dir) / "filtered-train.tsv").read_text() == (
        "line\tfilter\n201\tempty\n202\ttoo_long\n203\tlength_ratio\n204\tduplicate\n")


def test_long_pairs_truncated_not_dropped(tmp_path, capsys):
    """With long_pairs: truncate, the long pair is kept with its long side cut to max_len
    pieces (the first pieces of the full encoding), and the cut is counted per side among the
    kept pairs (before: its duplicate, dropped, was counted too)."""
    pairs = make_pairs(200, seed=5)
    long_en = " ".join(["the big red cat"] * 12) + "."
    valid = [("Dog.", "Hund."), (long_en, "Katze.")]
    train = [*pairs, (long_en, "Katze."), (long_en, "Katze.")]
    cfg = config(tmp_path, train=write_corpus(tmp_path / "train", train),
                 valid=write_corpus(tmp_path / "valid", valid), max_len=40,
                 max_len_ratio=100.0, long_pairs="truncate")
    manifest = prepare(cfg)
    report = manifest["filter_report"]
    assert report["kept"] == 201 and report["dropped"]["too_long"] == 0
    assert report["dropped"]["duplicate"] == 1
    assert report["truncated"] == {"src": 1, "tgt": 0}
    assert manifest["splits"]["valid"]["truncated"] == {"src": 1, "tgt": 0}
    vocabs = load_vocabularies(cfg.out_dir)
    full = vocabs.src.sp.encode(vocabs.src_text.preprocess(long_en), out_type=int)
    src, _ = load_split(cfg.out_dir, "valid")
    assert len(full) > 40 and list(src[1]) == full[:40] and src.lengths[0] < 40
    assert "cut to data.max_len: 1 sources, 0 targets" in capsys.readouterr().out


def test_truncate_arrays_hand_computed():
    arrays = TokenArrays.from_sequences([[1, 2, 3, 4], [], [5], [6, 7, 8]])
    cut, n = arrays.truncate(2)
    assert [list(x) for x in cut] == [[1, 2], [], [5], [6, 7]] and n == 2


def test_dedup_off_keeps_duplicates(tmp_path):
    pairs = make_pairs(100, seed=6)
    cfg = config(tmp_path, train=write_corpus(tmp_path / "train", pairs + pairs[:5]), dedup=False)
    assert prepare(cfg, log=lambda _: None)["filter_report"]["kept"] == 105


def expect_error(cfg, *fragments):
    with pytest.raises(XindaError) as info:
        prepare(cfg, log=lambda _: None)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message
    return message


def test_missing_file(tmp_path):
    write_side(tmp_path / "train.en", ["Hello ."])
    message = expect_error(config(tmp_path, train=str(tmp_path / "train")), "train.de")
    assert "file not found" in message and "train.de.gz" in message


def test_invalid_utf8_names_line(tmp_path):
    prefix = write_corpus(tmp_path / "train", make_pairs(5))
    lines = (tmp_path / "train.de").read_bytes().split(b"\n")
    lines[2] = b"Der hund \xff."
    (tmp_path / "train.de").write_bytes(b"\n".join(lines))
    expect_error(config(tmp_path, train=prefix), "train.de:3:", "UTF-8")


def test_misaligned_line_counts(tmp_path):
    prefix = write_corpus(tmp_path / "train", make_pairs(120))
    write_side(tmp_path / "train.de", [t for _, t in make_pairs(120)][:119])
    expect_error(config(tmp_path, train=prefix), "train.de:119:", "train.en has more")


def test_empty_corpus(tmp_path):
    train = write_corpus(tmp_path / "train", make_pairs(50))
    valid = write_corpus(tmp_path / "valid", [])
    expect_error(config(tmp_path, train=train, valid=valid), "valid.en", "empty corpus")


def test_everything_filtered(tmp_path):
    prefix = write_corpus(tmp_path / "train", make_pairs(50))
    expect_error(config(tmp_path, train=prefix, max_len=1),
                 "train: all 50 training pairs were removed by filtering", "too long 50")


def test_everything_empty(tmp_path):
    prefix = write_corpus(tmp_path / "train", [(s, "") for s, _ in make_pairs(10)])
    expect_error(config(tmp_path, train=prefix), "all 10 training pairs", "empty 10")


def test_load_errors(tmp_path, prepared):
    with pytest.raises(XindaError, match="manifest.json: not found"):
        load_manifest(tmp_path)
    with pytest.raises(XindaError, match="no split 'nope'.*train, valid, test1"):
        load_split(prepared[0].out_dir, "nope")


def test_token_arrays(tmp_path):
    arrays = TokenArrays.from_sequences([[5, 6], [], [7, 8, 9]])
    assert len(arrays) == 3 and arrays.lengths.tolist() == [2, 0, 3]
    assert arrays[-1].tolist() == [7, 8, 9] and arrays[1].size == 0
    picked = arrays.select(np.array([True, False, True]))
    assert [x.tolist() for x in picked] == [[5, 6], [7, 8, 9]]
    with pytest.raises(IndexError):
        arrays[3]
    TokenArrays.from_sequences([]).save(tmp_path, "empty")
    empty = TokenArrays.load(tmp_path, "empty")
    assert len(empty) == 0 and empty.ids.dtype == np.int32 and empty.offsets.tolist() == [0]


def test_sentencepiece_learns_the_characters_of_lines_over_4192_bytes(tmp_path):
    """Before: sentencepiece skipped training lines over 4192 bytes (its default
    max_sentence_length) without a word, so characters only they held became <unk>."""
    import sentencepiece as spm

    from xinda.data.prepare import train_spm

    long = " ".join(f"жук{j % 10}" for j in range(700))  # 5599 bytes
    lines = [f"the cat {i}" for i in range(100)] + [long] * 3
    sp = spm.SentencePieceProcessor(model_proto=train_spm(lines, config(tmp_path, vocab_size=60)))
    assert sp.unk_id() not in sp.encode(long[:40])
    assert sp.decode(sp.encode(long)) == long


def test_the_length_ratio_spares_short_pairs():
    """Before: 走着瞧 | Wait and see. (1 and 4 pieces) was dropped by a ratio of 3, and so were
    2.6 % of correct en->zh Tatoeba pairs. A pair whose longer side has more than
    data.ratio_min_len pieces is still held to the ratio."""
    from xinda.config import DataConfig
    from xinda.data.arrays import TokenArrays
    from xinda.data.filtering import filter_train

    lengths = [(1, 4), (1, 5), (1, 6), (2, 6), (2, 7), (5, 1), (6, 1)]
    src = TokenArrays.from_sequences([[5] * a for a, _ in lengths])
    tgt = TokenArrays.from_sequences([[5] * b for _, b in lengths])
    raw = ([str(i) for i in range(7)], [str(i) for i in range(7)])
    keep, report = filter_train(raw, src, tgt, DataConfig(max_len_ratio=3.0))
    assert keep.tolist() == [True, True, False, True, False, True, False]
    assert report["dropped"]["length_ratio"] == 3
    keep, _ = filter_train(raw, src, tgt, DataConfig(max_len_ratio=3.0, ratio_min_len=0))
    assert keep.tolist() == [False, False, False, True, False, False, False]


@pytest.mark.parametrize("byte_fallback", [False, True])
def test_byte_fallback_spells_unseen_characters_in_bytes(tmp_path, byte_fallback):
    """Found by review: without it a rare Chinese character came out as " ⁇ " (76 of 1000
    classical-modern test references); with it, as itself."""
    prefix = write_corpus(tmp_path / "train", make_pairs(300))
    manifest = prepare(config(tmp_path, train=prefix, vocab_size=400,
                              byte_fallback=byte_fallback), log=lambda _: None)
    vocab = load_vocabularies(tmp_path / "bin", manifest).tgt
    ids = vocab.encode("Ein Hund sieht 孪生.")
    assert (vocab.unk in ids) != byte_fallback
    assert (vocab.decode(ids) == "Ein Hund sieht 孪生.") == byte_fallback


def test_a_vocabulary_too_small_for_the_characters_names_the_settings(tmp_path):
    prefix = write_corpus(tmp_path / "train", [(f"{chr(0x4e00 + i)} a", "b") for i in range(200)])
    with pytest.raises(XindaError, match=r"Increase data.vocab_size or decrease "
                                         r"character_coverage \(data.character_coverage\)"):
        prepare(config(tmp_path, train=prefix, vocab_size=60, pretok_src="none",
                       max_len_ratio=10), log=lambda _: None)


def test_heavy_length_filtering_is_warned_with_its_likely_cause():
    """Before: 63 % of 5000 Tatoeba zh-en pairs went to the length-ratio filter at vocab_size
    32000 with pretok none, without a word (found by review): sentencepiece had made whole
    Chinese sentences single pieces."""
    from xinda.data.filtering import heavy_drop_warning, report

    def dropped(ratio: int, long: int = 0) -> dict:
        return report(5000, {"empty": 0, "too_long": long, "length_ratio": ratio,
                             "duplicate": 40, "control_chars": 0})
    zh = {"pairs": 1868, "src_tokens": 4483, "tgt_tokens": 16000}
    assert heavy_drop_warning(dropped(3132), zh) == (
        "warning: the length filters dropped 3132 of 5000 training pairs (63%): its src (2.4 "
        "pieces per kept line) looks like whole sentences made pieces; pre-tokenise that side "
        "(data.pretok_src / pretok_tgt: jieba or char for Chinese) or lower data.vocab_size")
    words = {"pairs": 4600, "src_tokens": 46000, "tgt_tokens": 50000}
    assert heavy_drop_warning(dropped(200, 100), words).endswith(
        "(6%): see data.max_len, data.max_len_ratio and data.ratio_min_len")
    assert heavy_drop_warning(dropped(250), words) is None  # 5 %: not heavy


def test_prepare_warns_when_the_length_filters_drop_many_pairs(tmp_path):
    pairs = make_pairs(200, seed=6) + [
        (f"Dog {i}.", "Der hund und die katze und der mann und das auto und das haus.")
        for i in range(20)]
    lines = []
    prepare(config(tmp_path, train=write_corpus(tmp_path / "train", pairs)), log=lines.append)
    assert "warning: the length filters dropped 20 of 220 training pairs (9%): see" in lines[-1]
