"""Prepared directories whose arrays or sentencepiece model no longer match each other or the
manifest: each is refused on load in one line naming the file, instead of loading silently or
failing later in training (a broadcast error, an embedding index out of range)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from data.test_bad_input_prepare import config, corpus, lines

from xinda.data.arrays import TokenArrays
from xinda.data.manifest import load_split, load_vocabularies
from xinda.data.prepare import prepare
from xinda.errors import XindaError

AGAIN = "re-run xinda prepare"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("prepared")
    train = corpus(root, "train", lines(200), lines(200, 1))
    prepare(config(root, train=train), log=lambda _: None)
    return root / "bin"


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> Path:
    """A sentencepiece model with fewer pieces than the prepared directory's."""
    root = tmp_path_factory.mktemp("small")
    train = corpus(root, "train", lines(200), lines(200, 1))
    prepare(config(root, train=train, vocab_size=36), log=lambda _: None)
    return root / "bin" / "spm.model"


@pytest.fixture
def data(prepared, tmp_path) -> Path:
    """A copy of the prepared directory, to damage."""
    return shutil.copytree(prepared, tmp_path / "bin")


def error(call, *args) -> str:
    with pytest.raises(XindaError) as info:
        call(*args)
    assert "\n" not in str(info.value)
    return str(info.value)


def edit_manifest(data: Path, edit) -> None:
    path = data / "manifest.json"
    manifest = json.loads(path.read_text(encoding="utf-8"))
    edit(manifest)
    path.write_text(json.dumps(manifest), encoding="utf-8")


def test_stale_offsets_are_refused(data):
    """Before: offsets ending past the ids loaded silently, the last sentence cut short."""
    n = len(np.load(data / "train.src.ids.npy"))
    np.save(data / "train.src.offsets.npy", np.array([0, 3, 5, n + 100], dtype=np.int64))
    assert error(load_split, data, "train") == (
        f"{data / 'train.src.offsets.npy'}: the offsets end at {n + 100}, but "
        f"train.src.ids.npy has {n} ids; {AGAIN}")


@pytest.mark.parametrize(("offsets", "wrong"), [
    (np.array([2, 3, 5], dtype=np.int64), "the offsets start at 2, not 0"),
    (np.array([0, 4, 3, 5], dtype=np.int64),
     "the offsets decrease: sentence 1 would run from 4 back to 3"),
    (np.array([], dtype=np.int64), "no offsets (not even the initial 0)"),
    (np.array([0, 2], dtype=np.int32), "offsets of type int32, not int64"),
    (np.array([[0, 2]], dtype=np.int64), "a 2-D array, not 1-D"),
])
def test_malformed_offsets_are_refused(data, offsets, wrong):
    np.save(data / "train.src.offsets.npy", offsets)
    assert error(TokenArrays.load, data, "train.src") == (
        f"{data / 'train.src.offsets.npy'}: {wrong}; {AGAIN}")


@pytest.mark.parametrize(("ids", "wrong"), [
    (np.arange(10, dtype=np.float64), "ids of type float64, not integers"),
    (np.zeros((2, 5), dtype=np.int32), "a 2-D array, not 1-D"),
])
def test_malformed_ids_are_refused(data, ids, wrong):
    """Before: float64 ids were accepted."""
    np.save(data / "train.src.ids.npy", ids)
    assert error(TokenArrays.load, data, "train.src") == (
        f"{data / 'train.src.ids.npy'}: {wrong}; {AGAIN}")


@pytest.mark.parametrize(("name", "damage"), [
    ("train.src.ids.npy", lambda b: b[:-40]),  # before: "mmap length is greater than ..."
    ("train.src.offsets.npy", lambda b: b"not numpy"),  # before: numpy's pickle ValueError
    ("train.tgt.offsets.npy", lambda b: b""),  # before: EOFError
    ("train.tgt.ids.npy", lambda b: b[:50]),  # cut inside the header
])
def test_damaged_files_are_named(data, name, damage):
    path = data / name
    path.write_bytes(damage(path.read_bytes()))
    assert error(load_split, data, "train") == (
        f"{path}: damaged or truncated, not a readable .npy array; {AGAIN}")


