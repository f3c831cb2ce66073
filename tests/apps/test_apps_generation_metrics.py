"""The generation metrics and the character helpers under them, on hand-computed examples
(tones and finals are pypinyin's default readings, checked against a dictionary)."""

import pytest

from xinda.errors import XindaError
from xinda.evaluate.generation import (
    LEVEL,
    OBLIQUE,
    distinct_n,
    final,
    is_han,
    is_punctuation,
    last_han,
    length_match,
    level_oblique,
    pattern_match,
    poem_lines,
    repetition_pattern,
    rhyme_group,
    rhyme_rate,
    rhymes,
    same_position_copy_rate,
    tone,
    tone_rule_rate,
)

STORK_TOWER = "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。"  # 流 liu2 / 楼 lou2 rhyme
SPRING_DAWN = "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。"  # 鸟 niao3 / 少 shao3 rhyme


def test_characters():
    assert is_han("一") and is_han("\U00020000")  # CJK ext. B
    assert not any(map(is_han, "，a1 ー"))
    assert all(map(is_punctuation, "，。、！《,."))
    assert not any(map(is_punctuation, "一a ␣"))
    assert last_han("春风，") == "风" and last_han("，。") is None


def test_tones_and_level_oblique():
    assert [tone(ch) for ch in "江人雨月"] == [1, 2, 3, 4]  # jiang1 ren2 yu3 yue4
    assert tone("，") is None and tone("a") is None
    assert [level_oblique(ch) for ch in "江人雨月"] == [LEVEL, LEVEL, OBLIQUE, OBLIQUE]
    # a neutral default reading gives way to the first toned one: zi5 shang5 le5 ba5
    assert [tone(ch) for ch in "子裳了吧"] == [3, 2, 3, 1]  # zi3 chang2 liao3 ba1
    assert tone_rule_rate(["天涯望游子"], ["江上有归人"]) == (100.0, 1)  # 子 仄, 人 平
    assert rhymes("春花秋月何时了", "往事知多少")  # liao3 / shao3
    assert is_han("〇") and level_oblique("〇") == LEVEL  # ling2; before: not Han, no tone
    assert tone("长") == 3  # the default reading zhang3, not the poetic chang2 (documented)


def test_finals_and_rhyme_groups():
    assert [final(ch) for ch in "江光回雨"] == ["iang", "uang", "uei", "v"]
    assert {rhyme_group(ch) for ch in "江光长"} == {"唐"}  # medials i/u do not matter
    assert {rhyme_group(ch) for ch in "人春云"} == {"文"}  # en, uen, ün
    assert rhyme_group("知") == "支" and rhyme_group("衣") == "齐"  # apical i kept apart
    assert rhyme_group("，") is None
    # Han characters pypinyin cannot read: no reading (before: "𫈟5", tone 5, a group of its own)
    assert is_han("𫈟") and [tone("𫈟"), final("𫈟"), rhyme_group("䍧")] == [None] * 3


@pytest.mark.parametrize(("a", "b", "expected"), [
    ("黄河入海流", "更上一层楼", True),  # iou / ou
    ("两岸猿声啼不住", "千里江陵一日还", False),  # u / uan
    ("朝辞白帝彩云间", "轻舟已过万重山", True),  # ian / an
    ("处处闻啼鸟", "花落知多少。", True),  # iao / ao, trailing mark skipped
    ("万里江山知", "一片白云衣", False),  # 支 / 齐
    ("abc", "abc", False),  # no Han character: rhymes with nothing
])
def test_rhymes(a, b, expected):
    assert rhymes(a, b) is expected


def test_poem_lines():
    assert poem_lines(STORK_TOWER) == ["白日依山尽", "黄河入海流", "欲穷千里目", "更上一层楼"]
    assert poem_lines("一 二，三！四？五；六、七。。") == ["一二", "三", "四", "五", "六", "七"]
    assert poem_lines("") == []


def test_repetition_pattern():
    assert repetition_pattern("一心一意") == [None, None, 0, None]
    assert repetition_pattern("三番三次三") == [None, None, 0, None, 0]  # the first occurrence
    assert repetition_pattern("") == []


