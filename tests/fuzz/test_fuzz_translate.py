"""Fuzz: the translate path (``Translator.load(dir).translate_text``) on random lines.

A tiny model directory is built once per module (a 60-pair demo corpus, a 16-dimensional
Transformer trained for 2 updates). Properties: N lines in give N strings out, in order; a
blank line gives an empty string; no output holds a line break; no input (empty lines, lines of
only control characters or unknown scripts, lines beyond ``max_input_len``, several lines in one
string) makes it raise.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xinda.config import ExperimentConfig
from xinda.data.prepare import prepare
from xinda.decode.translator import Translator
from xinda.demo.numbers import write_demo_corpus
from xinda.train.trainer import Trainer

TINY = {"arch": "transformer", "d_model": 16, "heads": 2, "ffn_dim": 32, "encoder_layers": 1,
        "decoder_layers": 1}
LINE = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=40),
    st.text(st.sampled_from(" \t\r\n\x00\x1b\x85\u2028\u3000␣"), max_size=6),  # blank-ish
    st.lists(st.sampled_from(["one", "two", "hundred", "thousand", "forty-two", "and"]),
             max_size=30).map(" ".join),  # in-vocabulary, up to beyond max_input_len
)
# training without validation plots an empty legend
pytestmark = pytest.mark.filterwarnings("ignore:No artists with labels:UserWarning")


@pytest.fixture(scope="module")
def translator(tmp_path_factory) -> Translator:
    root = tmp_path_factory.mktemp("fuzz-translate")
    raw = write_demo_corpus(root / "raw", {"train": 60})
    cfg = ExperimentConfig.model_validate({
        "data": {"src_lang": "words", "tgt_lang": "digits", "train": raw["train"],
                 "out_dir": str(root / "bin"), "vocab_size": 40, "normalize": "NFKC",
                 "pretok_src": "moses", "pretok_tgt": "char"},
        "model": TINY,
        "train": {"out_dir": str(root / "model"), "progress": False, "device": "cpu",
                  "precision": "fp32", "max_steps": 2, "max_tokens": 400,
                  "run_validation": False},
        "decode": {"max_len_a": 0.0, "max_len_b": 6, "max_input_len": 12, "batch_size": 3},
    })
    prepare(cfg.data, log=lambda _: None)
    Trainer(cfg).train()
    translator = Translator.load(root / "model")
    translator.translate_text(["warm up"])
    return translator


@given(lines=st.lists(LINE, max_size=7), beam=st.sampled_from([1, 2]))
def test_n_lines_in_n_lines_out(translator, lines, beam):
    out = translator.translate_text(lines, beam=beam)
    assert isinstance(out, list) and len(out) == len(lines)
    assert all(isinstance(text, str) for text in out)
    assert all(text == "" for line, text in zip(lines, out) if not line.strip())
    assert not any("\n" in text or "\r" in text for text in out)


def test_nothing_in_nothing_out(translator):
    assert translator.translate_text([]) == []
    assert translator.translate_text(["", " ", "\t\n"]) == ["", "", ""]


@given(lines=st.lists(LINE, min_size=1, max_size=5))
def test_a_cut_source_is_reported_with_its_length(translator, lines):
    """truncated_from is the source's token count exactly when it exceeds max_input_len (12),
    on every hypothesis of the line; otherwise None."""
    for line, nbest in zip(lines, translator.translate(lines, beam=2, nbest=2)):
        n = len(translator.source_ids(line, pieces_in=False))
        assert {t.truncated_from for t in nbest} == {n if n > 12 else None}
