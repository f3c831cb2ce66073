"""Decoding controls through ``xinda translate`` and the Translator on the tiny trained model:
forced prefixes, sampling, bans, n-gram blocking, per-line failures and bad values."""

from __future__ import annotations

import re

import pytest

from xinda.config import DecodeConfig
from xinda.decode.constraints import ExactLength, TargetPrefix
from xinda.decode.sampling import SamplingConfig
from xinda.decode.translator import UNSATISFIABLE, Translator
from xinda.utils import read_lines

NBEST_LINE = re.compile(r"^(\d+) \|\|\| (.*) \|\|\| (-?\d+\.\d{4})$")
PREFIXES = ["9", "", "12", "5", "", "70"]  # input 3 (0-based) is empty: no output has its prefix


@pytest.fixture(scope="module")
def files(trained, tmp_path_factory):
    """in.txt: 6 test sentences (line 3 empty) and prefix.txt: PREFIXES."""
    src = list(read_lines(trained.prepared.raw["test"] + ".words"))[:6]
    src[3] = ""
    folder = tmp_path_factory.mktemp("decoding")
    (folder / "in.txt").write_text("".join(f"{s}\n" for s in src), encoding="utf-8")
    (folder / "prefix.txt").write_text("".join(f"{p}\n" for p in PREFIXES), encoding="utf-8")
    return folder, src


def translate(xinda, trained, folder, *args: str, ok: bool = True):
    return xinda("translate", trained.model_dir, "-i", folder / "in.txt", "--threads", "1",
                 *args, ok=ok)


def test_prefix_starts_every_output(trained, files, xinda):
    folder, src = files
    plain = translate(xinda, trained, folder).stdout.splitlines()
    forced = translate(xinda, trained, folder, "--prefix", folder / "prefix.txt").stdout
    forced = forced.splitlines()
    assert len(forced) == len(src)
    for line, prefix, out, free in zip(src, PREFIXES, forced, plain):
        if not line:
            assert out == ""
        elif prefix:
            assert out.startswith(prefix), (prefix, out)
        else:
            assert out == free


def test_sampling_is_seeded_and_written_like_nbest(trained, files, xinda):
    folder, src = files
    args = ("--sampling", "--samples", "3", "--temperature", "2.0", "--top-p", "0.95")
    first = translate(xinda, trained, folder, *args, "--seed", "5").stdout.splitlines()
    again = translate(xinda, trained, folder, *args, "--seed", "5").stdout.splitlines()
    other = translate(xinda, trained, folder, *args, "--seed", "6").stdout.splitlines()
    assert first == again and first != other
    assert len(first) == 3 * len(src)
    parsed = [NBEST_LINE.match(line) for line in first]
    assert all(parsed), first
    assert [int(m.group(1)) for m in parsed] == [i for i in range(len(src)) for _ in range(3)]
    for i in range(len(src)):
        scores = [float(m.group(3)) for m in parsed[3 * i:3 * i + 3]]
        assert scores == sorted(scores, reverse=True)


def test_sampling_top_k_one_equals_greedy(trained, files, xinda):
    folder, _ = files
    greedy = translate(xinda, trained, folder, "--beam", "1").stdout
    assert translate(xinda, trained, folder, "--sampling", "--top-k", "1").stdout == greedy


def test_stopping_at_the_best_ended_never_scores_above_the_full_beam(trained, files, xinda):
    """--stop best ends a search earlier than --stop beam on the same path, so its best
    hypothesis is one the full search also finished: never a higher score."""
    folder, src = files
    scored = {stop: [line.split("\t") for line in translate(
        xinda, trained, folder, "--beam", "4", "--scores", "--stop", stop).stdout.splitlines()]
        for stop in ("beam", "best")}
    assert len(scored["best"]) == len(src)
    for (full, _), (early, _) in zip(scored["beam"], scored["best"]):
        assert float(early) <= float(full) + 1e-4


def test_bans_and_ngram_blocking_hold(trained, files, xinda):
    folder, src = files
    out = translate(xinda, trained, folder, "--output-format", "pieces", "--ban", "1, 2",
                    "--no-repeat-ngram", "1", "--ban-source-copy").stdout.splitlines()
    assert len(out) == len(src)
    source_pieces = Translator.load(trained.model_dir).translate(src)
    for line, result in zip(out, source_pieces):
        pieces = line.split()
        assert not {"1", "2"} & set(pieces), line
        assert len(pieces) == len(set(pieces)), line
        # every source word piece, not the bare "▁" (it starts any word spelled in parts)
        assert not (set(result[0].source_pieces) - {"\u2581"}) & set(pieces), line


