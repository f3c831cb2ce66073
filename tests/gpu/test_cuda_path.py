"""The CUDA path against the CPU: the same tiny models and data give the same logits, training
losses and translations on the GPU (fp32); bf16 training there learns; a CUDA device decodes
without cuDNN attention. Skipped without a GPU: ``benchmarks/gpu/README.md`` runs these on a
lent one. ``XINDA_TEST_DEVICE=cpu`` runs the same checks with the CPU as the device under test,
which checks the checks themselves.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
import torch
from tiny_experiment import number_words_experiment

from xinda.decode.translator import Translator
from xinda.train.trainer import Trainer

DEVICE = os.environ.get("XINDA_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(
    DEVICE == "cuda" and not torch.cuda.is_available(),
    reason="no CUDA device here (run on a lent GPU: benchmarks/gpu/README.md)")


def test_fp32_matmuls_are_fp32_on_the_device():
    """The comparisons below assume IEEE fp32 matmuls (torch's default); an image that forces
    TF32 (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1) would fail them for that reason alone."""
    assert not torch.backends.cuda.matmul.allow_tf32, "TF32 forced on: the comparisons fail"


NO_DROPOUT = {"dropout": 0.0}
TRANSFORMER = {"arch": "transformer", "d_model": 16, "heads": 2, "ffn_dim": 32,
               "encoder_layers": 2, "decoder_layers": 2, "attention_dropout": 0.0,
               "activation_dropout": 0.0, **NO_DROPOUT}
MODELS = {
    "transformer": TRANSFORMER,
    "post-norm sub-layer fusion": {**TRANSFORMER, "norm": "post", "fusion": "sublayer"},
    "bahdanau": {"preset": "rnn-bahdanau", "embed_dim": 16, "hidden_dim": 16, **NO_DROPOUT},
    "luong local-p": {"preset": "rnn-luong-local-p", "embed_dim": 16, "hidden_dim": 16,
                      **NO_DROPOUT},
}


@pytest.mark.parametrize("spec", MODELS.values(), ids=MODELS.keys())
def test_teacher_forced_logits_match_the_cpu(make_model, make_src, make_prev, spec):
    """fp32 throughout: cuDNN's recurrent layers would use TF32 by default."""
    model = make_model(spec)
    src, prev = make_src([6, 3, 8]), make_prev(3, 7)
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        want = model(src, prev)
        got = model.to(DEVICE)(src.to(DEVICE), prev.to(DEVICE))
    torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)


def train(root: Path, device: str, **train) -> Path:
    """A tiny Transformer trained on 60 number-words pairs on ``device``: its model folder."""
    cfg = number_words_experiment(root, 60, TRANSFORMER, device=device, max_tokens=80,
                                  log_every=1, lr=1e-2, warmup_steps=10, **train)
    Trainer(cfg).train()
    return Path(cfg.train.out_dir)


def train_losses(model_dir: Path) -> list[float]:
    with open(model_dir / "log.csv", encoding="utf-8") as f:
        return [float(row["train_loss"]) for row in csv.DictReader(f) if row["train_loss"]]


@pytest.fixture(scope="module")
def cpu_and_device(tmp_path_factory) -> tuple[Path, Path]:
    """The same fp32 run of 150 updates (enough for non-empty translations) on the CPU and on
    the device."""
    return tuple(train(tmp_path_factory.mktemp(name), device, max_steps=150, precision="fp32")
                 for name, device in (("cpu", "cpu"), ("device", DEVICE)))


def test_fp32_training_follows_the_cpu_update_by_update(cpu_and_device):
    """Rounding differs between the devices and Adam amplifies it over the updates: close at
    first, near after 150."""
    cpu, device = map(train_losses, cpu_and_device)
    assert len(cpu) == len(device) == 150
    assert device[:20] == pytest.approx(cpu[:20], rel=1e-3)
    assert device == pytest.approx(cpu, rel=2e-2)


def test_bf16_training_on_the_device_learns(tmp_path):
    losses = train_losses(train(tmp_path, DEVICE, max_steps=40, precision="bf16"))
    assert len(losses) == 40 and all(map(torch.isfinite, torch.tensor(losses)))
    assert sum(losses[-5:]) < 0.8 * sum(losses[:5])


@pytest.mark.parametrize("beam", [1, 5])
def test_translations_on_the_device_equal_the_cpu_ones(cpu_and_device, beam):
    model_dir = cpu_and_device[0]
    lines = (model_dir.parent / "raw" / "train.words").read_text(encoding="utf-8").splitlines()
    options = {"beam": beam, "batch_size": 16, "precision": "fp32"}
    want = Translator.load(model_dir).translate_text(lines[:40], **options)
    got = Translator.load(model_dir, device=DEVICE).translate_text(lines[:40], **options)
    assert got == want and any(want)


def test_a_device_translator_runs_without_cudnn_attention(cpu_and_device):
    was = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        translator = Translator.load(cpu_and_device[0], device=DEVICE)
        assert torch.backends.cuda.cudnn_sdp_enabled() == (DEVICE == "cpu")
        assert translator.translate_text(["three"], beam=2, precision="bf16")
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
