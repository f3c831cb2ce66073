"""One training update in process, against a gradient computed here without the trainer: the
update's gradient is that of the group's per-token mean loss (summed label-smoothed loss over
all its batches, divided by their target tokens, EOS included)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from tiny_experiment import number_words_experiment

from xinda.config import ExperimentConfig
from xinda.data.batching import make_batches
from xinda.train import trainer as trainer_module
from xinda.train.trainer import Trainer

# no dropout: the trainer's forward pass (train mode) and the reference's are the same function
TINY = {"arch": "transformer", "d_model": 16, "heads": 2, "ffn_dim": 32, "encoder_layers": 1,
        "decoder_layers": 1, "dropout": 0.0, "attention_dropout": 0.0,
        "activation_dropout": 0.0}


@pytest.fixture(scope="module")
def cfg(tmp_path_factory) -> ExperimentConfig:
    """A prepared number-words corpus; batches of at most 60 tokens, 2 batches per update."""
    return number_words_experiment(tmp_path_factory.mktemp("update"), 40, TINY, max_tokens=60,
                                   update_freq=2, label_smoothing=0.1)


def reference_gradients(model, group, trainer) -> dict[str, torch.Tensor]:
    """d/dw of (sum over the group's sentences of torch's label-smoothed cross-entropy) /
    (their target tokens + EOS), one unpadded sentence at a time."""
    vocab, eps = trainer.vocab, trainer.cfg.train.label_smoothing
    model.train()
    loss, tokens = torch.zeros(()), 0
    for i in (int(i) for batch in group for i in batch):
        src = torch.tensor([*trainer.train_src[i].tolist(), vocab.eos])
        tgt = trainer.train_tgt[i].tolist()
        prev, target = torch.tensor([vocab.bos, *tgt]), torch.tensor([*tgt, vocab.eos])
        logits = model(src[None], prev[None])[0]
        loss = loss + F.cross_entropy(logits, target, label_smoothing=eps, reduction="sum")
        tokens += len(target)
    (loss / tokens).backward()
    return {name: p.grad for name, p in model.named_parameters()}


def test_an_updates_gradient_is_that_of_the_per_token_mean_loss(cfg, monkeypatch):
    """Guards the normalisation of the update's gradient (by the group's target tokens; with
    another divisor, two runs agree with each other but not with this reference). The group
    holds 2 padded batches; the trainer's chunked loss path is compared with full logits
    here."""
    trainer = Trainer(cfg)
    tc = cfg.train
    batches = make_batches(trainer.train_src.lengths, trainer.train_tgt.lengths,
                           tc.max_tokens, tc.seed, 1)
    group = batches[:2]
    assert len(group) == 2 and len(group[0]) > 1
    reference = copy.deepcopy(trainer.model)
    seen = {}

    def optimizer_step(optimizer, scaler, update, clip_norm=0.0):
        seen.update({name: p.grad.clone() for name, p in trainer.model.named_parameters()})
        return True  # (the weights stay as they were)

    monkeypatch.setattr(trainer_module, "optimizer_step", optimizer_step)
    loss_sum, _, ntokens = trainer.update(group)
    expected = reference_gradients(reference, group, trainer)
    assert ntokens == sum(int(trainer.train_tgt.lengths[i]) + 1 for b in group for i in b)
    assert loss_sum > 0 and seen.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(seen[name], grad, rtol=1e-4, atol=1e-6, msg=name)
