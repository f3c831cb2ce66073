"""Bad input to the CLI: exit != 0 and ONE ``xinda: error:`` line naming the culprit, no
traceback."""

from __future__ import annotations

import shutil

import pytest
import yaml


def write_corpus(folder, name, src: bytes, tgt: bytes) -> str:
    (folder / f"{name}.en").write_bytes(src)
    (folder / f"{name}.de").write_bytes(tgt)
    return str(folder / name)


def write_data_config(folder, **data) -> str:
    path = folder / "config.yaml"
    data = {"out_dir": str(folder / "data-bin"), "vocab_size": 16, **data}
    path.write_text(yaml.safe_dump({"data": data}), encoding="utf-8")
    return str(path)


GOOD = b"".join(b"line %d of text\n" % i for i in range(6))


def test_missing_corpus_file(xinda, one_line_error, tmp_path):
    write_corpus(tmp_path, "corpus", GOOD, GOOD)
    (tmp_path / "corpus.de").unlink()
    config = write_data_config(tmp_path, train=str(tmp_path / "corpus"))
    one_line_error(xinda("prepare", config, ok=False), str(tmp_path / "corpus.de"), "not found")
    assert not (tmp_path / "data-bin" / "manifest.json").exists()


def test_a_max_len_the_position_table_cannot_hold_names_its_set(xinda, one_line_error,
                                                                tmp_path):
    """Before: only the config file was named, not the --set that caused it (found by
    review)."""
    write_corpus(tmp_path, "corpus", GOOD, GOOD)
    config = write_data_config(tmp_path, train=str(tmp_path / "corpus"))
    proc = xinda("prepare", config, "--set", "data.max_len=2000", "--set",
                 "data.max_len_ratio=4", ok=False)
    one_line_error(proc, f"{config} with --set data.max_len=2000: data.max_len 2000 keeps")
    assert not (tmp_path / "data-bin" / "manifest.json").exists()


def test_missing_config_file(xinda, one_line_error, tmp_path):
    one_line_error(xinda("prepare", tmp_path / "nope.yaml", ok=False), "nope.yaml", "not found")


def test_invalid_utf8_names_file_and_line(xinda, one_line_error, tmp_path):
    src = b"one\ntwo\n\xff\xfe three\nfour\n"
    prefix = write_corpus(tmp_path, "corpus", src, b"eins\nzwei\ndrei\nvier\n")
    config = write_data_config(tmp_path, train=prefix)
    last = one_line_error(xinda("prepare", config, ok=False), f"{prefix}.en:3:")
    assert "UTF-8" in last


def test_invalid_utf8_in_valid_split(xinda, one_line_error, tmp_path):
    train = write_corpus(tmp_path, "train", GOOD, GOOD)
    valid = write_corpus(tmp_path, "valid", b"a\nb\n", b"a\nb\nc\nd\n\xc3\n")
    config = write_data_config(tmp_path, train=train, valid=valid)
    one_line_error(xinda("prepare", config, ok=False), f"{valid}.de:5:", "UTF-8")


def test_misaligned_line_counts(xinda, one_line_error, tmp_path):
    prefix = write_corpus(tmp_path, "corpus", GOOD, b"a\nb\nc\n")
    config = write_data_config(tmp_path, train=prefix)
    last = one_line_error(xinda("prepare", config, ok=False), f"{prefix}.de:3:")
    assert f"{prefix}.en" in last


@pytest.mark.parametrize("src, tgt, culprit", [(b"", b"", "en"), (GOOD, b"", "de")])
def test_empty_corpus(xinda, one_line_error, tmp_path, src, tgt, culprit):
    prefix = write_corpus(tmp_path, "corpus", src, tgt)
    config = write_data_config(tmp_path, train=prefix)
    one_line_error(xinda("prepare", config, ok=False), f"{prefix}.{culprit}", "empty")


