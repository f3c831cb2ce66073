"""The Python API as a notebook or script uses it: wrong types are one-line XindaErrors at the
call, a Trainer checks its config first and trains from its own random state, a Translator
follows the weights it is given (each found by a review of 2026-11-25; "Before:" says what
happened)."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file

from xinda import Translator
from xinda.averaging import average_checkpoints
from xinda.checkpoint import list_checkpoints, load_weights
from xinda.config import load_config
from xinda.data.prepare import prepare
from xinda.decode.sampling import SamplingConfig
from xinda.errors import XindaError
from xinda.evaluate.metrics import corpus_scores
from xinda.models.registry import resolve
from xinda.train.trainer import Trainer


@pytest.fixture(scope="module")
def translator(trained) -> Translator:
    return Translator.load(trained.model_dir)


@pytest.fixture(scope="module")
def lines(trained) -> list[str]:
    raw = trained.prepared.raw["test"]
    return open(f"{raw}.words", encoding="utf-8").read().splitlines()[:6]


@pytest.mark.parametrize("call, message", [
    (lambda t, _: t.translate_text("seven hundred"),
     "lines: expected a list of strings, got str (wrap one text in a list: [text])"),
    (lambda t, _: t.translate(None), "lines: expected a list of strings, got NoneType"),
    (lambda t, _: t.translate(["one", None]), "lines: item 2 is NoneType, not str"),
    (lambda t, lines: t.constraints_for(lines[:2], prefixes="37"),
     "prefixes: expected a list of strings, got str (wrap one text in a list: [text])"),
    (lambda t, lines: t.translate(lines, constraints=t.constraints_for(lines[:1], ["3"])),
     "a TargetPrefix constraint built for 1 sentences, given with 6 lines"),
    (lambda t, lines: t.translate(lines, sampler=SamplingConfig(n=3), sampling=False),
     "a sampler with sampling=False: give one or the other"),
])
def test_wrong_arguments_are_one_line_errors(translator, lines, call, message):
    """Before: a string was translated character by character (13 one-digit outputs), the
    rest were TypeErrors and IndexErrors deep inside, and the sampler won over sampling=False."""
    with pytest.raises(XindaError) as err:
        call(translator, lines)
    assert str(err.value) == message


def test_any_iterable_of_lines_translates_as_a_list(translator, lines):
    assert translator.translate_text(line for line in lines) == translator.translate_text(lines)


def test_int8_follows_weights_loaded_after_first_use(trained, lines):
    """Before: the int8 copy made at the first int8 call was used for good, so a loop over
    checkpoints with one Translator scored the first weights every time."""
    translator = Translator.load(trained.model_dir)
    first, last = list_checkpoints(trained.model_dir)[0], list_checkpoints(trained.model_dir)[-1]
    load_weights(translator.model, last)
    translator.translate_text(lines, precision="int8")
    load_weights(translator.model, first)
    fresh = Translator.load(trained.model_dir, checkpoint=first)
    assert translator.translate_text(lines, precision="int8") == fresh.translate_text(
        lines, precision="int8")
    assert translator.translate_text(lines, precision="int8") != Translator.load(
        trained.model_dir, checkpoint=last).translate_text(lines, precision="int8")


def test_int8_of_a_bf16_model(trained, lines):
    """Before: RuntimeError: mixed dtype (CPU) (the norms stayed bf16 in the int8 copy)."""
    translator = Translator.load(trained.model_dir)
    translator.model.to(torch.bfloat16)
    assert len(translator.translate_text(lines, precision="int8")) == len(lines)


@pytest.mark.parametrize("call, message", [
    (lambda d, tmp: Translator.load(d, device="gpu"),
     "device gpu: not a device name; use cpu, cuda or cuda:N"),
    (lambda d, tmp: Translator.load(d, ensemble=str(d)),
     "give a list of model directories"),
    (lambda d, tmp: average_checkpoints([tmp / "missing.safetensors"], tmp / "avg"),
     "missing.safetensors: checkpoint not found"),
    (lambda d, tmp: average_checkpoints([d], tmp / "avg"), ": checkpoint not found"),
    (lambda d, tmp: average_checkpoints(list_checkpoints(d)[0], tmp / "avg"),
     "give a list of checkpoints to average, not one path"),
    (lambda d, tmp: resolve("transformer-tiny"),
     "model: expected a mapping (preset or arch and fields), got str"),
    (lambda d, tmp: load_config(None, "train.lr=1e-3"),
     "overrides: expected a list of KEY=VALUE strings, got one"),
    (lambda d, tmp: prepare(load_config(d / "config.yaml")),
     "prepare takes a DataConfig (an experiment's .data), not ExperimentConfig"),
    (lambda d, tmp: corpus_scores(["a b", "c"], "ab"),
     "references: expected a list of strings (or of streams), got str"),
])
def test_wrong_arguments_elsewhere_are_one_line_errors(trained, tmp_path, call, message):
    with pytest.raises(XindaError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call(trained.model_dir, tmp_path)


def test_metrics_as_one_string_are_a_comma_list():
    """Before: "bleu" was read letter by letter (unknown metric 'b')."""
    assert [s.name for s in corpus_scores(["a b c d"], ["a b c d"], metrics="bleu,chrf")] == [
        "BLEU", "chrF2"]


def test_a_trainer_refuses_a_config_the_command_line_refuses(prepared, tmp_path):
    """Before: it trained a whole epoch, then failed at validation (coverage without
    attention), losing the epoch; or wrote the model into the data folder."""
    rnn = ('model={"arch": "rnn", "embed_dim": 16, "hidden_dim": 16, "encoder_layers": 1, '
           '"decoder_layers": 1, "attention": "none", "decoder_init": "final"}')
    cfg = load_config(prepared.config, [rnn, "decode.coverage=0.2",
                                        f"train.out_dir={tmp_path / 'm'}"])
    with pytest.raises(XindaError, match="the coverage penalty needs a model that attends"):
        Trainer(cfg, prepared.data_dir)
    cfg = load_config(prepared.config, [f"train.out_dir={prepared.data_dir}",
                                        f"data.out_dir={prepared.data_dir}"])
    with pytest.raises(XindaError, match="train.out_dir and data.out_dir are both"):
        Trainer(cfg, prepared.data_dir)
    assert not (tmp_path / "m").exists()


def test_a_trainer_trains_from_its_own_random_state(prepared, tmp_path):
    """Before: building a second Trainer (or drawing any random number) between a Trainer's
    construction and train() changed the trained model."""
    def config(name: str):
        return load_config(prepared.config, [f"train.out_dir={tmp_path / name}",
                                             "train.max_steps=3", "train.run_validation=false"])
    Trainer(config("alone"), prepared.data_dir).train()
    first = Trainer(config("first"), prepared.data_dir)
    Trainer(config("second"), prepared.data_dir)
    torch.rand(5)
    first.train()
    def tensors(run: str) -> list[bytes]:  # (a tied tensor's stored name may differ)
        weights = load_file(str(list_checkpoints(tmp_path / run)[-1]))
        return sorted(t.numpy().tobytes() for t in weights.values())
    assert tensors("alone") == tensors("first")
    shutil.rmtree(tmp_path / "second", ignore_errors=True)
