"""``xinda export ctranslate2``: the exported model decodes like xinda (greedy outputs equal,
token log-probabilities within 1e-4), models CTranslate2 cannot represent are refused in one
line, and a missing ``ctranslate2`` package is a clear error.

Two tiny number-words -> digits Transformers are trained in-process (150 updates, a few
seconds each): the peer benchmark's kind (pre-norm, tied embeddings, one sentencepiece model
made elsewhere with sentencepiece's default ids and no pad piece, so xinda appends pad after
the pieces), and post-norm with GELU, separate vocabularies and an untied output layer.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import sentencepiece as spm
import torch
import yaml
from subprocesses import subprocess_env, xinda_command
from typer.testing import CliRunner

from xinda.cli import app
from xinda.config import ExperimentConfig
from xinda.data.manifest import load_manifest
from xinda.data.prepare import prepare
from xinda.decode.translator import Translator
from xinda.demo.numbers import write_demo_corpus
from xinda.errors import XindaError
from xinda.export.ctranslate2 import INSTALL_HINT, export_ctranslate2, vocabulary_tokens
from xinda.train.trainer import Trainer
from xinda.utils import read_lines

needs_ct2 = pytest.mark.skipif(importlib.util.find_spec("ctranslate2") is None,
                               reason="ctranslate2 is not installed (pip install "
                                      "'xinda[export]')")
MAX_LEN = 20  # xinda's output limit incl. EOS (max_len_a 0, max_len_b 20)
VARIANTS = {  # model fields, data fields (with "spm_model": True for a bench-like spm model)
    "pre-norm-tied-bench-spm": ({"norm": "pre", "encoder_layers": 2}, {"spm_model": True}),
    "post-norm-gelu-untied-split": ({"norm": "post", "activation": "gelu", "tie_output": False},
                                    {"joint_vocab": False}),
}


def bench_like_spm(raw: dict[str, str], out: Path) -> str:
    """A joint BPE model with sentencepiece's default ids (<unk> 0, <s> 1, </s> 2, no pad),
    as ../shared/bench makes it; returns its path."""
    spm.SentencePieceTrainer.train(
        input=f"{raw['train']}.words,{raw['train']}.digits", model_prefix=str(out),
        vocab_size=60, model_type="bpe", character_coverage=1.0, minloglevel=2)
    return f"{out}.model"


def train_numbers(root: Path, model: dict, data: dict) -> Path:
    """Prepare the number task and train a tiny Transformer for 150 updates; its model dir."""
    raw = write_demo_corpus(root / "raw", {"train": 300, "test": 12})
    if data.get("spm_model"):
        data = {**data, "spm_model": bench_like_spm(raw, root / "bench-spm")}
    cfg = ExperimentConfig.model_validate({
        "data": {"out_dir": str(root / "bin"), "src_lang": "words", "tgt_lang": "digits",
                 "train": raw["train"], "test": {"test": raw["test"]}, "vocab_size": 60,
                 "normalize": "none", **data},
        "model": {"arch": "transformer", "d_model": 32, "heads": 2, "ffn_dim": 64,
                  "encoder_layers": 1, "decoder_layers": 1, "dropout": 0.0, **model},
        "train": {"out_dir": str(root / "model"), "progress": False, "device": "cpu",
                  "precision": "fp32", "max_steps": 150, "max_tokens": 500, "lr": 3e-3,
                  "warmup_steps": 20, "run_validation": False, "threads": 1},
        "decode": {"max_len_a": 0.0, "max_len_b": MAX_LEN}})
    prepare(cfg.data, log=lambda _: None)
    with warnings.catch_warnings():  # training without validation plots an empty legend
        warnings.filterwarnings("ignore", "No artists with labels")
        Trainer(cfg).train()
    return root / "model"


@pytest.fixture(scope="module", params=list(VARIANTS))
def exported(request, tmp_path_factory) -> tuple[Translator, Path, list[list[str]]]:
    """(xinda translator, exported CTranslate2 directory, test sources as pieces)."""
    root = tmp_path_factory.mktemp(request.param)
    model_dir = train_numbers(root, *VARIANTS[request.param])
    translator = Translator.load(model_dir)
    sources = [translator.src_vocab.encode_pieces(line)
               for line in read_lines(root / "raw" / "test.words")]
    return translator, export_ctranslate2(model_dir, root / "ct2"), sources


def ct2_translator(path: Path):
    import ctranslate2

    return ctranslate2.Translator(str(path), device="cpu", intra_threads=1, inter_threads=1)


@needs_ct2
def test_greedy_outputs_equal_xinda(exported):
    translator, ct2_dir, sources = exported
    ours = translator.translate([" ".join(s) for s in sources], beam=1, input_format="pieces",
                                output_format="pieces")
    # CTranslate2's limit counts tokens before EOS; xinda's includes the EOS
    theirs = ct2_translator(ct2_dir).translate_batch(sources, beam_size=1, min_decoding_length=0,
                                                     max_decoding_length=MAX_LEN - 1)
    expected = [nbest[0].text for nbest in ours]
    assert [" ".join(r.hypotheses[0]) for r in theirs] == expected
    assert len(set(expected)) > len(expected) // 2, "the test model should say different things"


def xinda_log_probs(translator: Translator, source: list[str], target: list[str]) -> torch.Tensor:
    """Teacher-forced log P(target + EOS | source) per token, pad and BOS left out of the
    softmax (as xinda's search never picks them and the export bans them)."""
    model, vocab = translator.model, translator.model.vocab
    src = translator.src_vocab.pieces_to_ids(source) + [translator.src_vocab.eos]
    tgt = translator.tgt_vocab.pieces_to_ids(target)
    with torch.no_grad():
        logits = model(torch.tensor([src]), torch.tensor([[vocab.bos, *tgt]]))[0]
    logits[:, [vocab.pad, vocab.bos]] = float("-inf")
    return logits.log_softmax(-1).gather(1, torch.tensor([*tgt, vocab.eos])[:, None])[:, 0]


@needs_ct2
def test_token_log_probs_match_xinda(exported):
    translator, ct2_dir, sources = exported
    targets = [translator.tgt_vocab.encode_pieces(line)
               for line in read_lines(ct2_dir.parent / "raw" / "test.digits")]
    results = ct2_translator(ct2_dir).score_batch(sources, targets)
    for source, target, result in zip(sources, targets, results):
        assert result.tokens == [*target, "</s>"]
        expected = xinda_log_probs(translator, source, target)
        assert torch.tensor(result.log_probs) == pytest.approx(expected, abs=1e-4)


@needs_ct2
def test_cli_exports_and_refuses_to_overwrite(exported, tmp_path):
    _, ct2_dir, sources = exported
    model_dir, out = ct2_dir.parent / "model", tmp_path / "cli-ct2"
    runner = CliRunner()
    result = runner.invoke(app, ["export", "ctranslate2", str(model_dir), str(out)])
    assert result.exit_code == 0, result.output
    assert f"-> {out}" in result.output
    spm = set(load_manifest(model_dir)["spm"].values())
    assert {p.name for p in out.iterdir()} >= {"model.bin", "config.json", *spm}
    assert ct2_translator(out).translate_batch(sources[:1], beam_size=1)[0].hypotheses
    with pytest.raises(XindaError, match="already exists"):
        export_ctranslate2(model_dir, out)
    with pytest.raises(XindaError, match="may not hold"):
        export_ctranslate2(model_dir, model_dir.parent, force=True)
    weights = sorted((model_dir / "checkpoints").glob("step_*.safetensors"))
    for inside in (model_dir / "checkpoints", model_dir):  # before: checkpoints deleted
        with pytest.raises(XindaError, match="may not hold"):
            export_ctranslate2(model_dir, inside, force=True)
    assert sorted((model_dir / "checkpoints").glob("step_*.safetensors")) == weights
    outside = tmp_path / "weights" / "w.safetensors"
    outside.parent.mkdir()
    outside.write_bytes(weights[-1].read_bytes())
    with pytest.raises(XindaError, match="may not hold .*w.safetensors"):
        export_ctranslate2(model_dir, outside.parent, checkpoint=outside, force=True)
    assert outside.exists()
    assert export_ctranslate2(model_dir, out, force=True) == out  # replaced
    assert ct2_translator(out).translate_batch(sources[:1], beam_size=1)[0].hypotheses
    (tmp_path / "file").write_text("kept")  # before: tracebacks, after the conversion
    with pytest.raises(XindaError, match="file: not a folder"):
        export_ctranslate2(model_dir, tmp_path / "file", force=True)
    with pytest.raises(XindaError, match="cannot write"):
        export_ctranslate2(model_dir, tmp_path / "file" / "sub")
    assert (tmp_path / "file").read_text() == "kept"


@needs_ct2
def test_export_to_the_current_folder_replaces_it_whole(exported, tmp_path, monkeypatch):
    """Before: '.' put the temporary folder inside the output, deleted both, then failed."""
    _, ct2_dir, sources = exported
    here = tmp_path / "here"
    shutil.copytree(ct2_dir, here)  # an earlier export, which --force replaces
    (here / "old.model").write_text("replaced")
    monkeypatch.chdir(here)
    assert export_ctranslate2(ct2_dir.parent / "model", Path("."), force=True) == Path(".")
    assert not (here / "old.model").exists() and (here / "model.bin").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".here.")]
    assert ct2_translator(here).translate_batch(sources[:1], beam_size=1)[0].hypotheses


