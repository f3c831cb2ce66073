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
    (plots / "notes.png").write_bytes(b"mine")  # not a plot's name: left alone
    src.write_text("three hundred four\n", encoding="utf-8")  # before: 00002.png stayed
    xinda("translate", trained.model_dir, "-i", src, "--attention-plot", plots)
    assert sorted(p.name for p in plots.glob("*.png")) == ["00000.png", "notes.png"]


def test_attention_plot_refuses_a_folder_of_someone_else_s_numbered_pngs(trained, xinda,
                                                                         one_line_error,
                                                                         tmp_path):
    """Video frames are named 00000.png ... as the plots are; before, a shorter input deleted
    those past it, and the others were overwritten (found by review)."""
    frames = tmp_path / "frames"
    frames.mkdir()
    (frames / "00050.png").write_bytes(b"a frame")
    proc = xinda("translate", trained.model_dir, "--attention-plot", frames, input="five\n",
                 ok=False)
    one_line_error(proc, f"--attention-plot {frames}: holds 00050.png", "empty or new folder")
    assert (frames / "00050.png").read_bytes() == b"a frame"


def test_an_output_inside_the_plot_folder_is_refused(trained, xinda, one_line_error,
                                                     tmp_path):
    """Before: -o plots/00000.png was overwritten by plot 0 after the translations were
    written, and -o plots/00005.png removed as a stale plot; exit code 0 (found by review)."""
    plots = tmp_path / "plots"
    for name in ("00000.png", "out.txt"):
        proc = xinda("translate", trained.model_dir, "--attention-plot", plots, "-o",
                     plots / name, input="five\n", ok=False)
        one_line_error(proc, f"-o {plots / name}: is in the --attention-plot folder")
    assert not plots.exists()


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


def test_a_long_sentence_gives_a_picture_of_bounded_size(tmp_path):
    """Before: 0.35 inch per piece without a cap: 250 x 386 pieces took 19 s and 4.9 GB and
    wrote a 9828 x 15031 px PNG that viewers refuse (over PIL's decompression-bomb limit)."""
    import torch

    from xinda.evaluate.attention_plot import MAX_SIDE_INCHES, plot_attention

    source, target = [f"s{i}" for i in range(250)], [f"t{i}" for i in range(385)]
    plot_attention(torch.rand(386, 251), source, target, tmp_path / "long.png")
    width, height = Image.open(tmp_path / "long.png").size
    assert max(width, height) <= (MAX_SIDE_INCHES + 2) * 110 and min(width, height) > 1000


def test_cjk_pieces_are_said_once_not_once_per_glyph(tmp_path, caplog, recwarn, monkeypatch):
    """Before: a UserWarning per CJK character ("Glyph 25105 missing from font(s) DejaVu
    Sans") and boxes; now the installed CJK font draws them, or one warning says none is."""
    import torch
    from matplotlib import font_manager

    from xinda.evaluate import attention_plot

    monkeypatch.setattr(attention_plot, "_warned_no_cjk_font", False)
    installed = {font.name for font in font_manager.fontManager.ttflist}
    for i in range(2):
        attention_plot.plot_attention(torch.full((3, 3), 0.5), ["▁我们", "在"], ["▁北京", "。"],
                                      tmp_path / f"{i}.png", title="我们在北京")
    assert not [w for w in recwarn if "missing from font" in str(w.message)]
    told = caplog.text.count("no CJK font installed")
    assert told == (0 if installed & set(attention_plot.CJK_FONTS) else 1)


def test_a_line_without_output_leaves_no_earlier_runs_picture(tmp_path):
    """Before: line 2's 00001.png from an earlier run stayed, and read as this run's."""
    from types import SimpleNamespace

    from xinda.cli.translate import _plot_attention

    (tmp_path / "00001.png").write_bytes(b"an earlier run's plot")
    _plot_attention([[SimpleNamespace(attention=None)]] * 2, tmp_path)
    assert not (tmp_path / "00001.png").exists()


def test_every_attention_column_has_its_own_source_label(trained, tmp_path):
    """Before: specials written in pieces input (a literal "</s>") were left out of the
    labels, and the plot put the next pieces' labels on their columns (found by review)."""
    import pytest
    import torch

    from xinda.evaluate.attention_plot import plot_attention

    translator = Translator.load(trained.model_dir)
    pieces = [*translator.src_vocab.encode_pieces("three"), "</s>", "<s>",
              *translator.src_vocab.encode_pieces("four")]
    [[best]] = translator.translate([" ".join(pieces)], beam=2, input_format="pieces",
                                    need_attention=True)
    assert best.source_pieces == pieces
    assert best.attention.shape == (len(best.target_pieces) + 1, len(pieces) + 1)
    plot_attention(best.attention, best.source_pieces, best.target_pieces, tmp_path / "a.png")
    with pytest.raises(ValueError, match=r"attention \(3, 3\) does not fit 2 target and 1"):
        plot_attention(torch.full((3, 3), 0.5), ["x"], ["a", "b"], tmp_path / "b.png")