def test_only_empty_lines(xinda, one_line_error, tmp_path):
    prefix = write_corpus(tmp_path, "corpus", b"\n\n\n", b"\n\n\n")
    config = write_data_config(tmp_path, train=prefix)
    one_line_error(xinda("prepare", config, ok=False), prefix, "removed by filtering")


def test_wrong_type_in_config_names_the_key(xinda, one_line_error, tmp_path):
    prefix = write_corpus(tmp_path, "corpus", GOOD, GOOD)
    config = write_data_config(tmp_path, train=prefix, vocab_size="many")
    one_line_error(xinda("prepare", config, ok=False), "data.vocab_size", "config.yaml")


def test_wrong_type_in_set_override_names_the_key(xinda, one_line_error, tmp_path):
    prefix = write_corpus(tmp_path, "corpus", GOOD, GOOD)
    config = write_data_config(tmp_path, train=prefix)
    proc = xinda("prepare", config, "--set", "data.max_len=long", ok=False)
    one_line_error(proc, "data.max_len")


def test_invalid_yaml(xinda, one_line_error, tmp_path):
    (tmp_path / "config.yaml").write_text("data: {train: [unclosed\n", encoding="utf-8")
    one_line_error(xinda("prepare", tmp_path / "config.yaml", ok=False), "config.yaml", "YAML")


def test_translate_without_model(xinda, one_line_error, tmp_path):
    (tmp_path / "in.txt").write_text("one\n", encoding="utf-8")
    (tmp_path / "empty").mkdir()
    proc = xinda("translate", tmp_path / "empty", "-i", tmp_path / "in.txt", ok=False)
    one_line_error(proc, str(tmp_path / "empty"))
    proc = xinda("translate", tmp_path / "missing", input="one\n", ok=False)
    one_line_error(proc, str(tmp_path / "missing"))


