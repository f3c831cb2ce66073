"""Streaming ``xinda prepare``: the chunked result equals the whole-corpus (in-memory) pipeline,
does not depend on the chunk size or the number of workers, samples sentencepiece's text with
a seeded reservoir and finds misaligned files while streaming."""

from __future__ import annotations

import io
import os
import random
import signal
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from xinda.config import DataConfig
from xinda.data.arrays import TokenArrays
from xinda.data.manifest import load_split, load_vocabularies
from xinda.data.prepare import filter_train, prepare, train_spm
from xinda.data.stream import NpyAppender, Reservoir, ordered_map, result_of
from xinda.data.text import TextPipeline
from xinda.data.train_stream import control_mask, encode_lines, worker_pool
from xinda.errors import XindaError
from xinda.utils import interrupts_deferred, signal_handled

WORDS = {"the": "der", "a": "ein", "cat": "katze", "dog": "hund", "man": "mann", "sees": "sieht",
         "likes": "mag", "big": "groß", "small": "klein", "red": "rot", "house": "haus"}


def make_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` distinct word-by-word 'translations' of 3-8 words."""
    rng, seen = random.Random(seed), {}
    while len(seen) < n:
        words = rng.choices(list(WORDS), k=rng.randint(3, 8))
        seen[" ".join(words).capitalize() + "."] = " ".join(WORDS[w] for w in words) + "."
    return list(seen.items())


def write_corpus(prefix: Path, pairs: list[tuple[str, str]]) -> str:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for lang, k in (("en", 0), ("de", 1)):
        (prefix.parent / f"{prefix.name}.{lang}").write_text(
            "".join(f"{p[k]}\n" for p in pairs), encoding="utf-8")
    return str(prefix)


def config(tmp_path: Path, **kw) -> DataConfig:
    base = {"src_lang": "en", "tgt_lang": "de", "vocab_size": 80, "out_dir": str(tmp_path / "bin"),
            "pretok_src": "moses", "pretok_tgt": "moses"}
    return DataConfig(**(base | kw))


def crafted_pairs() -> list[tuple[str, str]]:
    """Pairs that every filter drops somewhere, duplicates far apart (other chunks), one only
    once cleaned (NFKC: a no-break space; before: kept as another pair)."""
    pairs = make_pairs(240, seed=11)
    long_en = " ".join(["the big red cat"] * 12) + "."
    pairs[5] = ("The dog runs.", "")
    pairs[17] = (long_en, long_en.replace("the big red cat", "der groß rot katze"))
    pairs[30] = ("Dog.", "Der hund und die katze und der mann und das auto und das haus.")
    pairs[41] = ("The\x00 cat.", "Die katze.")
    alike = (pairs[7][0].replace(" ", "\u00a0", 1), pairs[7][1])  # the same once cleaned
    return pairs + pairs[100:110] + [pairs[3], pairs[3], alike] + pairs[200:205]


def reference(cfg, pairs) -> dict:
    """The whole-corpus pipeline, as ``prepare`` was before streaming: one list per side."""
    raw = ([s for s, _ in pairs], [t for _, t in pairs])
    control = control_mask(raw)
    pipes = [TextPipeline(cfg.normalize, cfg.lowercase, p, lang) for p, lang in
             ((cfg.pretok_src, cfg.src_lang), (cfg.pretok_tgt, cfg.tgt_lang))]
    text = [["" if c else pipe.preprocess(x) for x, c in zip(lines, control)]
            for pipe, lines in zip(pipes, raw)]
    usable = [i for i, (s, t) in enumerate(zip(*text)) if s and t]  # both sides non-empty
    if cfg.dedup:  # the first of pairs identical once cleaned
        usable = sorted({(text[0][i], text[1][i]): i for i in reversed(usable)}.values())
    model = train_spm([side[i] for side in text for i in usable], cfg)
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model)
    src, tgt = (encode_lines(sp, side) for side in text)
    keep, report = filter_train((text[0], text[1]), src, tgt, cfg, control)
    return {"model": model, "src": src.select(keep), "tgt": tgt.select(keep), "report": report}


def same_arrays(a: TokenArrays, b: TokenArrays) -> bool:
    return np.array_equal(a.ids, b.ids) and np.array_equal(a.offsets, b.offsets)


def test_chunked_prepare_equals_the_whole_corpus_pipeline(tmp_path):
    pairs = crafted_pairs()
    cfg = config(tmp_path, train=write_corpus(tmp_path / "train", pairs), max_len=40,
                 chunk_size=16)
    manifest = prepare(cfg, log=lambda _: None)
    ref = reference(cfg, pairs)
    assert (tmp_path / "bin" / "spm.model").read_bytes() == ref["model"]
    src, tgt = load_split(cfg.out_dir, "train")
    assert same_arrays(src, ref["src"]) and same_arrays(tgt, ref["tgt"])
    assert manifest["filter_report"] == ref["report"]
    dropped = ref["report"]["dropped"]
    assert dropped["duplicate"] == 18 and min(dropped.values()) == 1  # every filter at work
    assert manifest["splits"]["train"] == {"pairs": len(src), "src_tokens": int(src.ids.size),
                                           "tgt_tokens": int(tgt.ids.size)}


def output_files(out_dir) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(out_dir).iterdir())
            if p.name != "manifest.json"}


def test_chunk_size_and_workers_do_not_change_the_output(tmp_path):
    pairs = crafted_pairs()
    train = write_corpus(tmp_path / "train", pairs)
    valid = write_corpus(tmp_path / "valid", make_pairs(12, seed=2))
    runs = {}
    for name, kw in {"one": {}, "chunks": {"chunk_size": 7},
                     "workers": {"chunk_size": 13, "workers": 2}}.items():
        cfg = config(tmp_path / name, train=train, valid=valid, max_len=40,
                     long_pairs="truncate", **kw)
        manifest = prepare(cfg, log=lambda _: None)
        runs[name] = (output_files(cfg.out_dir), manifest["splits"], manifest["filter_report"])
    assert runs["one"] == runs["chunks"] == runs["workers"]
    assert not list(tmp_path.glob("*/bin/.*"))  # no spool left behind


def test_sentencepiece_trains_on_a_seeded_sample(tmp_path):
    train = write_corpus(tmp_path / "train", make_pairs(300, seed=4))
    models = {}
    for name, kw in {"all": {}, "a": {"spm_sample": 40}, "b": {"spm_sample": 40},
                     "seed": {"spm_sample": 40, "seed": 2}}.items():
        cfg = config(tmp_path / name, train=train, vocab_size=60, chunk_size=32, **kw)
        manifest = prepare(cfg, log=lambda _: None)
        models[name] = (Path(cfg.out_dir) / "spm.model").read_bytes()
        assert manifest["splits"]["train"]["pairs"] == 300  # the sample is only for the model
    assert models["a"] == models["b"]  # seeded
    assert len({models["all"], models["a"], models["seed"]}) == 3
    vocabs = load_vocabularies(tmp_path / "a" / "bin")
    src, _ = load_split(tmp_path / "a" / "bin", "train")
    first = make_pairs(300, seed=4)[0][0]
    assert vocabs.src.decode(src[0].tolist()) == vocabs.src_text.preprocess(first)


def test_reservoir_keeps_a_small_stream_whole_and_samples_a_large_one_in_order():
    small = Reservoir(10, seed=1)
    for x in range(7):
        small.add(x)
    assert small.items() == list(range(7))
    counts = np.zeros(100)
    for seed in range(300):
        big = Reservoir(10, seed=seed)
        for x in range(100):
            big.add(x)
        items = big.items()
        assert len(items) == 10 and items == sorted(items)
        counts[items] += 1
    assert counts.min() > 10 and counts.max() < 60  # ~uniform: each kept 30 times of 300
    again = Reservoir(10, seed=5)
    for x in range(100):
        again.add(x)
    reference_run = Reservoir(10, seed=5)
    for x in range(100):
        reference_run.add(x)
    assert again.items() == reference_run.items()


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_npy_appender_writes_what_np_save_writes(dtype):
    rng = random.Random(0)
    chunks = [np.array([rng.randrange(-9, 10**6) for _ in range(n)], dtype=dtype)
              for n in (0, 5, 1, 0, 300)]
    for parts in (chunks, chunks[:1], [np.arange(10**5, dtype=dtype)]):
        expected, got = io.BytesIO(), io.BytesIO()
        np.save(expected, np.concatenate(parts))
        writer = NpyAppender(got, dtype)
        for part in parts:
            writer.append(part)
        writer.finish()
        assert got.getvalue() == expected.getvalue()


@pytest.mark.parametrize("src_n, tgt_n, culprit", [(57, 60, "en"), (60, 50, "de"),
                                                    (40, 41, "en"), (30, 29, "de")])
def test_misaligned_files_are_found_while_streaming(tmp_path, src_n, tgt_n, culprit):
    pairs = make_pairs(60, seed=8)
    prefix = write_corpus(tmp_path / "train", pairs)
    for lang, n, k in (("en", src_n, 0), ("de", tgt_n, 1)):
        (tmp_path / f"train.{lang}").write_text("".join(p[k] + "\n" for p in pairs[:n]),
                                                encoding="utf-8")
    other = "de" if culprit == "en" else "en"
    n = min(src_n, tgt_n)
    with pytest.raises(XindaError) as info:
        prepare(config(tmp_path, train=prefix, chunk_size=10), log=lambda _: None)
    assert str(info.value) == (f"{prefix}.{culprit}:{n}: ends after {n} lines but "
                               f"{prefix}.{other} has more")
    assert not (tmp_path / "bin").exists()


def test_duplicates_in_other_chunks_are_dropped(tmp_path):
    pairs = make_pairs(50, seed=9)
    cfg = config(tmp_path, train=write_corpus(tmp_path / "train", pairs + pairs[::-1]),
                 chunk_size=6)
    report = prepare(cfg, log=lambda _: None)["filter_report"]
    assert report["kept"] == 50 and report["dropped"]["duplicate"] == 50
    src, _ = load_split(cfg.out_dir, "train")
    vocabs = load_vocabularies(cfg.out_dir)
    assert [vocabs.src.decode(x.tolist()) for x in src] == [
        vocabs.src_text.preprocess(s) for s, _ in pairs]


def test_a_second_prepare_into_the_same_directory_uses_its_own_model(tmp_path):
    """The encoder's cached sentencepiece model is reloaded when the file is replaced."""
    first = write_corpus(tmp_path / "a" / "train", make_pairs(120, seed=1))
    second = write_corpus(tmp_path / "b" / "train", [(t, s) for s, t in make_pairs(150, seed=2)])
    prepare(config(tmp_path, train=first), log=lambda _: None)
    prepare(config(tmp_path, train=second), log=lambda _: None)
    prepare(config(tmp_path / "fresh", train=second), log=lambda _: None)
    assert output_files(tmp_path / "bin") == output_files(tmp_path / "fresh" / "bin")


def test_a_worker_that_dies_is_a_one_line_error_not_a_hang():
    """Before (multiprocessing.Pool): the pool replaced the dead worker, dropped its chunk and
    prepare waited for it forever (the OOM killer on a large corpus, or kill -9)."""
    with pytest.raises(XindaError, match="a data.workers process died"), worker_pool(2) as pool:
        list(ordered_map(os._exit, [1, 1, 1], pool, 2))  # each call ends its worker at once


class InterruptedInSubmit(ThreadPoolExecutor):
    """Ctrl-C arrives while the executor runs its own bookkeeping (where a KeyboardInterrupt
    can leave a lock held: CI once hung 60 s in prepare's shutdown after Ctrl-C)."""

    submitted = 0

    def submit(self, fn, /, *args, **kwargs):
        signal.raise_signal(signal.SIGINT)
        future = super().submit(fn, *args, **kwargs)
        self.submitted += 1  # reached only if the interrupt waited for the end of submit
        return future


CTRL_C_RAISES = (signal.SIGINT, signal.default_int_handler)  # (a background job ignores it)


def test_ctrl_c_takes_effect_between_the_pools_calls_not_inside_them():
    with signal_handled(*CTRL_C_RAISES), InterruptedInSubmit(1) as pool:
        with pytest.raises(KeyboardInterrupt):
            list(ordered_map(abs, [-1, -2, -3], pool, 2))
        assert pool.submitted == 1


def test_ctrl_c_ends_a_wait_for_a_result_that_does_not_come():
    future: Future = Future()
    safety = threading.Timer(10, future.set_result, (0,))  # a broken wait fails, never hangs
    with signal_handled(*CTRL_C_RAISES), pytest.raises(KeyboardInterrupt):
        threading.Timer(0.2, signal.pthread_kill,
                        (threading.main_thread().ident, signal.SIGINT)).start()
        safety.start()
        result_of(future)
    assert not future.done()
    safety.cancel()


def test_a_deferred_signal_keeps_the_handler_it_had():
    calls = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: calls.append(signum))
    try:
        with interrupts_deferred():
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGTERM)
            assert calls == []
        assert calls == [signal.SIGTERM]  # once, after the block
        with signal_handled(signal.SIGINT, signal.SIG_IGN), interrupts_deferred():
            signal.raise_signal(signal.SIGINT)  # ignored before: ignored after
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("dedup", [True, False])
def test_the_sentencepiece_sample_holds_a_repeated_pair_once(tmp_path, dedup):
    """Before: exact repeats were dropped only after sentencepiece was trained, so a pair
    repeated 200 times filled its sample (and the vocabulary with its pieces)."""
    from xinda.data.stream import corpus_files
    from xinda.data.train_stream import spool_train

    pairs = make_pairs(50, seed=5)
    corpus = pairs[:10] + [pairs[3]] * 200 + pairs[10:] + pairs[:5]
    cfg = config(tmp_path, train=write_corpus(tmp_path / "train", corpus), chunk_size=16,
                 dedup=dedup)
    pipes = (TextPipeline(cfg.normalize, False, "moses", "en"),
             TextPipeline(cfg.normalize, False, "moses", "de"))
    spool = spool_train(corpus_files(cfg.train, "en", "de"), cfg, pipes, None,
                        tmp_path / "spool.pkl")
    sampled = pairs if dedup else corpus  # the first of identical pairs, in order
    assert spool.sample == ([pipes[0].preprocess(s) for s, _ in sampled],
                            [pipes[1].preprocess(t) for _, t in sampled])
    assert spool.usable == len(corpus)