def test_unsatisfiable_line_is_an_empty_line_and_a_warning(trained, files, xinda):
    """Prefixes "12" and "70" are three pieces ("▁", "1", "2"): an exact length of 2 cannot
    hold them; "9" is two and is the whole output. The empty line 4 cannot have its two
    pieces either (an empty input has no output at all)."""
    folder, src = files
    proc = translate(xinda, trained, folder, "--prefix", folder / "prefix.txt",
                     "--exact-length", "2")
    out = proc.stdout.splitlines()
    assert len(out) == len(src)
    assert out[0] == "9" and out[2] == out[5] == ""
    assert out[1] and out[4]
    warnings = [line for line in proc.stderr.splitlines() if UNSATISFIABLE in line]
    # named as the couplet and poem commands name theirs (before: without "xinda: warning:")
    assert warnings == [f"xinda: warning: line {n}: {UNSATISFIABLE}" for n in (3, 4, 6)]
    scored = translate(xinda, trained, folder, "--prefix", folder / "prefix.txt",
                       "--exact-length", "2", "--scores").stdout.splitlines()
    # a score column on every line (before: a bare empty line, without the tab)
    assert [scored[i] for i in (2, 3, 5)] == ["-inf\t"] * 3
    assert [row.split("\t")[1] for row in scored] == out


@pytest.mark.parametrize(("args", "fragments"), [
    (("--sampling", "--top-p", "1.5"), ("decode.top_p", "less than or equal to 1")),
    (("--sampling", "--temperature", "0"), ("decode.temperature", "greater than 0")),
    (("--top-k", "3"), ("need --sampling",)),
    (("--set", "decode.temperature=0.5", "--set", "decode.top_k=3"),
     ("--set decode.temperature, decode.top_k: sampling settings", "add --sampling")),
    (("--ban", "7,seven hundred"), ("cannot ban 'seven hundred'",)),
    (("--no-repeat-ngram", "-1"), ("must be >= 0",)),
    (("--threads", "-1"), ("--threads must be 0 (torch's default) to 1024, got -1",)),
    (("--threads", "50000"), ("got 50000",)),  # before: a segfault
    # before: torch's list of its twenty device types
    (("--device", "gpu"), ("--device gpu: not a device name; use cpu, cuda or cuda:N",)),
    (("--device", "meta"), ("--device meta: not available here (xinda runs on cpu, cuda",)),
    (("--device", "cpu:3"), ("--device cpu:3: not available",)),  # before: tracebacks
    (("--sampling", "--nbest", "3"), ("--nbest: beam-search options", "--samples")),
    (("--sampling", "--beam", "7", "--stop", "best"), ("--beam, --stop: beam-search",)),
    (("--set", "decode.sampling=true", "--nbest", "3", "--beam", "4"),
     ("--beam, --nbest: beam-search options",)),  # before: silently ignored
    (("--sampling", "--set", "decode.nbest=3"), ("decode.nbest: beam-search options",)),
    (("--set", "train.lr=1"), ("--set train.lr=1: translate takes decode.KEY=VALUE",)),
    (("--set", "decode=3"), ("--set decode=", "name a setting")),
    (("--set", "decode.beams=3"), ("decode.beams", "Extra inputs")),
    (("--set", "decode.max_input_len=0"), ("decode.max_input_len", "greater than or equal")),
    # before: tracebacks (int64 overflows, allocations of many GB)
    (("--max-len-b", "99999999999999999999"), ("decode.max_len_b", "less than or equal")),
    (("--beam", "100000000"), ("decode.beam", "less than or equal to 1000")),
    (("--sampling", "--samples", "100000000"), ("decode.samples", "less than or equal")),
    (("--exact-length", "99999999999999999999"), ("exact length 99999999999999999999",
                                                  "writes at most")),
    (("--ban", ","), ("--ban ',': no piece or word to ban",)),  # before: silently no ban
])
def test_bad_values_are_one_line_errors(args, fragments, trained, files, xinda, one_line_error):
    folder, _ = files
    one_line_error(translate(xinda, trained, folder, *args, ok=False), *fragments)