def folder_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@needs_ct2
def test_force_replaces_an_earlier_export_or_an_empty_folder_only(exported, tmp_path):
    """Before: --force deleted any folder but the model's own: another trained model
    (checkpoints and all), a prepared data folder."""
    _, ct2_dir, sources = exported
    model_dir = ct2_dir.parent / "model"
    other_model = shutil.copytree(model_dir, tmp_path / "other-model")
    for folder, holds in ((other_model, "checkpoints"),
                          (ct2_dir.parent / "bin", "filtered-train.tsv")):  # (first by name)
        before = folder_files(folder)
        with pytest.raises(XindaError, match=re.escape(
                f"{folder}: not an earlier CTranslate2 export (it holds {holds})")):
            export_ctranslate2(model_dir, folder, force=True)
        assert folder_files(folder) == before
    (tmp_path / "empty").mkdir()
    assert export_ctranslate2(model_dir, tmp_path / "empty", force=True) == tmp_path / "empty"
    assert export_ctranslate2(model_dir, tmp_path / "empty", force=True)  # an earlier export
    assert ct2_translator(tmp_path / "empty").translate_batch(sources[:1], beam_size=1)


NOT_EXPORTS = {  # files of folders --force must not replace -> what the refusal names
    "trained-model": ({"config.yaml": "model: {}", "checkpoints/step_10.safetensors": "w"},
                      "it holds checkpoints"),
    "prepared-data": ({"manifest.json": "{}", "spm.model": "m", "train.src.npy": "x"},
                      "it holds manifest.json"),
    "user-folder": ({"sub/notes.txt": "mine"}, "it holds sub"),
    "export-and-notes": ({"model.bin": "b", "config.json": "{}", "notes.txt": "mine"},
                         "it holds notes.txt"),
    "no-model-bin": ({"config.json": "{}", "shared_vocabulary.json": "[]"},
                     "it has no model.bin"),
}


