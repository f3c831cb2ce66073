"""Bad input to ``xinda prepare`` / ``train`` / ``demo`` found by the issue: broken .gz corpora,
directories, invalid model sections, control characters and a too small corpus. Each failure is
one ``xinda: error:`` line naming the file and the cause, and nothing is written."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import pytest
import yaml

TINY_MODEL = {"arch": "transformer", "d_model": 32, "heads": 2, "ffn_dim": 64,
              "encoder_layers": 1, "decoder_layers": 1}
GOOD = [f"line {i} of text" for i in range(6)]


def write_side(path, lines: list[str]) -> None:
    path.write_bytes("".join(f"{x}\n" for x in lines).encode("utf-8"))


def write_corpus(folder, name, src: list[str], tgt: list[str]) -> str:
    write_side(folder / f"{name}.en", src)
    write_side(folder / f"{name}.de", tgt)
    return str(folder / name)


def write_config(folder, model: dict | None = None, **data) -> str:
    path = folder / "config.yaml"
    data = {"out_dir": str(folder / "data-bin"), "vocab_size": 40, **data}
    tree = {"data": data, "model": model or dict(TINY_MODEL),
            "train": {"out_dir": str(folder / "model"), "device": "cpu"}}
    path.write_text(yaml.safe_dump(tree), encoding="utf-8")
    return str(path)


def test_truncated_gz_corpus_is_not_a_bare_abort(xinda, one_line_error, tmp_path):
    prefix = write_corpus(tmp_path, "corpus", GOOD, GOOD)
    (tmp_path / "corpus.de").unlink()
    data = gzip.compress("".join(f"zeile {i}\n" for i in range(5000)).encode())
    (tmp_path / "corpus.de.gz").write_bytes(data[:len(data) // 2])
    proc = xinda("prepare", write_config(tmp_path, train=prefix), ok=False)
    last = one_line_error(proc, f"{prefix}.de.gz: truncated gzip file", "after line ")
    assert proc.returncode == 1 and "Aborted" not in proc.stderr, last
    assert not (tmp_path / "data-bin").exists()


def test_not_gzip_corpus(xinda, one_line_error, tmp_path):
    prefix = write_corpus(tmp_path, "corpus", GOOD, GOOD)
    (tmp_path / "corpus.de").rename(tmp_path / "corpus.de.gz")  # plain text named .gz
    proc = xinda("prepare", write_config(tmp_path, train=prefix), ok=False)
    one_line_error(proc, f"{prefix}.de.gz: not a gzip file")
    assert not (tmp_path / "data-bin").exists()


def test_directory_as_corpus(xinda, one_line_error, tmp_path):
    prefix = write_corpus(tmp_path, "corpus", GOOD, GOOD)
    (tmp_path / "corpus.de").unlink()
    (tmp_path / "corpus.de").mkdir()
    proc = xinda("prepare", write_config(tmp_path, train=prefix), ok=False)
    last = one_line_error(proc, f"{prefix}.de: is a directory")
    assert "not found" not in last


def test_translate_reports_directory_input(trained, xinda, one_line_error, tmp_path):
    proc = xinda("translate", trained.model_dir, "-i", tmp_path, ok=False)
    one_line_error(proc, f"{tmp_path}: is a directory")


@pytest.mark.parametrize("model, fragments", [
    ({**TINY_MODEL, "bogus_key": 1}, ("model.bogus_key:", "Extra inputs")),
    ({**TINY_MODEL, "d_model": "wide"}, ("model.d_model:", "integer")),
    ({"preset": "transformer-nope"}, ("model.preset:", "transformer-nope")),
])
def test_prepare_validates_the_model_section_first(xinda, one_line_error, tmp_path, model,
                                                   fragments):
    prefix = write_corpus(tmp_path, "corpus", GOOD, GOOD)
    config = write_config(tmp_path, model=model, train=prefix)
    one_line_error(xinda("prepare", config, ok=False), f"{config}: ", *fragments)
    assert not (tmp_path / "data-bin").exists()  # nothing prepared, not even the folder


def test_set_override_of_model_is_validated(xinda, one_line_error, tmp_path):
    prefix = write_corpus(tmp_path, "corpus", GOOD, GOOD)
    config = write_config(tmp_path, train=prefix)
    proc = xinda("prepare", config, "--set", "model.heads=two", ok=False)
    one_line_error(proc, "model.heads:")
    assert not (tmp_path / "data-bin").exists()


def test_train_validates_the_model_section_first(xinda, one_line_error, tmp_path):
    config = write_config(tmp_path, model={**TINY_MODEL, "bogus_key": 1}, train="unused")
    one_line_error(xinda("train", config, ok=False), "model.bogus_key:")
    assert not (tmp_path / "model").exists()


def test_demo_validates_before_deleting_anything(xinda, one_line_error, tmp_path):
    keep = tmp_path / "data-bin" / "keep.txt"  # run_demo would delete data-bin first
    keep.parent.mkdir()
    keep.write_text("old output", encoding="utf-8")
    proc = xinda("demo", "--workdir", tmp_path, "--set", "model.bogus_key=1", ok=False)
    one_line_error(proc, "model.bogus_key:")
    assert keep.read_text(encoding="utf-8") == "old output"


def test_demo_needs_its_test_set(xinda, one_line_error, tmp_path):
    """Before: data.test={} passed the checks, and the demo failed with a KeyError traceback
    after preparing and training (found by review)."""
    proc = xinda("demo", "--workdir", tmp_path, "--set", "data.test={}", ok=False)
    one_line_error(proc, "data.test: the demo translates and scores its test set 'test'")
    assert not (tmp_path / "model").exists()


def test_demo_never_replaces_a_folder_it_did_not_write(xinda, one_line_error, tmp_path,
                                                       monkeypatch):
    """Before: --workdir DIR deleted DIR/raw, DIR/data-bin and DIR/model whatever they held,
    and --set train.out_dir=. the current folder."""
    from xinda.demo.run import MARK, check_demo_folder
    from xinda.errors import XindaError

    keep = tmp_path / "data-bin" / "keep.txt"
    keep.parent.mkdir()
    keep.write_text("a user's data", encoding="utf-8")
    proc = xinda("demo", "--workdir", tmp_path, ok=False)
    one_line_error(proc, f"{keep.parent}: exists and was not written by xinda demo")
    assert keep.read_text(encoding="utf-8") == "a user's data"
    monkeypatch.chdir(tmp_path)
    for folder in (tmp_path, Path(".")):
        with pytest.raises(XindaError, match="would replace the current folder"):
            check_demo_folder(folder)
    (keep.parent / MARK).touch()  # an earlier demo's output is replaced
    check_demo_folder(keep.parent)
    check_demo_folder(tmp_path / "missing")


def test_control_characters_dropped_and_cleaned(xinda, tmp_path):
    src = [f"source sentence number {i}" for i in range(40)]
    tgt = [f"target sentence number {i}" for i in range(40)]
    src[5], tgt[9] = "nul\x00inside", "escape \x1b[0m here"
    train = write_corpus(tmp_path, "train", src, tgt)
    valid = write_corpus(tmp_path, "valid", ["a\x00b", "c"], ["d", "e"])
    proc = xinda("prepare", write_config(tmp_path, train=train, valid=valid, vocab_size=40))
    assert "train: read 40 pairs, kept 38;" in proc.stdout
    assert "control characters 2" in proc.stdout
    assert "valid: 2 pairs (not filtered; 1 lines with control characters cleaned" in proc.stdout
    assert (tmp_path / "data-bin" / "valid.src.txt").read_text(encoding="utf-8") == "a b\nc\n"


def test_corpus_smaller_than_vocab_size_warns(xinda, tmp_path):
    prefix = write_corpus(tmp_path, "corpus", ["one small line"], ["eine kleine zeile"])
    proc = xinda("prepare", write_config(tmp_path, train=prefix, vocab_size=8000))
    assert "warning" not in proc.stdout  # a report on stdout, warnings on stderr
    warning = [x for x in proc.stderr.splitlines() if x.startswith("xinda: warning:")]
    assert len(warning) == 1, proc.stderr
    assert warning[0].startswith("xinda: warning: spm.model has ")
    assert warning[0].endswith("pieces, fewer than data.vocab_size 8000 "
                               "(the training text is too small)")
    manifest = yaml.safe_load((tmp_path / "data-bin" / "manifest.json").read_text())
    assert f"spm.model has {manifest['vocab_sizes']['src']} pieces" in warning[0]


@pytest.mark.parametrize("exc, code, message", [
    (EOFError("Compressed file ended"), 1,
     "xinda: error: unexpected end of input data (Compressed file ended)"),
    (KeyboardInterrupt(), 130, "xinda: interrupted"),
])
def test_typer_never_turns_an_exception_into_aborted(monkeypatch, capsys, tmp_path, exc, code,
                                                     message):
    """typer prints a bare "Aborted!" for an EOFError and exits silently on Ctrl-C; every
    command says what happened instead (in-process: the command's work raises ``exc``)."""
    import sys

    import xinda.data.prepare
    from xinda.cli import main

    def fail(*args, **kwargs):
        raise exc

    monkeypatch.setattr(xinda.data.prepare, "prepare", fail)
    config = write_config(tmp_path, train=str(tmp_path / "corpus"))
    monkeypatch.setattr(sys, "argv", ["xinda", "prepare", config])
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == code
    err = capsys.readouterr().err
    assert "Aborted" not in err and err.strip().splitlines()[-1] == message


def test_a_line_of_control_characters_translates_to_an_empty_line(trained, xinda):
    proc = xinda("translate", trained.model_dir, "--scores", "--beam", "2",
                 input="five\n\x00\x01\x1b\n\n")
    rows = proc.stdout.split("\n")
    assert len(rows) == 4 and rows[-1] == ""  # three lines in, three out
    assert rows[1] == "0.0000\t" and rows[2] == "0.0000\t"  # nothing left to translate
    assert float(rows[0].split("\t")[0]) < 0  # a real line is decoded


def test_translate_with_workers_writes_what_one_thread_writes(trained, xinda):
    lines = "five\ntwelve\nthree hundred\n\nforty-two\nsix\n"
    one = xinda("translate", trained.model_dir, "--threads", "1", "--batch-size", "2",
                "--scores", input=lines)
    two = xinda("translate", trained.model_dir, "--workers", "2", "--batch-size", "2",
                "--scores", "--threads", "2", input=lines)
    assert two.stdout == one.stdout and len(one.stdout.split("\n")) == 7
    assert "--threads 2: not used: each of the 2 workers" in two.stderr  # (before: silent)


@pytest.mark.parametrize(("option", "value", "setting"), [
    ("--beam", "0", "decode.beam"), ("--batch-size", "0", "decode.batch_size"),
    ("--alpha", "-1", "decode.alpha"), ("--precision", "fp8", "decode.precision"),
    ("--stop", "first", "decode.stop"), ("--workers", "0", "decode.workers"),
    ("--int8-scale", "rows", "decode.int8_scale")])
def test_bad_decode_options_are_one_line_errors(trained, xinda, one_line_error, option, value,
                                                setting):
    proc = xinda("translate", trained.model_dir, option, value, input="five\n", ok=False)
    one_line_error(proc, setting)


@pytest.mark.parametrize("where", ["output", "attention plots"])
def test_translate_refuses_an_unwritable_output_before_decoding(trained, xinda, one_line_error,
                                                                tmp_path, where):
    """Before: a traceback after the whole input was decoded, the translation lost."""
    (tmp_path / "file").write_text("kept\n")
    bad = tmp_path / "file" / "out.txt" if where == "output" else tmp_path / "file"
    args = ["-o", bad] if where == "output" else ["--attention-plot", bad]
    proc = xinda("translate", trained.model_dir, *args, input="five\n", ok=False)
    one_line_error(proc, f"{bad}: cannot write")
    assert "translated" not in proc.stderr  # refused before decoding
    assert (tmp_path / "file").read_text() == "kept\n"


@pytest.mark.parametrize("target", ["input", "prefix", "config.yaml", "best.safetensors",
                                    "spm.model", "checkpoints/notes.txt", "link"])
def test_translate_refuses_to_write_over_its_own_inputs(trained, xinda, one_line_error,
                                                        tmp_path, target):
    """Before: -o the input file or a file of the model folder replaced it (exit 0, the model
    unusable); a new file in the model folder is still fine."""
    model = tmp_path / "model"
    shutil.copytree(trained.model_dir, model)
    (model / "checkpoints").mkdir(exist_ok=True)
    source, prefixes = tmp_path / "in.txt", tmp_path / "prefix.txt"
    source.write_text("five\n")
    prefixes.write_text("\n")
    out = {"input": source, "prefix": prefixes}.get(target, model / target)
    if target == "link":  # (found by review: the link's suffix, .txt, was checked)
        out = tmp_path / "link.txt"
        out.symlink_to(model / "config.yaml")
    if not out.exists():
        out.write_text("kept\n")
    before = out.read_bytes()
    proc = xinda("translate", model, "-i", source, "--prefix", prefixes, "-o", out, ok=False)
    one_line_error(proc, f"-o {out}: ")
    assert out.read_bytes() == before
    for new in ("test.hyp", "eval/test.hyp.json"):  # new files (found by review: refused)
        xinda("translate", model, "-i", source, "-o", model / new)
        assert len((model / new).read_text().splitlines()) == 1


def test_translate_refuses_new_weights_data_files_and_its_plot_folder_before_decoding(
        trained, tmp_path):
    """Before (found by review): -o MODEL/averaged.safetensors (not there yet) was written,
    and every later translate of MODEL failed to read it as weights; -o a file of the prepared
    data the model's config names replaced it (training could not resume); -o the
    --attention-plot folder failed after decoding."""
    from xinda.cli.translate import _check_outputs
    from xinda.errors import XindaError

    model = tmp_path / "model"
    shutil.copytree(trained.model_dir, model)
    data_file = next(p for p in Path(trained.prepared.data_dir).iterdir() if p.is_file())
    for output, plots, fragment in [
            (model / "averaged.safetensors", None, "would replace a file of the model folder"),
            (data_file, None, "the prepared data of"),
            (tmp_path / "plots", tmp_path / "plots", "is in the --attention-plot folder")]:
        with pytest.raises(XindaError, match=fragment):
            _check_outputs(output, plots, [None], [model])
    _check_outputs(model / "test.hyp", tmp_path / "plots", [None], [model])  # (fine)


def test_average_refuses_another_models_folder(trained, xinda, one_line_error, tmp_path):
    """Before: -o OTHER/averaged.safetensors was written, and OTHER then translated with
    these weights (found by review)."""
    other = tmp_path / "other"
    shutil.copytree(trained.model_dir, other)
    proc = xinda("average", trained.model_dir, "-o", other / "averaged.safetensors", ok=False)
    one_line_error(proc, "in another model's folder")
    assert not (other / "averaged.safetensors").exists()


def test_closed_stdout_and_stdin_are_one_line_errors(tmp_path):
    """Before: AttributeError tracebacks (sys.stdout / sys.stdin are None), for a closed
    stdout after the whole input was decoded (found by review)."""
    import subprocess

    from subprocesses import subprocess_env, xinda_command

    (tmp_path / "ref.txt").write_text("a\n")
    for closed, args, fragment in [
            (1, ["models"], "stdout is closed"),
            (0, ["evaluate", "-", tmp_path / "ref.txt"], "<stdin>: no hypotheses")]:
        proc = subprocess.run([*xinda_command(), *map(str, args)], env=subprocess_env(),
                              stdout=None if closed == 1 else subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=120, check=False,
                              preexec_fn=lambda fd=closed: os.close(fd))
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert fragment in proc.stderr and proc.stderr.startswith("xinda: error: ")


def test_translate_writes_its_output_before_the_attention_plots(trained, xinda, tmp_path):
    out = tmp_path / "out.txt"
    xinda("translate", trained.model_dir, "-o", out, "--attention-plot", tmp_path / "plots",
          input="five\nsix\n")
    assert len(out.read_text().splitlines()) == 2
    assert len(list((tmp_path / "plots").glob("*.png"))) == 2


def test_translate_compresses_an_output_named_gz(trained, xinda, tmp_path):
    """Before: -o out.gz was plain text, which evaluate then refused as "not a gzip file"
    (found by review); inputs named .gz are read decompressed."""
    import gzip

    xinda("translate", trained.model_dir, "-o", tmp_path / "out.GZ", input="five\nsix\n")
    lines = gzip.decompress((tmp_path / "out.GZ").read_bytes()).decode().splitlines()
    assert len(lines) == 2
    (tmp_path / "ref.txt").write_text("".join(f"{line}\n" for line in lines))
    out = xinda("evaluate", tmp_path / "out.GZ", tmp_path / "ref.txt", "--metrics", "chrf")
    assert out.stdout.startswith("chrF2 = 100.00")


def test_a_refused_translate_makes_no_folders(trained, xinda, one_line_error, tmp_path):
    """Before: -o new/sub/out.txt and --attention-plot made their folders before the model or
    the options were checked, and a refusal left them behind (found by review)."""
    proc = xinda("translate", tmp_path / "no-model", "-o", tmp_path / "new" / "sub" / "out.txt",
                 "--attention-plot", tmp_path / "plots" / "x", input="five\n", ok=False)
    one_line_error(proc, "no-model")
    assert not any(tmp_path.iterdir())


def test_prepare_into_a_file_is_a_one_line_error(prepared, xinda, one_line_error, tmp_path):
    (tmp_path / "file").write_text("kept\n")
    proc = xinda("prepare", prepared.config, "--set", f"data.out_dir={tmp_path / 'file'}",
                 ok=False)
    one_line_error(proc, f"{tmp_path / 'file'}: cannot write")
    assert (tmp_path / "file").read_text() == "kept\n"


def test_a_full_stdout_keeps_the_prepared_data_and_is_one_line(tmp_path):
    """Before: prepare printed its report inside the staging step, so a failed write to stdout
    deleted the finished dataset and ended in a traceback; evaluate's scores too."""
    import subprocess

    from subprocesses import subprocess_env, xinda_command

    src = [f"source sentence number {i}" for i in range(40)]
    train = write_corpus(tmp_path, "train", src, [s.replace("source", "target") for s in src])
    for args in (["prepare", write_config(tmp_path, train=train)],
                 ["evaluate", f"{train}.en", f"{train}.de"]):
        with open("/dev/full", "w") as full:
            proc = subprocess.run([*xinda_command(), *args], stdout=full, stderr=subprocess.PIPE,
                                  text=True, check=False, env=subprocess_env(), timeout=180)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines()[-1] == (
            "xinda: error: stdout: cannot write the output: No space left on device")
    assert (tmp_path / "data-bin" / "manifest.json").is_file()


@pytest.mark.parametrize("seconds", ["-5", "0"])
def test_a_demo_budget_not_above_zero_names_the_option(tmp_path, seconds, xinda,
                                                       one_line_error):
    """Before: -5 blamed the demo's own config file (train.max_seconds), and 0 was taken as
    train.max_seconds 0, no cap at all (found by review)."""
    proc = xinda("demo", "--workdir", tmp_path, "--seconds", seconds, ok=False)
    one_line_error(proc, f"--seconds must be > 0 (the demo's time cap), got {seconds}")
    assert not any(tmp_path.iterdir())


def test_a_missing_ensemble_member_is_named(tmp_path):
    """Before: "nope/manifest.json: not found — run xinda prepare first"."""
    from xinda.decode.translator import Translator
    from xinda.errors import XindaError

    (tmp_path / "config.yaml").write_text("")  # (the first model's folder passes the check)
    with pytest.raises(XindaError, match=r"nope: model directory not found$"):
        Translator.load(tmp_path, ensemble=[tmp_path / "nope"])


def test_prepared_data_given_as_a_model_is_named(trained, xinda, one_line_error):
    """Before: "data-bin/config.yaml: config file not found"."""
    proc = xinda("translate", trained.prepared.data_dir, input="five\n", ok=False)
    one_line_error(proc, f"{trained.prepared.data_dir}: not a trained model directory (prepared "
                         "data (manifest.json): give the model's folder, train.out_dir)")


def test_translate_names_the_weights_it_used(trained, xinda):
    proc = xinda("translate", trained.model_dir, input="five\n")
    assert f"sentences/s) with {trained.model_dir / 'best.safetensors'}" in proc.stderr
