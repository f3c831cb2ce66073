"""The Translator on tiny random models with a real sentencepiece vocabulary: what it does
with sources too long for the model, empty lines, and options it cannot honour."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import threading
import time

import pytest
import torch

from xinda.config import DataConfig, ExperimentConfig
from xinda.data.manifest import Vocabularies
from xinda.data.prepare import train_spm
from xinda.data.text import TextPipeline
from xinda.data.vocab import Vocab
from xinda.decode.ensemble import Ensemble
from xinda.decode.sampling import SamplingConfig
from xinda.decode.translator import UNSATISFIABLE, Translator
from xinda.decode.workers import map_in_workers
from xinda.errors import XindaError
from xinda.serve import tasks

WORDS = ["a", "the", "house", "dog", "cat", "red", "blue", "street", "runs", "sits", "in", "on",
         "with", "man", "woman"]
TRANSFORMER = {"arch": "transformer", "d_model": 16, "heads": 2, "ffn_dim": 32,
               "encoder_layers": 1, "decoder_layers": 1, "tie_output": False}
LOCATION_RNN = {"arch": "rnn", "embed_dim": 8, "hidden_dim": 8, "encoder_layers": 1,
                "decoder_layers": 1, "dropout": 0.0, "attention": "location"}
SHORT = {"max_len_a": 0.0, "max_len_b": 3}  # outputs of a few tokens: quick
LONG = " ".join(["house"] * 60)


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory) -> Vocabularies:
    """One joint sentencepiece model of a few English words, no pre-tokenisation."""
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(200)]
    path = tmp_path_factory.mktemp("vocab") / "spm.model"
    path.write_bytes(train_spm(lines, DataConfig(vocab_size=60, train="words")))
    text = TextPipeline("NFKC", False, "none", "en")
    return Vocabularies(text, text, Vocab(path), Vocab(path), True)


@pytest.fixture
def translator(vocabs, make_model):
    """``translator(*specs, decode=None)``: a Translator of the models of ``specs`` (an
    ensemble for several) with ``decode`` settings."""
    def make(*specs: dict, decode: dict | None = None) -> Translator:
        models = [make_model(spec, seed, vocab=vocabs.info) for seed, spec in enumerate(specs)]
        model = models[0] if len(models) == 1 else Ensemble(models)
        cfg = ExperimentConfig.model_validate({"model": specs[0], "decode": decode or {}})
        return Translator(model, cfg, vocabs)
    return make


@pytest.mark.parametrize("specs", [
    [{**TRANSFORMER, "max_positions": 16}],
    [{**LOCATION_RNN, "max_positions": 16}],
    [{**TRANSFORMER, "max_positions": 64}, {**TRANSFORMER, "max_positions": 16}],
], ids=["transformer", "rnn-location-attention", "ensemble"])
def test_a_source_is_cut_to_the_position_table(translator, specs):
    """Before: ValueError "sequence of 61 tokens exceeds max_positions" for the whole call
    (decode.max_input_len is 250; the position table, an ensemble's smallest, holds 16)."""
    tr = translator(*specs)
    full = len(tr.source_ids(LONG, pieces_in=False))
    assert full > 16
    short, long = tr.translate(["a short line", LONG], beam=2, **SHORT)
    assert short[0].truncated_from is None
    assert long[0].truncated_from == full and len(long[0].source_pieces) == 15  # + EOS = 16
    assert tasks.cost(tr, "translate", [(LONG, None)]) == 16
    work = tasks.translate_work(tr, {"decode": {"beam": 2, **SHORT}, "constraints": {}},
                                [(LONG, None)])
    assert work == 2 * 3


def test_max_input_len_still_cuts_below_the_table(translator):
    tr = translator(TRANSFORMER, decode={"max_input_len": 5})
    [best] = tr.translate([LONG], **SHORT)[0]
    assert len(best.source_pieces) == 5 and best.truncated_from > 5


def test_the_truncation_warning_escapes_the_line(translator, caplog):
    """Before: the line's first 40 characters went into the log raw, so a client of
    ``xinda serve`` could write lines of its own there ("\\nINFO: ...", found by review)."""
    tr = translator(TRANSFORMER, decode={"max_input_len": 5})
    with caplog.at_level("WARNING", logger="xinda"):
        tr.translate(["a\nINFO: forged\x1b[31m " + LONG], **SHORT)
    [message] = [r.getMessage() for r in caplog.records if "truncated" in r.getMessage()]
    assert message.startswith("line 1: ") and "'a\\nINFO: forged\\x1b[31m house" in message
    assert "\n" not in message and "\x1b" not in message


def test_an_empty_line_that_must_have_an_output_has_none(translator):
    """Before: the empty line came back as ("", 0.0) with no error, breaking its prefix and
    exact length."""
    tr = translator(TRANSFORMER)
    lines = ["", "a house", " \x00 ", "\ufeff\u200b"]  # invisible: a BOM, a zero-width space
    constraints = tr.constraints_for(lines, prefixes=["house"] * 4, exact_length=3)
    empty, real, blank, invisible = tr.translate(lines, constraints=constraints, beam=2,
                                                 **SHORT)
    assert [(t.text, t.score, t.error) for t in empty] == [("", -math.inf, UNSATISFIABLE)]
    assert blank == empty and invisible == empty
    assert real[0].error is None and len(real[0].target_pieces) == 3
    free = tr.translate(lines, constraints=tr.constraints_for(lines, ban=["house"]), **SHORT)
    assert [(t.text, t.score, t.error) for t in free[0]] == [("", 0.0, None)]


def test_an_empty_line_has_as_many_outputs_as_the_other_lines(translator):
    """n-best or samples: every line gets the same number of rows, empty ones included."""
    tr = translator(TRANSFORMER)
    empty, real = tr.translate(["", "a house"], beam=3, nbest=3, **SHORT)
    assert len(empty) == len(real) == 3 and {t.text for t in empty} == {""}
    assert len({id(t) for t in empty}) == 3  # before: one object three times
    assert len(tr.translate([""], sampling=True, samples=3, **SHORT)[0]) == 3


def test_nbest_above_beam_widens_the_beam(translator):
    """Before: fewer hypotheses than asked for, without a word."""
    tr = translator(TRANSFORMER)
    assert tr.decode_settings({"beam": 2, "nbest": 4}).beam == 4
    assert len(tr.translate(["a house"], beam=2, nbest=4, **SHORT)[0]) == 4
    assert tr.translate(["a house"], beam=2, nbest=4, **SHORT)[0] == tr.translate(
        ["a house"], beam=4, nbest=4, **SHORT)[0]


def test_beam_search_options_are_refused_when_sampling(translator):
    """Before: beam, nbest, stop and coverage were dropped without a word (the CLI alone
    refused them), so translate(nbest=3) of a sampling model gave one output per line."""
    tr = translator(TRANSFORMER)
    with pytest.raises(XindaError, match=r"^beam, nbest: beam-search options, not used when"):
        tr.translate(["a house"], sampling=True, samples=2, beam=1, nbest=4, **SHORT)
    with pytest.raises(XindaError, match=r"^coverage, stop: beam-search options"):
        tr.translate(["a house"], sampler=SamplingConfig(n=2), stop="best", coverage=0.2)
    assert len(tr.translate(["a house"], sampling=True, samples=2, **SHORT)[0]) == 2


@pytest.mark.parametrize("options", [{"input_format": "piece"}, {"output_format": "Pieces"}])
def test_unknown_formats_are_refused(translator, options):
    """Before: "piece" was silently read as text."""
    tr = translator(TRANSFORMER)
    (name, value), = options.items()
    with pytest.raises(XindaError, match=f"^{name} must be 'text' or 'pieces', got '{value}'$"):
        tr.translate(["▁a ▁house"], **options)
    with pytest.raises(XindaError, match="^input_format must be"):
        tr.constraints_for(["a"], input_format="piece")


@pytest.mark.parametrize(("options", "message"), [
    ({"ban": "25"}, "ban: expected a list of strings, got str"),  # before: banned 2 and 5
    ({"exact_length": 2.5}, r"exact_length must be >= 0 \(a whole number\), got 2.5"),  # was 2
    ({"no_repeat_ngram": True}, r"no_repeat_ngram must be >= 0 \(a whole number\), got True"),
    ({"no_repeat_ngram": "2"}, r"no_repeat_ngram must be >= 0 \(a whole number\), got '2'"),
])
def test_constraints_for_refuses_what_it_would_misread(translator, options, message):
    """Found by review: a string of pieces was banned character by character, a float length
    cut to an int, and other types were tracebacks, some only at translate time."""
    with pytest.raises(XindaError, match=f"^{message}"):
        translator(TRANSFORMER).constraints_for(["a"], **options)


def test_pieces_input_not_in_the_vocabulary_is_warned_about(translator, caplog):
    """Before: text given as pieces was read as <unk> <unk> ... and translated, silently
    (found by review)."""
    tr = translator(TRANSFORMER)
    tr.translate(["▁a ▁house <unk>", "zzqx ▁a", "zzqy"], input_format="pieces")
    assert ("2 input pieces are not in the model's vocabulary, read as <unk> (the first: "
            "'zzqx', line 2)") in caplog.text
    caplog.clear()
    tr.translate(["▁a ▁house <unk>"], input_format="pieces")
    tr.translate(["zzqx"])  # text: its pieces are the model's own
    assert "vocabulary" not in caplog.text


def test_constraints_for_takes_numpy_integers(translator):
    import numpy as np

    [repeat, length] = translator(TRANSFORMER).constraints_for(
        ["a"], no_repeat_ngram=np.int64(2), exact_length=np.int64(3))
    assert (repeat.n, length.lengths) == (2, [3])


def test_constraints_must_be_constraint_objects(translator):
    with pytest.raises(XindaError, match="^constraints: expected Constraint objects .* got str"):
        translator(TRANSFORMER).translate(["a"], constraints=["x"])  # was an AttributeError


def test_sampling_settings_need_sampling(translator):
    """Before: ignored, and the beam search output returned as if sampled."""
    tr = translator(TRANSFORMER)
    with pytest.raises(XindaError, match=r"need sampling=True \(given: temperature, seed\)$"):
        tr.translate(["a house"], temperature=0.5, seed=3)
    with pytest.raises(XindaError, match=r"^samples: set them on the sampler"):
        tr.translate(["a house"], sampler=SamplingConfig(n=2), samples=3)
    assert len(tr.translate(["a house"], sampling=True, samples=3, seed=3, **SHORT)[0]) == 3


@pytest.mark.parametrize(("value", "message"), [
    (math.nan, "finite number"), (math.inf, "finite number"), (-1.0, "greater than or equal")])
def test_max_len_a_must_be_finite_and_non_negative(translator, value, message):
    with pytest.raises(XindaError, match=f"^decode.max_len_a: .*{message}"):
        translator(TRANSFORMER).translate(["a house"], max_len_a=value)


@pytest.mark.parametrize("keep_heap", [True, False])
def test_decode_keep_heap_sets_the_allocator_only_when_asked(translator, monkeypatch,
                                                             keep_heap):
    calls = []
    monkeypatch.setattr("xinda.decode.translator.keep_freed_heap", lambda: calls.append(1))
    first = translator(TRANSFORMER, decode={**SHORT, "keep_heap": keep_heap})
    out = first.translate(["the red house", "a dog"], beam=2)
    assert len(out) == 2 and bool(calls) is keep_heap


def test_ban_source_copy_bans_every_source_token_past_the_configs_cut(translator, caplog):
    """Before: the ban list was cut at this config's max_input_len (with a second truncation
    warning), so a call with a larger limit decoded tokens it could still copy."""
    tr = translator(TRANSFORMER, decode={"max_input_len": 3})
    line = "the house dog on a red street"
    [ban] = tr.constraints_for([line], ban_source_copy=True)
    assert not [r for r in caplog.records if "truncated" in r.getMessage()]
    assert set(ban.tokens[0]) == set(tr.source_ids(line, False)) - {tr.tgt_vocab.unk}


def test_ban_source_copy_bans_words_not_the_bare_word_start_or_unk(translator, vocabs):
    """A word the vocabulary spells "▁" + "t" (and one of unknown characters, <unk>) must
    not ban the bare "▁", which starts every such word in the output (found by review)."""
    tr, sp = translator(TRANSFORMER), vocabs.src.sp
    line = "woman t §"
    ids = tr.source_ids(line, False)
    pieces = [sp.id_to_piece(i) for i in ids[:-1]]
    assert {"\u2581", "t"} <= set(pieces) and sp.unk_id() in ids  # (the premise)
    [ban] = tr.constraints_for([line], ban_source_copy=True)
    assert {sp.id_to_piece(i) for i in ban.tokens[0]} == {"\u2581woman", "t"}


@pytest.mark.parametrize("byte_fallback", [True, False])  # 龘 as bytes, or as <unk>
def test_ban_source_copy_with_character_targets_reads_the_source_s_text(tmp_path, make_model,
                                                                        byte_fallback):
    """The characters banned are the source text's, not those of piece names: an unknown
    character's "<unk>" banned every piece with <, u, n, k or >, and a byte piece's "<0xE9>"
    every piece with 0, x, E or 9, byte pieces included (found by review)."""
    rng = random.Random(0)
    words = ["春风", "风雨", "明月", "江山", "秋月", "白云", "unk", "x0", "E9"]
    lines = [" ".join(rng.choice(words) for _ in range(6)) for _ in range(300)]
    path = tmp_path / "spm.model"
    path.write_bytes(train_spm(lines, DataConfig(vocab_size=300 if byte_fallback else 40,
                                                 train="w", byte_fallback=byte_fallback)))
    text, vocab = TextPipeline("NFKC", False, "char", "zh"), Vocab(path)
    model = make_model(TRANSFORMER, vocab=Vocabularies(text, text, vocab, vocab, True).info)
    tr = Translator(model, ExperimentConfig.model_validate({"model": TRANSFORMER}),
                    Vocabularies(text, text, vocab, vocab, True))
    sp = vocab.sp
    [ban] = tr.constraints_for(["春龘"], ban_source_copy=True)
    unknown = sp.is_byte if byte_fallback else sp.is_unknown
    assert any(unknown(i) for i in tr.source_ids("春龘", False))  # (the premise)
    banned = {sp.id_to_piece(i) for i in ban.tokens[0]}
    assert banned == {sp.id_to_piece(i) for i in range(vocab.pieces)
                      if "春" in sp.id_to_piece(i)} != set()


def test_ban_source_copy_with_jieba_targets_bans_every_piece_with_a_source_character(
        tmp_path, make_model):
    """Before: only the source's own pieces (with and without "▁") were banned, so a jieba
    model copied 风 from 春风 as the piece 风 or 风雨 (found by review); and a source's bare
    "▁" piece banned the target's."""
    rng = random.Random(0)
    words = ["春风", "风雨", "明月", "江山", "秋月", "白云", "春天", "山水", "花", "鸟", "雪"]
    lines = [" ".join(rng.choice(words) for _ in range(6)) for _ in range(300)]
    path = tmp_path / "spm.model"
    path.write_bytes(train_spm(lines, DataConfig(vocab_size=40, train="words")))
    text, vocab = TextPipeline("NFKC", False, "jieba", "zh"), Vocab(path)
    vocabs = Vocabularies(text, text, vocab, vocab, True)
    model = make_model(TRANSFORMER, vocab=vocabs.info, eos_bias=-2.0)
    tr = Translator(model, ExperimentConfig.model_validate({"model": TRANSFORMER}), vocabs)
    sources = ["春风明月", "江山秋月白云", "春天风雨"]
    constraints = tr.constraints_for(sources, ban_source_copy=True)
    pieces = [vocab.sp.id_to_piece(i) for i in range(vocab.pieces)]
    [ban] = constraints
    for source, banned in zip(sources, ban.tokens):
        assert {pieces[i] for i in banned} == {p for p in pieces if set(p) & set(source)}
    assert "\u2581" in pieces and vocab.sp.piece_to_id("\u2581") not in ban.tokens[1]
    for source, nbest in zip(sources, tr.translate(sources, constraints=constraints, beam=4,
                                                    nbest=4, max_len_a=1.0, max_len_b=2)):
        for out in nbest:
            assert not set(out.text) & set(source), (source, out.text)


def test_a_prefix_the_target_vocabulary_cannot_write_is_refused(translator):
    """Before: its characters were forced as <unk> and the output began with ⁇⁇."""
    tr = translator(TRANSFORMER)
    with pytest.raises(XindaError, match="^prefix 2: '凤 龙' not in the target vocabulary"):
        tr.constraints_for(["a", "b"], prefixes=["house", "凤 house 龙"])
    with pytest.raises(XindaError, match="^prefix 1: 'foo' not in the target vocabulary"):
        tr.constraints_for(["a"], prefixes=["▁house foo"], input_format="pieces")
    with pytest.raises(XindaError, match="^p.txt:2: '凤' not in"):  # xinda translate --prefix
        tr.constraints_for(["a", "b"], prefixes=["", "凤"], prefix_file="p.txt")
    unk_piece = tr.tgt_vocab.ids_to_pieces([tr.tgt_vocab.unk])[0]
    [prefix] = tr.constraints_for(["a"], prefixes=[unk_piece], input_format="pieces")
    assert prefix.prefixes == [[tr.tgt_vocab.unk]]  # asked for by name


def test_a_prefix_longer_than_the_model_writes_is_refused(translator):
    """Before: decoded, and answered "the search found no output that satisfies the
    constraints" (found by review)."""
    tr = translator(TRANSFORMER)
    cap = tr.model.cfg.max_positions
    house = tr.tgt_vocab.ids_to_pieces(tr.encode_target("house"))
    fits = " ".join((house * cap)[:cap - 1])
    [prefix] = tr.constraints_for(["a"], prefixes=[fits], input_format="pieces")
    assert len(prefix.prefixes[0]) == cap - 1
    with pytest.raises(XindaError, match=f"^prefix 1: a prefix of {cap} tokens; this model "
                       f"writes at most {cap - 1} "):
        tr.constraints_for(["a"], prefixes=[f"{fits} {house[0]}"], input_format="pieces")


@pytest.mark.parametrize("control", ["<pad>", "<s>", "</s>"])
def test_control_pieces_in_prefixes_and_padding_in_sources_are_refused(translator, control):
    """Before: "<pad>" in a source of pieces was read as padding (an RNN encoder then dropped
    the real EOS), and "</s>" as a prefix found no output, exit 0 (found by review). A source
    may hold "<s>" and "</s>": the model reads them (attention plots label them)."""
    tr = translator(TRANSFORMER)
    with pytest.raises(XindaError, match=f"^prefix 1: '{control}' is a control piece"):
        tr.constraints_for(["a"], prefixes=[control], input_format="pieces")
    sources = ["\u2581house", f"\u2581house {control}"]
    if control != "<pad>":
        assert len(tr.translate(sources, input_format="pieces")) == 2
        return
    with pytest.raises(XindaError, match="^line 2: '<pad>' is the padding piece"):
        tr.translate(sources, input_format="pieces")
    with pytest.raises(XindaError, match="^line 1: '<pad>' is the padding piece"):
        tr.constraints_for([control], ban_source_copy=True, input_format="pieces")


def test_unk_itself_can_be_banned(translator):
    """Before: '<unk>' was refused as 'not one target piece'."""
    tr = translator(TRANSFORMER)
    unk_piece = tr.tgt_vocab.ids_to_pieces([tr.tgt_vocab.unk])[0]
    [ban] = tr.constraints_for(["a"], ban=[unk_piece])
    assert tr.tgt_vocab.unk in ban.ids


def _decoded_in(monkeypatch, log) -> None:
    """Make every decoded batch append the id of its process to ``log``."""
    real = Translator._decode_batch

    def logged(self, *args, **kwargs):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Translator, "_decode_batch", logged)