@pytest.mark.parametrize("kind", list(NOT_EXPORTS))
@pytest.mark.parametrize("force", [True, False], ids=["force", "no-force"])
def test_force_refuses_a_folder_that_is_not_an_earlier_export(tmp_path, kind, force):
    """Before: --force replaced any such folder with the CTranslate2 files."""
    files, why = NOT_EXPORTS[kind]
    model_dir, out = tmp_path / "model", tmp_path / kind
    model_dir.mkdir()
    (model_dir / "config.yaml").write_text("model: {preset: transformer-tiny}\n",
                                           encoding="utf-8")
    for name, text in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text, encoding="utf-8")
    with pytest.raises(XindaError) as err:
        export_ctranslate2(model_dir, out, force=force)
    assert str(err.value) == (f"{out}: not an earlier CTranslate2 export ({why}): --force "
                              "replaces only such a folder; choose another one, or an empty one")
    assert folder_files(out) == {name: text.encode() for name, text in files.items()}


def test_a_folder_force_would_not_replace_is_one_line_on_the_command_line(tmp_path):
    model_dir, out = tmp_path / "model", tmp_path / "mine"
    model_dir.mkdir()
    (model_dir / "config.yaml").write_text("model: {preset: transformer-tiny}\n",
                                           encoding="utf-8")
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "notes.txt").write_text("mine", encoding="utf-8")
    proc = subprocess.run([*xinda_command(), "export", "ctranslate2", str(model_dir), str(out),
                           "--force"], capture_output=True, text=True, env=subprocess_env(),
                          timeout=120, check=False)
    assert proc.returncode == 1
    expected = (f"xinda: error: {out}: not an earlier CTranslate2 export (it holds sub): "
                "--force replaces only such a folder; choose another one, or an empty one")
    assert proc.stderr.strip().splitlines() == [expected]
    assert (out / "sub" / "notes.txt").read_text(encoding="utf-8") == "mine"


