from pathlib import Path

import pytest

from xinda.demo.numbers import make_pairs, number_to_words, write_demo_corpus


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (0, "zero"),
        (7, "seven"),
        (13, "thirteen"),
        (20, "twenty"),
        (21, "twenty-one"),
        (100, "one hundred"),
        (101, "one hundred one"),
        (999, "nine hundred ninety-nine"),
        (1000, "one thousand"),
        (1001, "one thousand one"),
        (12345, "twelve thousand three hundred forty-five"),
        (1_000_000, "one million"),
        (421007, "four hundred twenty-one thousand seven"),
        (
            999_999_999,
            (
                "nine hundred ninety-nine million nine hundred ninety-nine thousand "
                "nine hundred ninety-nine"
            ),
        ),
    ],
)
def test_number_to_words(n: int, words: str) -> None:
    assert number_to_words(n) == words


@pytest.mark.parametrize("n", [-1, 1_000_000_000])
def test_number_to_words_out_of_range(n: int) -> None:
    with pytest.raises(ValueError):
        number_to_words(n)


def test_make_pairs_deterministic_unique_and_mixed() -> None:
    pairs = make_pairs(500, seed=3)
    assert pairs == make_pairs(500, seed=3)
    assert pairs != make_pairs(500, seed=4)
    digits = [d for _, d in pairs]
    assert len(set(digits)) == 500
    assert all(number_to_words(int(d)) == w for w, d in pairs)
    assert all(0 <= int(d) <= 999_999 for d in digits)
    assert {len(d) for d in digits} == set(range(1, 7))  # every magnitude appears


def test_make_pairs_exhausts_small_range() -> None:
    pairs = make_pairs(100, seed=1, max_value=99)
    assert sorted(int(d) for _, d in pairs) == list(range(100))
    with pytest.raises(ValueError):
        make_pairs(101, seed=1, max_value=99)


def test_write_demo_corpus(tmp_path: Path) -> None:
    prefixes = write_demo_corpus(tmp_path, {"train": 200, "valid": 30, "test": 20}, seed=7)
    assert prefixes == {s: str(tmp_path / s) for s in ("train", "valid", "test")}
    sizes = {"train": 200, "valid": 30, "test": 20}
    numbers = {}
    for split, prefix in prefixes.items():
        words = Path(f"{prefix}.words").read_text(encoding="utf-8").splitlines()
        digits = Path(f"{prefix}.digits").read_text(encoding="utf-8").splitlines()
        assert len(words) == len(digits) == sizes[split]
        assert all(number_to_words(int(d)) == w for w, d in zip(words, digits))
        numbers[split] = set(digits)
    assert not numbers["train"] & numbers["valid"]
    assert not numbers["train"] & numbers["test"]
    assert not numbers["valid"] & numbers["test"]
    again = tmp_path / "again"
    write_demo_corpus(again, {"train": 200, "valid": 30, "test": 20}, seed=7)
    assert (again / "test.words").read_text() == (tmp_path / "test.words").read_text()
