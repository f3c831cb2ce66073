"""``xinda translate --attention-plot DIR`` writes one heat-map per translated sentence."""

from __future__ import annotations

from PIL import Image

from xinda.decode.translator import Translator


def test_attention_plot_writes_one_png_per_sentence(trained, xinda, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("three hundred four\n\nseventy-one thousand two\n", encoding="utf-8")
    plots = tmp_path / "plots"
    xinda("translate", trained.model_dir, "-i", src, "-o", tmp_path / "out.txt",
          "--beam", "3", "--attention-plot", plots)
    written = sorted(p.name for p in plots.glob("*.png"))
    assert written == ["00000.png", "00002.png"]  # the empty line has nothing to draw
    width, height = Image.open(plots / "00000.png").size
    assert width > 100 and height > 100


def test_coverage_penalty_option_translates_every_line(trained, xinda, tmp_path):
    lines = ["three hundred four", "seventy-one thousand two"]
    src = tmp_path / "in.txt"
    src.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    proc = xinda("translate", trained.model_dir, "-i", src, "--beam", "4", "--coverage", "0.2",
                 "--scores")
    rows = [row.split("\t", 1) for row in proc.stdout.splitlines()]
    assert len(rows) == 2
    # the options reach the search: the same texts and (coverage-penalised) scores as the API
    # gives with beam 4 and coverage 0.2
    best = [nbest[0] for nbest in Translator.load(trained.model_dir).translate(
        lines, beam=4, coverage=0.2)]
    assert rows == [[f"{t.score:.4f}", t.text] for t in best]


def test_pieces_with_dollar_signs_are_drawn_as_written(tmp_path):
    """Before: matplotlib parsed "$a_b_c$" as a formula and raised "Double subscript" after
    the translations were written; the other plots were never drawn."""
    import torch

    from xinda.evaluate.attention_plot import plot_attention

    plot_attention(torch.full((3, 3), 0.5), ["$a_b_c$", "x"], ["$5", "$a^^b$"],
                   tmp_path / "dollars.png", title="cost $a_b_c$")
    assert Image.open(tmp_path / "dollars.png").size[0] > 100
