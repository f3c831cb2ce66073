import os

import pytest
import sacrebleu

from xinda.errors import XindaError
from xinda.evaluate.metrics import (
    Score,
    bleu_by_length,
    corpus_scores,
    format_length_table,
    read_hyps_refs,
    rouge_scores,
)

HYPS = ["the cat sat on the mat", "a dog barked loudly today", "hello world"]
REFS = ["the cat sat on a mat", "the dog barked loudly", "hello there world"]
REFS2 = ["a cat sat on the mat", "a dog barked loudly today", "hello world !"]


def test_identical_bleu_is_100() -> None:
    (bleu,) = corpus_scores(REFS, REFS, metrics=("bleu",))
    assert bleu.name == "BLEU"
    assert bleu.score == pytest.approx(100.0)


def test_bleu_matches_sacrebleu() -> None:
    (bleu,) = corpus_scores(HYPS, REFS, metrics=["bleu"])
    assert bleu.score == sacrebleu.corpus_bleu(HYPS, [REFS]).score
    assert "nrefs:1" in bleu.signature and "tok:13a" in bleu.signature
    assert str(bleu) == f"BLEU = {bleu.score:.2f} ({bleu.signature})"


def test_multi_reference_and_tokenize() -> None:
    (bleu,) = corpus_scores(HYPS, [REFS, REFS2], metrics=["bleu"], tokenize="intl")
    expected = sacrebleu.corpus_bleu(HYPS, [REFS, REFS2], tokenize="intl").score
    assert bleu.score == expected
    assert "nrefs:2" in bleu.signature and "tok:intl" in bleu.signature


def test_chrf_and_ter_present() -> None:
    scores = corpus_scores(HYPS, REFS)
    assert [s.name for s in scores] == ["BLEU", "chrF2", "TER"]
    assert all(isinstance(s, Score) and s.signature.startswith("nrefs:1|") for s in scores)
    assert scores[1].score == sacrebleu.corpus_chrf(HYPS, [REFS]).score
    assert scores[2].score == sacrebleu.corpus_ter(HYPS, [REFS]).score


def test_chrf_plus_plus_is_chrf_with_word_order_2() -> None:
    """chrF++ is sacreBLEU's CHRF(word_order=2): inflected words that share most character
    n-grams but few whole words score well below chrF (character n-grams only)."""
    hyps, refs = ["the cats were sitting quietly"], ["the cat was sitting quiet"]
    chrf, chrfpp = corpus_scores(hyps, refs, ("chrf", "chrf++"))
    expected = sacrebleu.metrics.CHRF(word_order=2).corpus_score(hyps, [refs])
    assert (chrfpp.name, chrfpp.score) == ("chrF2++", expected.score)
    assert chrf.score == sacrebleu.metrics.CHRF().corpus_score(hyps, [refs]).score
    assert chrfpp.score < chrf.score - 5
    assert "nw:2" in chrfpp.signature and "nw:0" in chrf.signature


def test_length_mismatch_is_one_line_error() -> None:
    with pytest.raises(XindaError) as err:
        corpus_scores(HYPS[:2], REFS)
    assert str(err.value) == "hypotheses have 2 lines but references have 3"
    with pytest.raises(XindaError, match="reference stream 2 has 2"):
        corpus_scores(HYPS, [REFS, REFS2[:2]])
    with pytest.raises(XindaError, match="unknown metric"):
        corpus_scores(HYPS, REFS, metrics=["meteor"])