def test_int8_with_per_row_scales_translates_a_line_alike_in_any_batch(translator):
    """``decode.int8_scale: row``: each line's output and score, decoded alone, equal those
    decoded in one batch with the others (on this small model; padding's float rounding can
    move a score of a larger one by a quantisation step); the int8 copy is made again for
    another scale. With "batch" scales the scores differ."""
    from xinda.models.quantize import Int8Linear

    rng = random.Random(2)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9))) for _ in range(12)]
    tr = translator(TRANSFORMER, decode={"precision": "int8", "int8_scale": "row",
                                         "max_len_a": 1.0, "max_len_b": 3})
    together = [(t[0].text, t[0].score) for t in tr.translate(lines, beam=3)]
    alone = [(t[0].text, t[0].score) for line in lines for t in tr.translate([line], beam=3)]
    assert [text for text, _ in together] == [text for text, _ in alone]
    assert [score for _, score in together] == pytest.approx([s for _, s in alone], abs=1e-4)
    def per_row() -> set[bool]:
        return {m.per_row for m in tr._int8.modules() if isinstance(m, Int8Linear)}
    assert per_row() == {True}
    tr.translate(lines[:1], beam=3, int8_scale="batch")
    assert per_row() == {False}


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_workers_decode_the_same_batches_in_other_processes(translator, monkeypatch, tmp_path,
                                                            precision):
    """``decode.workers``: forked processes decode whole batches, so the translations,
    scores and attention weights are those of one process with one thread."""
    rng = random.Random(1)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9))) for _ in range(30)]
    tr = translator(TRANSFORMER, decode={"max_len_a": 1.0, "max_len_b": 3, "batch_size": 4,
                                         "precision": precision})
    one = tr.translate(lines, beam=3, nbest=2, need_attention=True)
    _decoded_in(monkeypatch, tmp_path / "pids")
    two = tr.translate(lines, beam=3, nbest=2, need_attention=True, workers=2)
    pids = {int(p) for p in (tmp_path / "pids").read_text().split()}
    assert pids and os.getpid() not in pids and len(pids) <= 2
    assert [[(t.text, t.score) for t in n] for n in two] == [
        [(t.text, t.score) for t in n] for n in one]
    assert all(torch.equal(a.attention, b.attention)
               for n1, n2 in zip(one, two) for a, b in zip(n1, n2))