@pytest.mark.parametrize(("model", "fragment"), [
    ({"arch": "rnn"}, "only Transformer models are supported, this is a 'rnn' model"),
    ({"preset": "transformer-tiny", "dense": "encoder"}, "DLCL (model.dense: encoder)"),
    ({"preset": "transformer-tiny", "fusion": "layer", "fusion_side": "both"},
     "information fusion (model.fusion: layer)"),
])
def test_models_ctranslate2_cannot_represent_are_refused(tmp_path, model, fragment):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.yaml").write_text(yaml.safe_dump({"model": model}), encoding="utf-8")
    with pytest.raises(XindaError, match="cannot export to CTranslate2") as err:
        export_ctranslate2(model_dir, tmp_path / "ct2")
    assert fragment in str(err.value)
    assert not (tmp_path / "ct2").exists()


def test_refusal_is_one_line_on_the_command_line(tmp_path):
    model_dir = tmp_path / "rnn"
    model_dir.mkdir()
    (model_dir / "config.yaml").write_text("model: {arch: rnn}\n", encoding="utf-8")
    proc = subprocess.run([*xinda_command(), "export", "ctranslate2", str(model_dir),
                           str(tmp_path / "ct2")], capture_output=True, text=True,
                          env=subprocess_env(), timeout=120, check=False)
    assert proc.returncode == 1
    expected = (f"xinda: error: {model_dir}: cannot export to CTranslate2: only Transformer "
                "models are supported, this is a 'rnn' model")
    assert proc.stderr.strip().splitlines() == [expected]


def test_missing_ctranslate2_says_how_to_install(monkeypatch, tmp_path):
    """Without the package (hidden here), the export fails with the install command."""
    for name in [m for m in sys.modules if m.split(".")[0] == "ctranslate2"] + ["ctranslate2"]:
        monkeypatch.setitem(sys.modules, name, None)  # import ctranslate2 -> ImportError
    monkeypatch.delitem(sys.modules, "xinda.export.ct2_spec", raising=False)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.yaml").write_text("model: {preset: transformer-tiny}\n",
                                           encoding="utf-8")
    with pytest.raises(XindaError, match=re.escape(
            f"needs the ctranslate2 package: {INSTALL_HINT}")):
        export_ctranslate2(model_dir, tmp_path / "ct2")


def fake_vocab(pieces: list[str], **specials: int) -> SimpleNamespace:
    """What ``vocabulary_tokens`` reads of a ``Vocab``: pieces, size and the special ids."""
    sp = SimpleNamespace(id_to_piece=pieces.__getitem__)
    return SimpleNamespace(sp=sp, path=Path("fake.model"), **specials)


def test_special_ids_get_the_spellings_ctranslate2_expects():
    vocab = fake_vocab(["[UNK]", "[BOS]", "[EOS]", "▁a", "b"], unk=0, bos=1, eos=2, pad=5, size=6)
    assert vocabulary_tokens(vocab) == ["<unk>", "<s>", "</s>", "▁a", "b", "<pad>"]
    clash = fake_vocab(["<unk>", "<s>", "</s>", "<pad>"], unk=0, bos=1, eos=2, pad=4, size=5)
    with pytest.raises(XindaError, match="ids 3 and 4 would both be '<pad>'"):
        vocabulary_tokens(clash)