def test_length_match():
    srcs = ["春风", "明月", "一，二"]
    assert length_match(srcs, ["秋 雨", "清风来", "三，四"]) == pytest.approx(200 / 3)


def test_pattern_match():
    src = "一心一意"
    assert pattern_match([src], ["三番三次"]) == 100.0
    assert pattern_match([src], ["三番两次"]) == 0.0  # repetition missing
    assert pattern_match(["风花雪月"], ["三番三次"]) == 0.0  # repetition added
    assert pattern_match([src], ["三番三"]) == 0.0  # length differs
    assert pattern_match([src, src], ["三 番 三 次", "千山万水"]) == 50.0  # spaces ignored


def test_tone_rule_rate_counts_only_oblique_first_lines():
    srcs = ["海阔凭鱼跃", "天高任鸟飞", "春眠不觉晓", "明月"]  # 跃 仄, 飞 平, 晓 仄, 月 仄
    hyps = ["天高任鸟飞", "海阔凭鱼跃", "处处闻啼鸟", "abc"]  # 飞 平, -, 鸟 仄, no Han
    result = tone_rule_rate(srcs, hyps)
    assert (result.rate, result.count) == (pytest.approx(100 / 3), 3)  # 1 of 跃 晓 月
    assert tone_rule_rate(["天高任鸟飞"], ["海阔凭鱼跃"]) == (0.0, 0)  # nothing to score


def test_rhyme_rate():
    not_rhyming = "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多时。"  # 鸟 niao3 / 时 shi2
    assert rhyme_rate([STORK_TOWER, SPRING_DAWN]) == 100.0
    assert rhyme_rate([STORK_TOWER, not_rhyming, "一，二。三。"]) == pytest.approx(100 / 3)


def test_distinct_n_by_hand():
    hyps = ["春风春雨", "春 风"]
    assert distinct_n(hyps, 1) == 3 / 6  # 春 风 春 雨 春 风
    assert distinct_n(hyps, 2) == 3 / 4  # 春风 风春 春雨 | 春风
    assert distinct_n(hyps, 3) == 2 / 2  # 春风春 风春雨
    assert distinct_n(hyps, 5) == 0.0  # no 5-gram at all
    with pytest.raises(XindaError, match="n >= 1"):
        distinct_n(hyps, 0)


def test_same_position_copy_rate():
    srcs = ["明月照松间", "春，风"]
    hyps = ["清泉照石上", "春，雨"]  # 照 and 春 copied; the shared "，" is not counted
    assert same_position_copy_rate(srcs, hyps) == pytest.approx(100 * 2 / 7)
    # positions past the shorter line are not counted: 春 of 1 position
    assert same_position_copy_rate(["春风"], ["春"]) == 100.0


@pytest.mark.parametrize("metric", [length_match, pattern_match, tone_rule_rate,
                                    same_position_copy_rate])
def test_pair_metrics_reject_misaligned_or_empty_input(metric):
    with pytest.raises(XindaError, match="sources have 2 lines but hypotheses have 1"):
        metric(["春风", "秋雨"], ["明月"])
    with pytest.raises(XindaError, match="empty input"):
        metric([], [])


def test_corpus_metrics_reject_empty_input():
    with pytest.raises(XindaError, match="empty input"):
        rhyme_rate([])
    with pytest.raises(XindaError, match="empty input"):
        distinct_n([], 1)


def test_poem_layout_by_hand():
    from xinda.evaluate.generation import poem_layout_ok

    poem = "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。"
    assert poem_layout_ok(poem, 5)
    assert poem_layout_ok(poem, 5, acrostic="白黄欲更")
    assert not poem_layout_ok(poem, 5, acrostic="白黄欲上")
    assert not poem_layout_ok(poem, 7)  # wrong form
    assert not poem_layout_ok(poem, 5, lines=3)
    assert not poem_layout_ok(poem.replace("流。", "流，"), 5)  # mark of an even line
    assert not poem_layout_ok(poem.replace("千", "a"), 5)  # not a Han character
    assert poem_layout_ok("白日依山尽，黄河入海流。", 5, lines=2, acrostic="白黄")