def test_bleu_by_length_words() -> None:
    sources = [
        "one two three",  # 3 -> 1-10
        " ".join(["w"] * 10),  # 10 -> 1-10
        " ".join(["w"] * 11),  # 11 -> 11-20
        " ".join(["w"] * 45),  # 45 -> 41+
        "",  # -> 0
    ]
    hyps = ["a b c d", "the cat sat", "x y z", "hello world", "empty"]
    refs = ["a b c d", "the cat sat down", "x y w", "hello world", "empty"]
    rows = bleu_by_length(sources, hyps, refs)
    assert [(r["bucket"], r["sentences"]) for r in rows] == [
        ("0", 1),
        ("1-10", 2),
        ("11-20", 1),
        ("41+", 1),
    ]
    subset = sacrebleu.corpus_bleu(hyps[:2], [refs[:2]]).score
    assert rows[1]["bleu"] == subset
    table = format_length_table(rows)
    assert table.splitlines()[0].split() == ["length", "(words)", "sentences", "BLEU"]
    assert len(table.splitlines()) == 5
    assert len({len(line) for line in table.splitlines()}) == 1  # aligned


def test_bleu_by_length_cjk_chars() -> None:
    sources = ["我爱你", "今天 天气 很好", "这是一个非常非常长的句子用来测试分桶"]  # 3, 6, 18 chars
    hyps = ["I love you", "the weather is good today", "this is a long sentence"]
    refs = ["I love you", "the weather is nice today", "this is a very long sentence"]
    rows = bleu_by_length(sources, hyps, refs, edges=(5, 10), tokenize="13a")
    assert [(r["bucket"], r["sentences"]) for r in rows] == [("1-5", 1), ("6-10", 1), ("11+", 1)]
    assert format_length_table(rows).startswith("length (chars)  sentences")
    assert rows[1]["bleu"] == sacrebleu.corpus_bleu(hyps[1:2], [refs[1:2]]).score
    # the same sources counted in words put everything in the first bucket
    rows = bleu_by_length(sources, hyps, refs, edges=(5, 10), unit="words")
    assert [(r["bucket"], r["sentences"]) for r in rows] == [("1-5", 3)]
    assert rows[0]["bleu"] == sacrebleu.corpus_bleu(hyps, [refs]).score


@pytest.mark.parametrize("edges", [(5.5, 10), (True, 3), (3, 3), (0, 4), (10, 5)])
def test_bucket_edges_must_be_increasing_positive_integers(edges) -> None:
    """Before: 5.5 made the buckets "1-5.5" and "6.5-10", True made "1-True" (found by
    review)."""
    with pytest.raises(XindaError, match="edges must be increasing positive integers"):
        bleu_by_length(["a b"], ["a"], ["a"], edges=edges)


def test_numpy_bucket_edges_are_integers() -> None:
    import numpy as np

    rows = bleu_by_length(["a b c", "a"], ["x", "y"], ["x", "y"], edges=np.array([2, 4]))
    assert [r["bucket"] for r in rows] == ["1-2", "3-4"]


def test_iterators_of_references_and_edges_are_read_once() -> None:
    """Before: the check of what ``refs`` holds used up an iterator: the first of two
    streams was dropped (nrefs:1), one stream was read as empty, and edges from an iterator
    became no edges, one bucket (found by review)."""
    hyps = ["the cat sat on the mat", "a dog ran in the park"]
    other = ["one cat was on a rug", "the dog was running outside"]
    [listed] = corpus_scores(hyps, [hyps, other], ("bleu",))
    [read] = corpus_scores(hyps, iter([hyps, other]), ("bleu",))
    assert read == listed and "nrefs:2" in read.signature and read.score == pytest.approx(100)
    assert corpus_scores(hyps, iter(hyps), ("bleu",))[0].score == pytest.approx(100)
    sources = ["a b", "a b c d e f"]
    rows = bleu_by_length(sources, hyps, hyps, edges=iter([1, 5]))
    assert [r["bucket"] for r in rows] == ["2-5", "6+"]


def test_rouge_on_characters_ignores_case_as_on_words() -> None:
    """Latin terms in Chinese text: "GPU" and "gpu" were different tokens (found by review)."""
    for tokenize in ("zh", None):
        assert all(score.score == pytest.approx(100) for score in corpus_scores(
            ["我们使用GPU训练"], ["我们使用gpu训练"], ("rouge",), tokenize=tokenize))


