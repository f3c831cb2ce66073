"""The chunked output layer + label-smoothed loss equals the reference (full logits) path:
loss, NLL and gradients w.r.t. hidden states, output weight and bias, with padding, tied
weights, fp32 and bf16 autocast."""

import pytest
import torch

from xinda.data.batching import Batch
from xinda.train.loss import (
    LossSetup,
    batch_loss,
    chunked_output_loss,
    label_smoothed_nll_reference,
)

PAD = 0


def _inputs(bias: bool, seed: int = 0, b: int = 3, t: int = 7, d: int = 16, v: int = 37):
    torch.manual_seed(seed)
    hidden = torch.randn(b, t, d, requires_grad=True)
    output = torch.nn.Linear(d, v, bias=bias)
    if bias:
        torch.nn.init.normal_(output.bias)
    target = torch.randint(1, v, (b, t))
    target[0, 4:] = PAD  # padding, and a row that is all padding
    target[2] = PAD
    return hidden, output, target


def _run(fn, hidden, output, target, precision):
    """(loss, nll, grads of hidden and the output's parameters) for loss scaled by 0.3."""
    hidden.grad = None
    output.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss, nll = fn(hidden, output, target)
    (0.3 * loss).backward()
    grads = [hidden.grad] + [p.grad for p in output.parameters()]
    return loss.detach(), nll.detach(), grads


def _reference(hidden, output, target):
    return label_smoothed_nll_reference(output(hidden), target, 0.1, PAD)


TOL = {"fp32": {"rtol": 1e-5, "atol": 1e-6}, "bf16": {"rtol": 2e-2, "atol": 2e-3}}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk", [1, 4, 1000])
def test_chunked_loss_and_gradients_equal_reference(precision, bias, chunk):
    hidden, output, target = _inputs(bias)
    want = _run(_reference, hidden, output, target, precision)
    got = _run(lambda h, o, y: chunked_output_loss(h, o, y, 0.1, PAD, chunk),
               hidden, output, target, precision)
    tol = TOL[precision]
    torch.testing.assert_close(got[0], want[0], **tol)
    torch.testing.assert_close(got[1], want[1], **tol)
    for mine, ref in zip(got[2], want[2]):
        assert mine.dtype == ref.dtype == torch.float32
        torch.testing.assert_close(mine, ref, **tol)
    assert got[2][0][2].abs().sum() == 0 and got[2][0][0, 4:].abs().sum() == 0  # pad rows


def test_tied_weights_accumulate_both_gradients():
    """Output weight = embedding table: the embedding and output gradients add up."""
    torch.manual_seed(1)
    embed = torch.nn.Embedding(23, 8)
    output = torch.nn.Linear(8, 23, bias=False)
    output.weight = embed.weight
    prev, target = torch.randint(1, 23, (2, 5)), torch.randint(1, 23, (2, 5))
    target[1, 3:] = PAD
    grads = []
    for chunked in (False, True):
        embed.zero_grad(set_to_none=True)
        hidden = torch.tanh(embed(prev))
        if chunked:
            loss, _ = chunked_output_loss(hidden, output, target, 0.1, PAD, 3)
        else:
            loss, _ = label_smoothed_nll_reference(output(hidden), target, 0.1, PAD)
        loss.backward()
        grads.append(embed.weight.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-6)


def test_without_gradients_only_values():
    hidden, output, target = _inputs(True)
    with torch.no_grad():
        loss, nll = chunked_output_loss(hidden, output, target, 0.1, PAD, 2)
        want_loss, want_nll = _reference(hidden, output, target)
    assert not loss.requires_grad
    torch.testing.assert_close((loss, nll), (want_loss, want_nll))


@pytest.mark.parametrize("spec", [
    {"arch": "transformer", "d_model": 16, "heads": 2, "ffn_dim": 32, "encoder_layers": 2,
     "decoder_layers": 2, "norm": "pre"},
    {"arch": "transformer", "d_model": 16, "heads": 2, "ffn_dim": 32, "encoder_layers": 1,
     "decoder_layers": 1, "tie_output": False},
    {"arch": "rnn", "embed_dim": 16, "hidden_dim": 16, "encoder_layers": 1, "decoder_layers": 1},
])
def test_models_chunked_batch_loss_equals_full_logits(make_model, vocab, spec):
    """``batch_loss`` from the decoder states (chunked) and from the logits (loss_chunk 0):
    same loss and the same gradient for every parameter (eval mode: no dropout)."""
    model = make_model(spec)
    g = torch.Generator().manual_seed(2)
    src = torch.randint(4, vocab.src_size, (3, 6), generator=g)
    prev = torch.randint(4, vocab.tgt_size, (3, 5), generator=g)
    target = torch.cat([prev[:, 1:], torch.full((3, 1), vocab.eos)], 1)
    target[1, 2:] = vocab.pad
    batch = Batch(src, prev, target, int(target.ne(vocab.pad).sum()), None)
    results = []
    for chunk in (0, 4):
        model.zero_grad(set_to_none=True)
        setup = LossSetup(0.1, vocab.pad, chunk, "fp32", torch.device("cpu"))
        loss, nll = batch_loss(model, model, batch, setup)
        loss.backward()
        results.append((loss.detach(), nll, {n: p.grad for n, p in model.named_parameters()}))
    (full_loss, full_nll, full_grads), (loss, nll, grads) = results
    torch.testing.assert_close((loss, nll), (full_loss, full_nll))
    assert grads.keys() == full_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, full_grads[name], rtol=1e-5, atol=1e-6, msg=name)


def test_extreme_logits_stay_finite_and_exact():
    """Probabilities that underflow to 0 in float32 (logits spread over hundreds)."""
    hidden, output, target = _inputs(False)
    with torch.no_grad():
        output.weight.mul_(60.0)
    want = _run(_reference, hidden, output, target, "fp32")
    got = _run(lambda h, o, y: chunked_output_loss(h, o, y, 0.1, PAD, 4),
               hidden, output, target, "fp32")
    assert torch.isfinite(got[0]) and want[0] > 100
    torch.testing.assert_close(got[:2], want[:2], rtol=1e-5, atol=1e-4)
    for mine, ref in zip(got[2], want[2]):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-5)
