"""``xinda translate --attention-plot DIR`` writes one heat-map per translated sentence."""

from __future__ import annotations

from PIL import Image


def test_attention_plot_writes_one_png_per_sentence(trained, xinda, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("three hundred four\n\nseventy-one thousand two\n", encoding="utf-8")
    plots = tmp_path / "plots"
    proc = xinda("translate", trained.model_dir, "-i", src, "-o", tmp_path / "out.txt",
                 "--beam", "3", "--attention-plot", plots)
    assert proc.returncode == 0, proc.stderr
    written = sorted(p.name for p in plots.glob("*.png"))
    assert written == ["00000.png", "00002.png"]  # the empty line has nothing to draw
    width, height = Image.open(plots / "00000.png").size
    assert width > 100 and height > 100


def test_coverage_penalty_option_translates_every_line(trained, xinda, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("three hundred four\nseventy-one thousand two\n", encoding="utf-8")
    proc = xinda("translate", trained.model_dir, "-i", src, "--beam", "4", "--coverage", "0.2")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 2
