"""``xinda translate MODEL --ensemble OTHER``: same vocabularies required, copies change
nothing."""

from __future__ import annotations

import json
import shutil

from xinda.data.manifest import load_manifest


def test_an_ensemble_of_copies_translates_like_the_model(trained, xinda, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(trained.model_dir, copy)
    lines = "five hundred\nseventy-one thousand two\n\nnine\n"
    alone = xinda("translate", trained.model_dir, "--scores", "--threads", "1", input=lines)
    both = xinda("translate", trained.model_dir, "--ensemble", copy, "--scores", "--threads",
                 "1", input=lines)
    texts = [row.split("\t")[1] for row in alone.stdout.splitlines()]
    assert [row.split("\t")[1] for row in both.stdout.splitlines()] == texts
    assert [float(row.split("\t")[0]) for row in both.stdout.splitlines()] == \
        [float(row.split("\t")[0]) for row in alone.stdout.splitlines()]


def test_models_with_other_vocabularies_are_refused(trained, prepared, xinda, one_line_error,
                                                    tmp_path, write_config):
    other_data = tmp_path / "bin"
    config = write_config(tmp_path / "c.yaml", prepared.raw, other_data, tmp_path / "m",
                          data={"vocab_size": 45})
    xinda("prepare", config)
    copy = tmp_path / "copy"
    shutil.copytree(trained.model_dir, copy)
    spm = load_manifest(copy)["spm"]["tgt"]
    shutil.copyfile(other_data / spm, copy / spm)  # same file name, another vocabulary
    manifest = load_manifest(copy)  # ... recorded as the one it was made with
    manifest["vocab_sizes"] = load_manifest(other_data)["vocab_sizes"]
    (copy / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    proc = xinda("translate", trained.model_dir, "--ensemble", copy, input="five\n", ok=False)
    one_line_error(proc, f"--ensemble {copy}", "vocabulary", "differs")
