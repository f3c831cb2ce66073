"""prepare -> train -> translate -> evaluate -> average through the real ``xinda`` command."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from xinda.checkpoint import default_weights, list_checkpoints
from xinda.decode.translator import Translator
from xinda.utils import read_lines

LONG_WORDS = 2000
NBEST_LINE = re.compile(r"^(\d+) \|\|\| (.*) \|\|\| (-?\d+\.\d{4})$")


@pytest.fixture(scope="module")
def inputs(trained, tmp_path_factory):
    """in.txt: 12 test sentences with an empty line at 3 and a 2000-word line at 7, plus refs."""
    raw = trained.prepared.raw
    src = list(read_lines(raw["test"] + ".words"))[:12]
    ref = list(read_lines(raw["test"] + ".digits"))[:12]
    long_line = " ".join(["seven hundred twenty-one thousand"] * (LONG_WORDS // 4))
    assert len(long_line.split()) == LONG_WORDS
    src[3], ref[3] = "", ""
    src[7], ref[7] = long_line, "721721721"
    folder = tmp_path_factory.mktemp("translate")
    (folder / "in.txt").write_text("".join(f"{s}\n" for s in src), encoding="utf-8")
    (folder / "ref.txt").write_text("".join(f"{r}\n" for r in ref), encoding="utf-8")
    return folder, src, ref


@pytest.fixture(scope="module")
def translated(trained, inputs, xinda):
    """``xinda translate MODEL -i in.txt -o out.txt`` (beam 5 from the model's config)."""
    folder = inputs[0]
    proc = xinda("translate", trained.model_dir, "-i", folder / "in.txt",
                 "-o", folder / "out.txt", "--threads", "1")
    return proc, list(read_lines(folder / "out.txt"))


def test_prepare_writes_a_complete_data_dir(prepared):
    assert "prepared" in prepared.result.stdout
    manifest = json.loads((prepared.data_dir / "manifest.json").read_text(encoding="utf-8"))
    assert set(manifest["splits"]) == {"train", "valid", "test"}
    assert manifest["splits"]["valid"]["pairs"] == 20  # valid/test are never filtered
    assert manifest["splits"]["test"]["pairs"] == 20
    assert 0 < manifest["splits"]["train"]["pairs"] <= 300
    assert (prepared.data_dir / manifest["spm"]["src"]).is_file()
    for split in ("train", "valid", "test"):
        for side in ("src", "tgt"):
            assert (prepared.data_dir / f"{split}.{side}.ids.npy").is_file()


def test_train_writes_a_self_contained_model_dir(trained, inputs, translated):
    model = trained.model_dir
    steps = trained.steps  # train.max_steps of the fixture's `xinda train`
    assert f"trained {steps} updates" in trained.result.stdout
    # (max_seconds counts validation and checkpoints too: before, only the updates' time)
    assert re.search(r"\d+ s of updates, \d+ s with validation and checkpoints\) -> ",
                     trained.result.stdout)
    for name in ("config.yaml", "manifest.json", "spm.model", "log.csv", "curves.png",
                 "train_stats.json", "best.safetensors"):
        assert (model / name).is_file(), name
    ckpts = list_checkpoints(model)
    assert ckpts and ckpts[-1].name == f"step_{steps:07d}.safetensors"
    assert len(ckpts) <= 3  # keep_last
    stats = json.loads((model / "train_stats.json").read_text(encoding="utf-8"))
    assert stats["steps"] == steps
    assert stats["epochs_done"] >= 2
    assert stats["parameters"] > 0
    assert (model / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # self-contained: with the data directory gone, the model directory still translates, and
    # exactly as `xinda translate` did with it (same model and settings: the model's config,
    # beam 5, inputs over 40 tokens truncated), line for line
    _, src, _ = inputs
    _, out = translated
    data_copy = trained.prepared.root / "data-bin-moved"
    shutil.move(trained.prepared.data_dir, data_copy)
    try:
        assert not trained.prepared.data_dir.exists()
        assert Translator.load(model).translate_text(src) == out
    finally:
        shutil.move(data_copy, trained.prepared.data_dir)


def test_translate_keeps_line_count_empty_lines_and_truncates(inputs, translated):
    _, src, _ = inputs
    proc, out = translated
    assert len(out) == len(src)
    assert out[3] == ""
    assert sum(map(bool, out)) >= len(out) // 2, f"mostly empty translations: {out}"
    assert "truncated to 40" in proc.stderr  # decode.max_input_len of the model's config
    assert "inputs cut to decode.max_input_len=40 tokens" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"translated {len(src)} sentences" in proc.stderr


def test_translate_output_order_follows_input_order(trained, inputs, translated, xinda, tmp_path):
    _, src, _ = inputs
    _, out = translated
    (tmp_path / "rev.txt").write_text("".join(f"{s}\n" for s in reversed(src)), encoding="utf-8")
    xinda("translate", trained.model_dir, "-i", tmp_path / "rev.txt", "-o", tmp_path / "rev.out",
          "--threads", "1")
    assert list(reversed(list(read_lines(tmp_path / "rev.out")))) == out


def test_translate_stdin_to_stdout_with_scores(trained, inputs, translated, xinda):
    folder, _, _ = inputs
    _, out = translated
    proc = xinda("translate", trained.model_dir, "--threads", "1", "--scores",
                 input=(folder / "in.txt").read_text(encoding="utf-8"))
    assert proc.stdout.endswith("\n")
    rows = [line.split("\t", 1) for line in proc.stdout[:-1].split("\n")]
    assert [text for _, text in rows] == out  # same lines as -i/-o, in the same order
    scores = [float(score) for score, _ in rows]
    # the empty line is passed through (score 0); every other line, the 2000-word one
    # included, was really decoded (a log-probability < 0)
    assert scores[3] == 0.0
    assert all(score < 0 for i, score in enumerate(scores) if i != 3), scores


def test_translate_zero_lines(trained, xinda, tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    xinda("translate", trained.model_dir, "-i", tmp_path / "empty.txt", "-o", tmp_path / "o.txt")
    assert (tmp_path / "o.txt").read_bytes() == b""
    assert xinda("translate", trained.model_dir, "-i", "/dev/null").stdout == ""


def test_translate_nbest(trained, inputs, xinda):
    _, src, _ = inputs
    lines = [s for i, s in enumerate(src) if i not in (3, 7)][:5]
    proc = xinda("translate", trained.model_dir, "--nbest", "3", "--threads", "1",
                 input="".join(f"{s}\n" for s in lines))
    rows = proc.stdout.splitlines()
    assert len(rows) == 3 * len(lines)
    parsed = []
    for row in rows:
        match = NBEST_LINE.match(row)
        assert match, f"not 'i ||| text ||| score': {row!r}"
        parsed.append((int(match[1]), match[2], float(match[3])))
    assert [i for i, _, _ in parsed] == [i for i in range(len(lines)) for _ in range(3)]
    for i in range(len(lines)):
        scores = [s for j, _, s in parsed if j == i]
        assert scores == sorted(scores, reverse=True), scores
        assert all(score < 0 for score in scores)


def test_evaluate_prints_scores_with_signatures(inputs, translated, xinda):
    folder, src, _ = inputs
    proc = xinda("evaluate", folder / "out.txt", folder / "ref.txt",
                 "--source", folder / "in.txt", "--by-length")
    lines = proc.stdout.splitlines()
    assert re.fullmatch(r"BLEU = \d+\.\d\d \(nrefs:1\|.*\|version:[\d.]+\)", lines[0]), lines
    assert re.fullmatch(r"chrF2 = \d+\.\d\d \(nrefs:1\|.*\|version:[\d.]+\)", lines[1]), lines
    assert re.fullmatch(r"TER = \d+\.\d\d \(nrefs:1\|.*\|version:[\d.]+\)", lines[2]), lines
    table = lines[3:]
    assert table[0].split() == ["length", "(words)", "sentences", "BLEU"]
    buckets = [row.split()[:2] for row in table[1:] if row.strip()]
    assert sum(int(n) for _, n in buckets) == len(src)
    assert buckets[0] == ["0", "1"]  # the empty source line
    assert buckets[-1][1] == "1" and buckets[-1][0].endswith("+")  # the 2000-word line
    # a perfect hypothesis file scores 100 / 100 / 0 (the word side: digit refs are one token,
    # too short for 4-gram BLEU)
    perfect = xinda("evaluate", folder / "in.txt", folder / "in.txt").stdout.splitlines()
    assert perfect[0].startswith("BLEU = 100.00 (")
    assert perfect[1].startswith("chrF2 = 100.00 (")
    assert perfect[2].startswith("TER = 0.00 (")


def test_average_last_two_and_translator_uses_it(trained, xinda, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(trained.model_dir, model)
    last_two = list_checkpoints(model)[-2:]
    proc = xinda("average", model, "--last", "2")
    assert "averaged 2 checkpoint(s) (" in proc.stdout and "asked" not in proc.stdout
    count = len(list_checkpoints(model))  # (before: "averaged 1 checkpoints", not a word more)
    more = xinda("average", model, "--last", str(count + 3),
                 "-o", tmp_path / "averaged-all.safetensors")
    assert f"averaged {count} checkpoint(s) (" in more.stdout
    assert f", of the {count + 3} asked: no more in {model})" in more.stdout
    averaged = model / "averaged.safetensors"
    assert averaged.is_file()
    a, b = (load_file(str(p)) for p in last_two)
    avg = load_file(str(averaged))
    assert set(avg) == set(a)
    for name, tensor in avg.items():
        torch.testing.assert_close(tensor, (a[name].double() + b[name].double()).div(2).float())
    assert default_weights(model) == averaged
    translator = Translator.load(model)
    state = translator.model.state_dict()
    for name, tensor in avg.items():
        assert torch.equal(state[name], tensor), name
    assert any(not torch.equal(avg[n], b[n]) for n in avg)  # really differs from the newest


def test_models_lists_presets_with_parameter_counts(xinda):
    out = xinda("models").stdout
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:] if line.strip()}
    for preset in ("transformer-base", "transformer-big", "transformer-deep", "transformer-tiny"):
        assert preset in rows, out
    params = {name: int(row[2].replace(",", "")) for name, row in rows.items()}
    assert params["transformer-tiny"] < params["transformer-base"] < params["transformer-big"]
    assert 40_000_000 < params["transformer-base"] < 80_000_000  # ~60M with a 32k joint vocab
    # counted on the meta device: as many as a built model has
    from xinda.data.vocab import VocabInfo
    from xinda.models.registry import build_model, list_presets
    for name in ("rnn-luong-local-p", "transformer-dlcl"):
        cfg = next(cfg for preset, _, cfg in list_presets() if preset == name)
        built = build_model(cfg, VocabInfo(32000, 32000, 0, 2, 3, True))
        assert params[name] == built.num_parameters()


def test_python_api(trained, inputs):
    _, src, _ = inputs
    translator = Translator.load(trained.model_dir)
    out = translator.translate_text([src[0], "", src[1]], beam=5)
    assert isinstance(out, list) and len(out) == 3
    assert all(isinstance(t, str) for t in out)
    assert out[1] == ""
    results = translator.translate([src[0], ""], beam=4, nbest=2)
    assert len(results[0]) == 2 and 0 > results[0][0].score >= results[0][1].score
    assert results[0][0].source_pieces  # the source really went through sentencepiece
    assert [(t.text, t.score) for t in results[1]] == [("", 0.0)] * 2  # n-best of an empty line


def test_set_unknown_key_is_a_one_line_error(prepared, xinda, one_line_error, tmp_path):
    proc = xinda("train", prepared.config, "--set", "train.no_such_key=1",
                 "--set", f"train.out_dir={tmp_path / 'never'}", ok=False)
    one_line_error(proc, "train.no_such_key")
    assert not (tmp_path / "never").exists()


def test_set_without_value_is_a_one_line_error(prepared, xinda, one_line_error):
    one_line_error(xinda("prepare", prepared.config, "--set", "data.vocab_size", ok=False),
                   "data.vocab_size", "KEY=VALUE")


def test_model_dir_config_round_trips(trained):
    """The saved config.yaml reproduces the run's settings (incl. the --set override)."""
    from xinda.config import load_config

    cfg = load_config(Path(trained.model_dir) / "config.yaml")
    assert cfg.train.max_steps == trained.steps
    assert cfg.model["d_model"] == 32 and cfg.decode.max_input_len == 40