def test_a_worker_that_dies_is_a_clear_error(translator, monkeypatch):
    monkeypatch.setattr(Translator, "_decode_batch", lambda *args: os._exit(1))
    tr = translator(TRANSFORMER, decode={**SHORT, "batch_size": 1})
    with pytest.raises(XindaError, match="a decode.workers process died"):
        tr.translate(["a house", "the dog", "a cat"], workers=2)


def test_workers_are_refused_when_sampling(translator):
    with pytest.raises(XindaError, match="sampling draws them from one generator"):
        translator(TRANSFORMER, decode=SHORT).translate(["a house", "a dog"], workers=2,
                                                        sampler=SamplingConfig(n=2))


def test_concurrent_calls_with_workers_get_their_own_translations(translator):
    """Before: the job waited in a module global for the forked workers, so a call from
    another thread could fork with it and return that call's translations."""
    tr = translator(TRANSFORMER, decode={**SHORT, "batch_size": 1})
    a, b = ["a house", "the dog", "a red cat"], ["the blue street", "a woman", "man runs"]
    want = {"a": tr.translate_text(a), "b": tr.translate_text(b)}
    assert want["a"] != want["b"]
    got: dict[str, list[list[str]]] = {"a": [], "b": []}
    start = threading.Barrier(2)

    def run(name: str, lines: list[str]) -> None:
        for _ in range(3):
            start.wait()
            got[name].append(tr.translate_text(lines, workers=2))
    threads = [threading.Thread(target=run, args=item) for item in (("a", a), ("b", b))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert got == {"a": [want["a"]] * 3, "b": [want["b"]] * 3}


def test_workers_die_with_their_parent(tmp_path):
    """Before: a killed ``xinda translate`` left its workers waiting for work forever."""
    script = f"""
import os, time
from xinda.decode.workers import map_in_workers
def job(i):
    with open({str(tmp_path / "pids")!r}, "a") as f:
        f.write(f"{{os.getpid()}}\\n")
    time.sleep(60)
map_in_workers(job, [0, 1], 2)
"""
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        while len(pids := _pids(tmp_path / "pids")) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(pids) == 2
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, pids))


