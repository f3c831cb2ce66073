"""``xinda evaluate --baseline``: paired tests on the command line."""

from __future__ import annotations


def write(path, lines):
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def test_evaluate_compares_with_a_baseline_per_metric(xinda, tmp_path):
    refs = ["the cat sat on the mat", "a dog runs in the park", "two men play chess"]
    ref = write(tmp_path / "ref.txt", refs)
    base = write(tmp_path / "base.txt", ["the cat sat on mat", "a dog run in park",
                                         "two man play chess"])
    hyp = write(tmp_path / "hyp.txt", [refs[0], "a dog run in park", refs[2]])
    out = xinda("evaluate", hyp, ref, "--baseline", base, "--metrics", "bleu,chrf,rouge").stdout
    lines = out.splitlines()
    at = lines.index(f"against the baseline {base}:")
    assert lines[at + 1].startswith("BLEU: ") and " vs baseline " in lines[at + 1]
    assert lines[at + 2].startswith("chrF2: ")
    assert "the outputs differ in 2 of 3 sentences" in lines[at + 1]
    assert lines[at + 3] == "(ROUGE: no paired test)"


def test_evaluate_checks_the_baseline_before_printing(xinda, one_line_error, tmp_path):
    ref = write(tmp_path / "ref.txt", ["a b", "c d"])
    hyp = write(tmp_path / "hyp.txt", ["a b", "c d"])
    base = write(tmp_path / "base.txt", ["a b"])
    proc = xinda("evaluate", hyp, ref, "--baseline", base, ok=False)
    one_line_error(proc, f"{base} has 1 lines but {hyp} has 2")
    assert proc.stdout == ""


def test_the_baseline_can_come_from_stdin_but_not_with_the_hypotheses(xinda, one_line_error,
                                                                      tmp_path):
    """Before a review: ``--baseline -`` said "-: file not found"."""
    ref = write(tmp_path / "ref.txt", ["a b c d", "e f g h"])
    hyp = write(tmp_path / "hyp.txt", ["a b c d", "e f g x"])
    out = xinda("evaluate", hyp, ref, "--baseline", "-", "--metrics", "ter",
                input="a b c x\ne f g x\n").stdout
    assert "against the baseline <stdin>:" in out and "TER (lower is better): " in out
    proc = xinda("evaluate", "-", ref, "--baseline", "-", input="a\nb\n", ok=False)
    one_line_error(proc, "--baseline and HYPOTHESES cannot both be read from stdin")


def test_the_sources_of_by_length_can_come_from_stdin_once(xinda, one_line_error, tmp_path):
    """Before: ``--source -`` said "-: file not found" (found by review)."""
    ref = write(tmp_path / "ref.txt", ["a b c d", "e f g h"])
    hyp = write(tmp_path / "hyp.txt", ["a b c d", "e f g x"])
    out = xinda("evaluate", hyp, ref, "--by-length", "--source", "-", input="x y\nz\n").stdout
    assert "1-10" in out
    proc = xinda("evaluate", "-", ref, "--by-length", "--source", "-", input="a\nb\n", ok=False)
    one_line_error(proc, "--source and HYPOTHESES cannot both be read from stdin")
    proc = xinda("evaluate", hyp, ref, "--by-length", "--source", "-", "--baseline", "-",
                 input="a\nb\n", ok=False)
    one_line_error(proc, "--baseline and --source cannot both be read from stdin")
    proc = xinda("evaluate", hyp, ref, "--by-length", "--source", "-", input="a\n", ok=False)
    one_line_error(proc, f"<stdin> has 1 lines but {hyp} has 2")


def test_a_reference_can_come_from_stdin_once(xinda, one_line_error, tmp_path):
    """Before: ``xinda evaluate hyp.txt -`` said "-: file not found" (found by review)."""
    hyp = write(tmp_path / "hyp.txt", ["a b c d", "e f g h"])
    out = xinda("evaluate", hyp, "-", "--metrics", "chrf", input="a b c d\ne f g h\n").stdout
    assert out.startswith("chrF2 = 100.00")
    proc = xinda("evaluate", hyp, "-", input="a b c d\n", ok=False)
    one_line_error(proc, f"{hyp} has 2 lines but <stdin> has 1")
    proc = xinda("evaluate", "-", "-", input="a\nb\n", ok=False)
    one_line_error(proc, "the hypotheses and references: stdin (-) gives one of them at most")
    proc = xinda("evaluate", hyp, "-", "--baseline", "-", input="a\nb\n", ok=False)
    one_line_error(proc, "--baseline and REFERENCES cannot both be read from stdin")