def test_set_reaches_any_decode_setting_and_the_options_win(trained, files, xinda):
    """decode.max_input_len has no option of its own: --set cuts the inputs to one token
    (the command says so); an explicit --beam beats --set decode.beam."""
    folder, src = files
    cut = translate(xinda, trained, folder, "--set", "decode.max_input_len=1")
    assert len(cut.stdout.splitlines()) == len(src)
    assert "5 inputs cut to decode.max_input_len=1 tokens" in cut.stderr
    table = Translator.load(trained.model_dir).source_limit(DecodeConfig(max_input_len=10**6))
    long_line = folder / "long.txt"
    long_line.write_text("1 " * (table + 5) + "\n", encoding="utf-8")
    cut = xinda("translate", trained.model_dir, "-i", long_line, "--threads", "1", "--beam", "1",
                "--max-len-a", "0", "--max-len-b", "2", "--set", "decode.max_input_len=100000")
    assert f"1 inputs cut to {table} (the model's position table) tokens" in cut.stderr
    greedy = translate(xinda, trained, folder, "--beam", "1", "--scores").stdout
    assert translate(xinda, trained, folder, "--set", "decode.beam=1", "--scores"
                     ).stdout == greedy
    assert translate(xinda, trained, folder, "--set", "decode.beam=3", "--scores"
                     ).stdout != greedy
    assert translate(xinda, trained, folder, "--set", "decode.beam=3", "--beam", "1",
                     "--scores").stdout == greedy


def test_prefix_file_of_another_length_is_a_one_line_error(trained, files, xinda,
                                                          one_line_error, tmp_path):
    folder, _ = files
    short = tmp_path / "short.txt"
    short.write_text("1\n2\n", encoding="utf-8")
    one_line_error(translate(xinda, trained, folder, "--prefix", short, ok=False),
                   "short.txt", "2 prefix lines for 6 input lines")
    # before: "-: 0 prefix lines for 2 input lines", stdin used up by the input already
    proc = xinda("translate", trained.model_dir, "--prefix", "-", input="a\nb\n", ok=False)
    one_line_error(proc, "--prefix and the input (-i) cannot both be read from stdin")
    proc = xinda("translate", trained.model_dir, "-i", "/dev/stdin", "--prefix", "-",
                 input="a\nb\n", ok=False)  # (before: "<stdin>: 0 prefix lines", by review)
    one_line_error(proc, "--prefix and the input (-i) cannot both be read from stdin")
    proc = xinda("translate", trained.model_dir, "-i", folder / "in.txt", "--prefix", "-",
                 input="1\n", ok=False)
    one_line_error(proc, "<stdin>: 1 prefix lines for 6 input lines")


def test_translator_constraints_see_the_callers_line_numbers(trained, files):
    """Lines are sorted by length and batched by 2, yet each line gets its own prefix; line 4
    cannot satisfy its constraints and says so."""
    _, src = files
    lines = [line for line in src if line]
    prefixes = [[], [], [], [], []]
    translator = Translator.load(trained.model_dir)
    for i in range(len(lines)):
        prefixes[i] = translator.encode_target(str(i + 1) * 2)
    results = translator.translate(lines, batch_size=2, constraints=[
        TargetPrefix(prefixes), ExactLength([None, None, None, None, 0])])
    for i, nbest in enumerate(results[:4]):
        assert nbest[0].text.startswith(str(i + 1) * 2) and nbest[0].error is None
    assert [(t.text, t.error) for t in results[4]] == [("", UNSATISFIABLE)]
    samples = translator.translate(lines + [""], batch_size=2, constraints=[
        TargetPrefix(prefixes + [[]])], sampler=SamplingConfig(n=2, seed=3))
    assert [len(s) for s in samples] == [2] * len(lines) + [2]
    for i, nbest in enumerate(samples[:4]):
        assert all(t.text.startswith(str(i + 1) * 2) for t in nbest)