def _pids(path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        return "\nState:\tZ" not in open(f"/proc/{pid}/status").read()
    except FileNotFoundError:
        return False


class _TwoArgumentError(Exception):
    def __init__(self, what: str, where: int):
        super().__init__(f"{what} at {where}")


def test_a_worker_error_that_pickle_cannot_rebuild_comes_back_by_name():
    """Before: it broke the pool, and the parent said that a worker had died."""
    def job(i: int) -> int:
        raise _TwoArgumentError("bad constraint", i)
    with pytest.raises(RuntimeError, match="^_TwoArgumentError: bad constraint at [01]$"):
        map_in_workers(job, [0, 1], 2)


@pytest.mark.parametrize("token", ["</s>", "<s>"])
def test_control_tokens_cannot_be_banned(translator, token):
    """Before: --ban '</s>' was taken, and every line came back empty as 'unsatisfiable'."""
    tr = translator(TRANSFORMER)
    with pytest.raises(XindaError, match=f"^cannot ban '{token}': it is a control token"):
        tr.constraints_for(["a"], ban=["house", token])


@pytest.mark.parametrize("options", [{"beam": 1}, {"beam": 4, "nbest": 2}])
def test_attention_of_a_translation_holds_only_its_own_weights(translator, options):
    """Before: each returned matrix was a view of the batch's whole attention history (every
    row and step), which it kept alive: 100x its size at beam 5, and sent through /dev/shm
    by decode.workers."""
    lines = ["a house", "the red dog runs in the street with a man", "cat", "on blue"]
    tr = translator(TRANSFORMER, decode={"max_len_a": 1.0, "max_len_b": 4})
    for nbest in tr.translate(lines, need_attention=True, **options):
        for t in nbest:
            held = t.attention.untyped_storage().nbytes()
            assert held == t.attention.numel() * t.attention.element_size()
            # EOS rows and columns included
            assert t.attention.shape == (len(t.target_pieces) + 1, len(t.source_pieces) + 1)


def test_workers_return_many_tensors_within_a_low_open_file_limit():
    """Before: each tensor of a worker's result went back as a file descriptor; 1500 greedy
    attention matrices with ``ulimit -n 1024`` failed as "a decode.workers process died
    (''')" (found by review)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
    try:
        got = map_in_workers(lambda i: [torch.full((2, 3), float(i + k)) for k in range(600)],
                             [0, 1], 2)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert [float(t[0, 0]) for t in got[1][:3]] == [1.0, 2.0, 3.0] and len(got[0]) == 600


def test_constraints_may_come_from_any_iterable_but_not_alone(translator):
    """Before: a generator was used up by the count check and then read as no constraints,
    silently (found by review)."""
    tr = translator(TRANSFORMER, decode=SHORT)
    lines = ["a house", "the dog"]
    made = tr.constraints_for(lines, prefixes=["red", "blue"])
    out = [r[0].target_pieces for r in tr.translate(lines, constraints=(c for c in made))]
    assert out == [r[0].target_pieces for r in tr.translate(lines, constraints=made)]
    assert [pieces[0] for pieces in out] == ["\u2581red", "\u2581blue"]
    with pytest.raises(XindaError, match=r"a list of constraints, not one TargetPrefix"):
        tr.translate(lines, constraints=made[0])