def test_read_hyps_refs(tmp_path) -> None:
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("a\nb\n", encoding="utf-8")
    ref.write_text("a\nb\nc\n", encoding="utf-8")
    with pytest.raises(XindaError) as err:
        read_hyps_refs(hyp, [ref])
    assert str(hyp) in str(err.value) and str(ref) in str(err.value)
    assert "\n" not in str(err.value)
    ref.write_text("a\nc\n", encoding="utf-8")
    assert read_hyps_refs(hyp, [ref]) == (["a", "b"], [["a", "c"]])


def test_hypotheses_are_read_once_for_several_references(tmp_path) -> None:
    """Before: the hypotheses were read again per reference, so a pipe (/dev/stdin) had
    0 lines for the second one."""
    refs = [tmp_path / "r1.txt", tmp_path / "r2.txt"]
    refs[0].write_text("a\nb\n", encoding="utf-8")
    refs[1].write_text("x\ny\n", encoding="utf-8")
    read, write = os.pipe()
    os.write(write, b"a\nb\n")
    os.close(write)
    with os.fdopen(read, "rb", closefd=True):
        assert read_hyps_refs(f"/dev/fd/{read}", refs) == (["a", "b"], [["a", "b"], ["x", "y"]])


def test_an_empty_hypothesis_file_is_named(tmp_path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(XindaError, match=f"{empty}: no hypotheses to score"):
        read_hyps_refs(empty, [empty])


def test_a_bleu_tokenizer_that_cannot_load_is_one_line(monkeypatch) -> None:
    """sacrebleu's mecab tokenizers need extras and flores/spm ones a download: before, a
    RuntimeError or URLError traceback."""
    def unavailable(*args, **kwargs):
        raise RuntimeError("Please install MeCab")
    monkeypatch.setattr("xinda.evaluate.metrics.BLEU", unavailable)
    with pytest.raises(XindaError, match="'ja-mecab' is not usable here: RuntimeError"):
        corpus_scores(["a"], ["a"], ("bleu",), "ja-mecab")


@pytest.mark.parametrize("metrics", [("chrf", "ter"), ("rouge",)])
def test_an_unknown_tokenizer_is_refused_without_bleu(metrics) -> None:
    """Before: chrF and TER were printed (exit 0) and `--by-length` failed after them."""
    with pytest.raises(XindaError, match="^unknown BLEU tokenizer 'bogus'"):
        corpus_scores(["a b"], ["a b"], metrics, "bogus")


def test_metric_names_may_have_spaces() -> None:
    """Before: --metrics 'bleu, chrf' was 'unknown metric \' chrf\''."""
    names = [s.name for s in corpus_scores(["a b c d"], ["a b c d"], ("bleu", " chrf "))]
    assert names == ["BLEU", "chrF2"]


def test_a_multi_line_library_message_is_one_line(monkeypatch) -> None:
    def broken(**_):
        raise RuntimeError("Japanese tokenization requires extra dependencies.\n\n"
                           "  pip install sacrebleu[ja]\n")

    monkeypatch.setattr("xinda.evaluate.metrics.BLEU", broken)
    with pytest.raises(XindaError) as err:
        corpus_scores(["a"], ["a"], metrics=("bleu",), tokenize="ja-mecab")
    assert "\n" not in str(err.value) and str(err.value).endswith("pip install sacrebleu[ja]")


def test_chinese_ter_counts_characters_with_the_zh_tokenizer() -> None:
    hyps, refs = ["我爱北京天安门", "今天天气很好"], ["我爱北京的天安门", "今天天气非常好"]
    ter = corpus_scores(hyps, refs, metrics=("ter",), tokenize="zh")[0]
    # 1 insertion (的) + 1 substitution (很 -> 非) + 1 insertion (常) over 15 reference chars
    assert ter.score == pytest.approx(100 * 3 / 15)
    assert corpus_scores(hyps, refs, metrics=("ter",), tokenize="13a")[0].score == 100.0
    assert corpus_scores(hyps, refs, metrics=("ter",), tokenize="char")[0].score == ter.score


def test_mostly_cjk_references_are_scored_by_characters_by_default() -> None:
    """Before: BLEU's default 13a read each unsegmented line as one word (BLEU 0 for a
    near-perfect classical Chinese output; validation BLEU of an lzh target never rose)."""
    hyps, refs = ["学而时习之不亦说乎", "有朋自远方来"], ["学而时习之不亦说乎", "有朋自远方来乐"]
    bleu, ter = corpus_scores(hyps, refs, metrics=("bleu", "ter"))
    assert (bleu.score, ter.score) == (
        corpus_scores(hyps, refs, metrics=("bleu",), tokenize="zh")[0].score,
        corpus_scores(hyps, refs, metrics=("ter",), tokenize="zh")[0].score)
    assert "tok:zh" in bleu.signature and bleu.score > 80 and ter.score < 10
    assert corpus_scores(hyps, refs, metrics=("bleu",), tokenize="13a")[0].score == 0.0
    rows = bleu_by_length(["a b", "c d"], hyps, refs)
    assert rows[0]["bleu"] == bleu.score
    english = corpus_scores(["a cat"], ["a cat"], metrics=("bleu",))[0]
    assert "tok:13a" in english.signature


def test_japanese_references_are_scored_by_characters_by_default() -> None:
    """Before: Japanese got "zh", which splits kanji but leaves each run of kana one word: one
    wrong kana cost the whole run (found by review)."""
    hyps, refs = ["わたしはがくせいです"], ["わたしはがくせいだ"]
    bleu = corpus_scores(hyps, refs, metrics=("bleu",))[0]
    assert "tok:char" in bleu.signature
    assert bleu.score == corpus_scores(hyps, refs, metrics=("bleu",), tokenize="char")[0].score
    assert corpus_scores(hyps, refs, metrics=("bleu",), tokenize="zh")[0].score == 0.0
    assert bleu.score > 50
    chinese = corpus_scores(["学而时习之"], ["学而时习之"], metrics=("bleu",))[0]
    assert "tok:zh" in chinese.signature  # Chinese (no kana) keeps zh


def test_korean_keeps_word_level_scoring_by_default() -> None:
    """Before: Hangul counted as unsegmented CJK, so Korean (spaces between words) got BLEU
    "tok:zh", TER with Asian support, ROUGE over characters and length buckets in characters
    (found by review)."""
    hyps = ["저는 학생입니다 지금", "오늘 날씨가 좋다"]
    refs = ["저는 학생입니다", "오늘 날씨가 좋네요"]
    bleu, ter = (corpus_scores(hyps, refs, metrics=(m,))[0] for m in ("bleu", "ter"))
    assert "tok:13a" in bleu.signature and "asian:no" in ter.signature
    assert ter.score == corpus_scores(hyps, refs, metrics=("ter",), tokenize="13a")[0].score
    source = "안녕하세요 만나서 반갑습니다"  # 3 words, 13 characters
    assert bleu_by_length([source], ["a"], ["a"])[0]["bucket"] == "1-10"


def test_rouge_hand_computed_with_stemming_and_two_references() -> None:
    """ROUGE-1 F1, mean over sentences of the mean over references: 'cats' stems to 'cat'.
    Sentence 1: 5/6 vs ref 1, F(1/6, 1/2) = 1/4 vs ref 2; sentence 2: F(1, 1/2) = 2/3 and 0."""
    hyps = ["the cats sat on the mat", "hello"]
    refs = [["the cat sat on a mat", "hello world"], ["a cat", "bye"]]
    r1, r2, rl = corpus_scores(hyps, refs, metrics=("rouge",))
    assert (r1.name, r2.name, rl.name) == ("ROUGE-1", "ROUGE-2", "ROUGE-L")
    assert r1.score == pytest.approx(100 * ((5 / 6 + 1 / 4) / 2 + (2 / 3 + 0) / 2) / 2)
    assert "nrefs:2" in r1.signature and "tok:words+stem" in r1.signature


@pytest.mark.parametrize("tokenize", ["zh", None])
def test_rouge_chinese_counts_characters(tokenize) -> None:
    """With 'zh', or no tokenizer and mostly CJK references, 5 of 6 reference characters
    match in order: F1 = 2 * 1 * 5/6 / (1 + 5/6). Before: 0 without 'zh' (rouge-score's
    tokenizer drops every Han character), even for identical text."""
    hyp, ref = ["春眠不觉晓"], ["春眠不觉晓处"]
    r1, _, rl = corpus_scores(hyp, ref, metrics=("rouge",), tokenize=tokenize)
    assert r1.score == pytest.approx(100 * 10 / 11) and rl.score == r1.score
    assert "tok:char" in r1.signature
    assert rouge_scores(["春风又绿江南岸"], ["春风又绿江南岸"], tokenize)[0].score == 100


def test_rouge_with_a_japanese_tokenizer_counts_characters() -> None:
    """Before: "ja-mecab" counted words, one per unsegmented clause: 50.0 / 0.0 where the
    automatic choice (characters) gave 93.6 (found by review)."""
    hyp = ["わたしはがくせいです。きょうはいいてんきですね。"]
    ref = ["わたしはがくせいだ。きょうはいいてんきですね。"]
    assert rouge_scores(hyp, ref, "ja-mecab") == rouge_scores(hyp, ref, "char")
    assert rouge_scores(hyp, ref, "ja-mecab")[0].score > 90


def test_one_string_is_refused_as_lines() -> None:
    """Before: scored character by character (the README says one string is refused)."""
    with pytest.raises(XindaError, match="hypotheses: expected a list of strings, got str"):
        rouge_scores("ab", ["a", "b"])
    with pytest.raises(XindaError, match="sources: expected a list of strings, got str"):
        bleu_by_length("xy", ["a", "b"], ["a", "b"])


def test_rouge_counts_words_of_every_script() -> None:
    """Before: rouge-score's [a-z0-9] tokenizer read 'Die Größe' as 'die gr e', so it scored
    100 against 'Die Grüße'; Cyrillic had no word at all. 'Привет мир, ok' vs 'Пока мир, ok':
    2 of 3 words match, F1 2/3; bigram 'мир ok' 1 of 2."""
    assert rouge_scores(["Die Größe"], ["Die Grüße"])[0].score == pytest.approx(50)
    r1, r2, rl = rouge_scores(["Привет мир, ok"], ["Пока мир, ok"])
    assert (r1.score, r2.score, rl.score) == pytest.approx((200 / 3, 50, 200 / 3))
    assert rouge_scores(["नमस्ते दुनिया"], ["नमस्ते दुनिया"])[0].score == 100  # vowel signs
    assert rouge_scores(["the cat", "..."], ["the cat", "—"])[0].score == 50  # no words


def test_rouge_words_are_rouge_scores_own_on_ascii_text() -> None:
    from rouge_score.tokenizers import DefaultTokenizer

    from xinda.evaluate.metrics import _Words

    text = "The runners' 3 cats were RUNNING, don't-stop: e-mail x_y at 10:30 (generously)."
    assert _Words().tokenize(text) == DefaultTokenizer(use_stemmer=True).tokenize(text)


def test_lowercase_scores_a_lowercased_model_against_cased_references() -> None:
    """Found by review: a perfect model trained with data.lowercase scored 23 BLEU against
    Multi30k's German references, with no way to ignore case."""
    hyps, refs = ["ein mann fährt fahrrad ."], ["Ein Mann fährt Fahrrad ."]
    cased = corpus_scores(hyps, refs, ("bleu", "chrf", "ter"))
    assert cased[0].score < 50 and cased[2].score > 0
    bleu, chrf, ter = corpus_scores(hyps, refs, ("bleu", "chrf", "ter"), lowercase=True)
    assert (bleu.score, chrf.score, ter.score) == pytest.approx((100.0, 100.0, 0.0))
    assert "case:lc" in bleu.signature and "case:lc" in chrf.signature
    assert "case:lc" not in cased[0].signature


# --- long lines: TER and ROUGE grow with the square of a line's length ----------------------


def test_a_line_too_long_for_ter_is_warned_about_before_scoring(monkeypatch, caplog) -> None:
    """Before: one 5,000-word line pair ran TER for over 5 minutes without a word."""
    from sacrebleu.metrics import TER

    from xinda.evaluate import long_lines

    monkeypatch.setitem(long_lines.SLOW_METRICS, "ter", ("TER", 5))
    seen = []
    score = TER.corpus_score
    monkeypatch.setattr(TER, "corpus_score", lambda *args: (seen.append(list(caplog.messages)),
                                                             score(*args))[1])
    hyps = ["one two three", "a b c d e f g", "a b c d e f"]
    refs = ["one two three", "a b c", "a b c d e f g h"]
    with caplog.at_level("WARNING", logger="xinda"):
        corpus_scores(hyps, refs, ("bleu", "ter"), names=["hyp.txt", "ref.txt"])
    expected = ("ref.txt line 3: 8 words (2 more lines over 5): TER takes time and memory "
                "growing with the square of a line's length (minutes for thousands of words); "
                "--metrics bleu,chrf scores without it")
    assert seen == [[expected]]  # once, before TER scores
    caplog.clear()
    with caplog.at_level("WARNING", logger="xinda"):
        corpus_scores(hyps, refs, ("bleu", "chrf", "chrf++"))
        corpus_scores(["a b c"], ["a b c d e"], ("ter",))  # at the bound
    assert caplog.messages == []


def test_rouge_warns_naming_characters_for_chinese(monkeypatch, caplog) -> None:
    from xinda.evaluate import long_lines

    monkeypatch.setitem(long_lines.SLOW_METRICS, "rouge", ("ROUGE", 4))
    with caplog.at_level("WARNING", logger="xinda"):
        corpus_scores(["我们去北京"], [["我们在北京"], ["他们"]], ("rouge", "rouge"))
    assert caplog.messages == [(
        "hypotheses line 1: 5 characters (1 more line over 4): ROUGE takes time and memory "
        "growing with the square of a line's length (minutes for thousands of characters); "
        "--metrics bleu,chrf scores without it")]


def test_the_command_warns_about_a_long_line_on_one_stderr_line(tmp_path) -> None:
    """The real bounds (a 10-word reference keeps scoring fast), the files named."""
    import subprocess

    from subprocesses import subprocess_env, xinda_command

    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("a short line\n" + " ".join(["word"] * 2001) + "\n", encoding="utf-8")
    ref.write_text("a short line\n" + "word " * 10 + "\n", encoding="utf-8")
    proc = subprocess.run([*xinda_command(), "evaluate", str(hyp), str(ref), "--metrics",
                           "bleu,ter,rouge"], capture_output=True, text=True,
                          env=subprocess_env(), timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    tail = ("takes time and memory growing with the square of a line's length (minutes for "
            "thousands of words); --metrics bleu,chrf scores without it")
    assert proc.stderr.splitlines() == [
        f"xinda: warning: {hyp} line 2: 2,001 words: TER {tail}",
        f"xinda: warning: {hyp} line 2: 2,001 words: ROUGE {tail}"]
    assert [line.split(" = ")[0] for line in proc.stdout.splitlines()] == [
        "BLEU", "TER", "ROUGE-1", "ROUGE-2", "ROUGE-L"]