def test_translate_model_dir_without_weights(trained, xinda, one_line_error, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.yaml", "manifest.json", "spm.model"):
        shutil.copyfile(trained.model_dir / name, model / name)
    proc = xinda("translate", model, input="one\n", ok=False)
    one_line_error(proc, str(model), "no trained weights")


def test_translate_missing_input_file(trained, xinda, one_line_error, tmp_path):
    proc = xinda("translate", trained.model_dir, "-i", tmp_path / "nope.txt", ok=False)
    one_line_error(proc, str(tmp_path / "nope.txt"), "not found")
    proc = xinda("translate", trained.model_dir, "-i", tmp_path, ok=False)  # a directory
    one_line_error(proc, str(tmp_path))


def test_translate_invalid_utf8_input(trained, xinda, one_line_error, tmp_path):
    (tmp_path / "in.txt").write_bytes(b"one\ntwo\n\xff\n")
    proc = xinda("translate", trained.model_dir, "-i", tmp_path / "in.txt", ok=False)
    one_line_error(proc, f"{tmp_path / 'in.txt'}:3:", "UTF-8")


def test_evaluate_line_count_mismatch(xinda, one_line_error, tmp_path):
    (tmp_path / "hyp.txt").write_text("a\nb\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("a\nb\nc\n", encoding="utf-8")
    proc = xinda("evaluate", tmp_path / "hyp.txt", tmp_path / "ref.txt", ok=False)
    one_line_error(proc)


@pytest.mark.parametrize("source", [None, "a\n"])
def test_evaluate_by_length_checks_the_source_before_printing_scores(xinda, one_line_error,
                                                                     tmp_path, source):
    """Before: the scores went to stdout, then the error (without the file's name)."""
    for name in ("hyp.txt", "ref.txt"):
        (tmp_path / name).write_text("a b\nc d\n", encoding="utf-8")
    args = [] if source is None else ["--source", tmp_path / "src.txt"]
    if source is not None:
        (tmp_path / "src.txt").write_text(source, encoding="utf-8")
    proc = xinda("evaluate", tmp_path / "hyp.txt", tmp_path / "ref.txt", "--by-length", *args,
                 ok=False)
    one_line_error(proc, "--source" if source is None else f"{tmp_path / 'src.txt'} has 1 lines")
    assert proc.stdout == ""


def test_evaluate_source_without_by_length_is_refused(xinda, one_line_error, tmp_path):
    """Before: --source without --by-length was silently unused (found by review)."""
    for name in ("hyp.txt", "ref.txt", "src.txt"):
        (tmp_path / name).write_text("a b\nc d\n", encoding="utf-8")
    proc = xinda("evaluate", tmp_path / "hyp.txt", tmp_path / "ref.txt", "--source",
                 tmp_path / "src.txt", ok=False)
    one_line_error(proc, "--source is read for --by-length only")
    assert proc.stdout == ""


def test_a_config_can_come_from_a_pipe(tmp_path):
    """Before: ``xinda prepare <(cat cfg.yaml)`` said "/dev/fd/63: config file not found" (the
    corpus readers take pipes; found by review)."""
    import os
    import signal

    from xinda.config import load_config

    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    pid = os.fork()
    if pid == 0:  # the writer, as the shell's <(...) would be
        with open(fifo, "w", encoding="utf-8") as f:
            f.write("train:\n  lr: 0.002\n")
        os._exit(0)
    try:
        assert load_config(fifo).train.lr == 0.002
    finally:  # a writer left waiting for a reader (when the read failed) goes too
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_translate_invalid_utf8_on_stdin_names_the_line(trained, xinda_popen):
    import subprocess

    proc = xinda_popen("translate", trained.model_dir, stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, stderr = proc.communicate(b"three\nfo\xffur\n", timeout=120)
    assert proc.returncode != 0
    last = stderr.decode().strip().splitlines()[-1]
    assert last.startswith("xinda: error: <stdin>:2: invalid UTF-8"), last


def test_evaluate_rouge_against_several_reference_files(tmp_path, xinda, one_line_error):
    """Each extra REFERENCES file is one more reference stream; ROUGE scores print with their
    signature, and a short reference file is named in a one-line error."""
    (tmp_path / "hyp.txt").write_text("the cats sat\nhello\n")
    (tmp_path / "r1.txt").write_text("the cat sat\nhello world\n")
    (tmp_path / "r2.txt").write_text("a cat\n")
    lines = xinda("evaluate", tmp_path / "hyp.txt", tmp_path / "r1.txt",
                  "--metrics", "rouge").stdout.splitlines()
    assert [line.split(" = ")[0] for line in lines] == ["ROUGE-1", "ROUGE-2", "ROUGE-L"]
    assert lines[0].startswith("ROUGE-1 = 83.33 (nrefs:1|")  # (1 + 2/3) / 2
    proc = xinda("evaluate", tmp_path / "hyp.txt", tmp_path / "r1.txt", tmp_path / "r2.txt",
                 "--metrics", "rouge", ok=False)
    one_line_error(proc, "hyp.txt has 2 lines but", "r2.txt has 1")


@pytest.mark.parametrize(("args", "fragment"), [
    (["translate", "model", "--bogus"], "No such option: --bogus (see xinda translate --help)"),
    (["average", "model", "--last", "0"], "Invalid value for '--last'"),
    (["prepare"], "Missing argument 'config'"),
])
def test_a_command_line_that_does_not_parse_is_one_line_too(xinda, one_line_error, args,
                                                            fragment):
    """Before: click's boxed panel (exit 2); now the one line of every other user error."""
    proc = xinda(*args, ok=False)
    assert proc.returncode == 2
    one_line_error(proc, fragment)


def test_the_command_list_joins_each_summary_s_lines():
    """A docstring's first paragraph is one line in ``xinda --help``. Before: typer's rich help
    kept its line breaks ("...(progressive training); then" / "`xinda train ...")."""
    from typer.testing import CliRunner

    from xinda.cli import app

    out = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "300"}).output
    grow = next(line for line in out.splitlines() if line.startswith("│ grow"))
    assert "(progressive training): then xinda train OUT/config.yaml --resume continues" in grow