def test_a_missing_array_file_is_named(data):
    """Before: a raw FileNotFoundError."""
    (data / "train.tgt.ids.npy").unlink()
    assert error(load_split, data, "train") == (
        f"{data / 'train.tgt.ids.npy'}: not found; {AGAIN}")


def fewer_target_sentences(data: Path) -> int:
    """Replace the training target side by its first sentences; return the full count."""
    tgt = TokenArrays.load(data, "train.tgt")
    TokenArrays.from_sequences([list(x) for x in tgt][:-3]).save(data, "train.tgt")
    return len(tgt)


def test_sides_of_different_lengths_are_refused(data):
    """Before: 17 target sentences for 20 source ones loaded, and training then died in
    np.maximum with a broadcast ValueError."""
    n = fewer_target_sentences(data)
    assert error(load_split, data, "train") == (
        f"{data / 'train.tgt.offsets.npy'}: {n - 3} sentences, but {data / 'manifest.json'} "
        f"records {n} pairs for split 'train'; {AGAIN}")


def test_sides_are_compared_without_a_recorded_pair_count(data):
    n = fewer_target_sentences(data)
    edit_manifest(data, lambda m: m["splits"]["train"].pop("pairs"))
    assert error(load_split, data, "train") == (
        f"{data / 'train.tgt.offsets.npy'}: {n - 3} sentences, but train.src.offsets.npy has "
        f"{n}; {AGAIN}")


def test_both_sides_stale_against_the_manifest_are_refused(data):
    src, tgt = load_split(data, "train")
    for stem, arrays in (("train.src", src), ("train.tgt", tgt)):
        TokenArrays.from_sequences([list(x) for x in arrays][:5]).save(data, stem)
    assert error(load_split, data, "train") == (
        f"{data / 'train.src.offsets.npy'}: 5 sentences, but {data / 'manifest.json'} records "
        f"{len(src)} pairs for split 'train'; {AGAIN}")


def test_intact_data_still_loads(prepared):
    src, tgt = load_split(prepared, "train")
    assert len(src) == len(tgt) > 0 and src.ids.dtype == np.int32
    assert isinstance(src.ids, np.memmap)  # still memory-mapped, not copied
    assert src.lengths.sum() == len(src.ids)


def test_a_replaced_sentencepiece_model_is_refused(data, small_model):
    """Before: a smaller spm.model loaded, and training died with 'IndexError: index out of
    range in self' in the embedding."""
    n = json.loads((data / "manifest.json").read_text(encoding="utf-8"))["vocab_sizes"]["src"]
    shutil.copy(small_model, data / "spm.model")
    m = load_vocabularies(small_model.parent).src.pieces
    assert m != n
    assert error(load_vocabularies, data) == (
        f"{data / 'spm.model'}: {m} pieces, but {data / 'manifest.json'} records {n}: not the "
        "sentencepiece model this directory was made with (re-run xinda prepare, or put the "
        "original back)")


def test_a_manifest_without_vocab_sizes_skips_the_check(data, small_model):
    """Manifests written before ``vocab_sizes`` existed still load."""
    shutil.copy(small_model, data / "spm.model")
    edit_manifest(data, lambda m: m.pop("vocab_sizes"))
    assert load_vocabularies(data).src.pieces == load_vocabularies(small_model.parent).src.pieces


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: m["text"]["src"].update(pretok="mosess"), "text.src: pretok must be one of"),
    (lambda m: m["text"].update(src={"normalize": "NFKC"}), "text.src: "),
    (lambda m: m["text"].update(tgt="moses"), "text.tgt should be a dict, got 'moses'"),
    (lambda m: m["spm"].pop("tgt"), "spm.tgt should be a str, got None"),
    (lambda m: m.update(spm=["spm.model"]), "spm.src should be a str"),
    (lambda m: m.update(joint_vocab="yes"), "joint_vocab should be a bool"),
])
def test_a_damaged_manifest_is_one_line(data, edit, message):
    """Before: a ValueError, TypeError or KeyError from deep inside the readers, which the
    command line printed as a traceback (found by review)."""
    edit_manifest(data, edit)
    assert message in error(load_vocabularies, data)
    assert "invalid manifest" in error(load_vocabularies, data)