def test_a_model_config_that_asks_for_sampling_samples(trained, files, xinda, tmp_path):
    """decode.sampling in the model's config.yaml does what --sampling does."""
    import shutil

    import yaml

    folder, _ = files
    model = tmp_path / "sampling-model"
    shutil.copytree(trained.model_dir, model)
    cfg = yaml.safe_load((model / "config.yaml").read_text(encoding="utf-8"))
    cfg["decode"].update(sampling=True, samples=2, seed=7, top_p=0.9)
    (model / "config.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    by_config = xinda("translate", model, "-i", folder / "in.txt", "--threads", "1").stdout
    by_options = translate(xinda, trained, folder, "--sampling", "--samples", "2", "--seed",
                           "7", "--top-p", "0.9").stdout
    assert by_config == by_options and " ||| " in by_config
    # --no-sampling turns the model's sampling off (before: ignored, so --beam was refused)
    beam = xinda("translate", model, "-i", folder / "in.txt", "--threads", "1",
                 "--no-sampling", "--beam", "3").stdout
    assert beam == translate(xinda, trained, folder, "--beam", "3").stdout


def test_int8_decoding_agrees_with_float32(trained, files):
    """``precision="int8"`` decodes with int8 linear layers; on the tiny model most outputs
    equal float32's and the float model itself is unchanged."""
    _, src = files
    translator = Translator.load(trained.model_dir)
    exact = translator.translate_text(src, beam=3)
    approx = translator.translate_text(src, beam=3, precision="int8")
    assert len(approx) == len(src) and approx[3] == ""
    assert sum(a == b for a, b in zip(exact, approx)) >= len(src) - 2
    assert translator.translate_text(src, beam=3) == exact


def test_int8_with_per_row_scales_decodes_each_line_as_if_alone(trained, files, xinda,
                                                                 one_line_error):
    """``--int8-scale row``: batches of one line and of six give the same outputs (the
    default "batch" scales quantise a line by its batch's range); without int8 the option is
    refused, not ignored."""
    folder, _ = files
    runs = [translate(xinda, trained, folder, "--precision", "int8", "--int8-scale", "row",
                      "--beam", "3", "--batch-size", size).stdout for size in ("1", "6")]
    assert runs[0] == runs[1] and len(runs[0].splitlines()) == 6
    proc = translate(xinda, trained, folder, "--int8-scale", "row", ok=False)
    one_line_error(proc, "--int8-scale: used only with --precision int8 (decode.precision is "
                         "fp32)")


def test_a_bad_model_section_names_the_model_s_config_file(trained, xinda, tmp_path):
    """Before: "model.bogus: Extra inputs are not permitted", without the file: with
    --ensemble, no way to tell which model directory was wrong (found by review)."""
    import shutil

    import yaml

    from xinda.errors import XindaError

    copy = shutil.copytree(trained.model_dir, tmp_path / "model")
    cfg = yaml.safe_load((copy / "config.yaml").read_text(encoding="utf-8"))
    cfg["model"]["bogus"] = 1
    (copy / "config.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    with pytest.raises(XindaError, match=f"^{re.escape(str(copy / 'config.yaml'))}: "
                                         "model.bogus: Extra inputs are not permitted"):
        Translator.load(trained.model_dir, ensemble=[copy])
    proc = xinda("grow", copy, "--to", "2", ok=False)
    assert proc.stderr.startswith(f"xinda: error: {copy / 'config.yaml'}: model.bogus"), \
        proc.stderr


def test_a_reader_that_stopped_ends_translate_quietly(trained, files, xinda_popen):
    """``xinda translate | head -1``: exit 141 as a shell tool killed by SIGPIPE, no message.
    Before: "xinda: error: stdout: cannot write the output: Broken pipe", exit 1."""
    import subprocess

    proc = xinda_popen("translate", trained.model_dir, "-i", files[0] / "in.txt", "--threads",
                       "1", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader is gone before the output comes
    try:
        assert proc.wait(timeout=120) == 141
        assert "error" not in proc.stderr.read()
    finally:
        proc.kill()


def test_evaluate_reads_hypotheses_from_stdin(trained, files, xinda, tmp_path):
    """``xinda translate ... | xinda evaluate - REF`` (before: "-: file not found")."""
    folder, _ = files
    output = translate(xinda, trained, folder).stdout
    (tmp_path / "ref.txt").write_text(output, encoding="utf-8")
    scores = xinda("evaluate", "-", tmp_path / "ref.txt", "--metrics", "chrf", input=output)
    assert scores.stdout.startswith("chrF2 = 100.00 ")
    short = xinda("evaluate", "-", tmp_path / "ref.txt", input="x\n", ok=False)
    assert short.stderr.strip().endswith("<stdin> has 1 lines but "
                                         f"{tmp_path / 'ref.txt'} has 6; hypotheses and "
                                         "references must be line-parallel")


def test_a_bad_pieces_input_line_names_its_file(trained, xinda, one_line_error, tmp_path):
    """Before: "line 2: '<pad>' is the padding piece...", which file not said."""
    (tmp_path / "pieces.txt").write_text("▁four\n<pad> ▁five\n", encoding="utf-8")
    proc = xinda("translate", trained.model_dir, "-i", tmp_path / "pieces.txt",
                 "--input-format", "pieces", "--threads", "1", ok=False)
    one_line_error(proc, f"{tmp_path / 'pieces.txt'}:2: '<pad>' is the padding piece")
