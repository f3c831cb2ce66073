"""log.csv survives a crash while a row was being appended; curves.png's axes."""

from __future__ import annotations

from xinda.train.curves import FIELDS, CsvLog, read_log


def test_truncate_after_drops_later_rows_and_a_torn_last_row(tmp_path):
    log = CsvLog(tmp_path / "log.csv")
    for step in (5, 10, 15):
        log.write(step=step, epoch=1, train_loss=1.0 / step)
    with (tmp_path / "log.csv").open("a") as f:
        f.write("20,1,,0.0")  # killed mid-row: no newline, fields missing
    log.truncate_after(10)
    assert [row["step"] for row in read_log(tmp_path / "log.csv")] == [5.0, 10.0]
    assert (tmp_path / "log.csv").read_text().splitlines()[0] == ",".join(FIELDS)


def test_a_torn_row_that_looks_complete_but_lacks_its_newline_is_dropped(tmp_path):
    log = CsvLog(tmp_path / "log.csv")
    log.write(step=5, epoch=1, train_loss=0.5)
    with (tmp_path / "log.csv").open("a") as f:
        f.write("10,1,,0.4,,,,,,")  # all fields, but the newline was never written
    log.truncate_after(100)
    assert [row["step"] for row in read_log(tmp_path / "log.csv")] == [5.0]
    log.write(step=10, epoch=1, train_loss=0.4)  # appending starts on a fresh line
    assert [row["step"] for row in read_log(tmp_path / "log.csv")] == [5.0, 10.0]


def test_the_bleu_axis_starts_at_zero_when_every_score_is_zero(tmp_path, monkeypatch):
    """Before: validations all at BLEU 0 (early epochs) got an axis from -0.05 to 0.05."""
    import matplotlib.pyplot as plt

    from xinda.train.curves import plot_curves

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    log = CsvLog(tmp_path / "log.csv")
    for step in (10, 20):
        log.write(step=step, epoch=1, valid_loss=5.0 - step / 10, valid_ppl=100.0, valid_bleu=0.0)
    plot_curves(tmp_path / "log.csv", tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert figures[0].axes[1].get_ylim() == (0.0, 1.0)
    monkeypatch.undo()
    plt.close(figures[0])
