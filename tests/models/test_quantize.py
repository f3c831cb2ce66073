"""int8 inference (``xinda.models.quantize``): per-row weight quantisation, dynamic activations,
a model copy whose every linear layer is int8 and whose outputs stay close to float32."""

import pytest
import torch
from torch import nn

from xinda.errors import XindaError
from xinda.models.quantize import INT8_MAX, Int8Linear, int8_supported, quantize_int8

pytestmark = pytest.mark.skipif(not int8_supported(), reason="no CPU int8 engine in this build")

TRANSFORMER = {"arch": "transformer", "d_model": 32, "heads": 4, "ffn_dim": 64,
               "encoder_layers": 2, "decoder_layers": 2}
BAHDANAU = {"preset": "rnn-bahdanau", "embed_dim": 16, "hidden_dim": 16}


def test_weight_error_is_within_half_a_step_of_each_rows_scale():
    torch.manual_seed(0)
    linear = nn.Linear(24, 10)
    linear.weight.data[3] *= 50  # rows of very different ranges get their own scales
    q = Int8Linear(linear)
    step = linear.weight.abs().amax(1, keepdim=True) / INT8_MAX
    error = (q.weight - linear.weight).abs()
    assert bool((error <= step / 2 + 1e-7).all())
    torch.testing.assert_close(q.bias, linear.bias)


def test_output_close_to_float_linear():
    torch.manual_seed(1)
    linear, x = nn.Linear(64, 48), torch.randn(5, 7, 64)
    with torch.no_grad():
        exact, approx = linear(x), Int8Linear(linear)(x)
    assert approx.shape == exact.shape
    assert float((approx - exact).abs().max() / exact.abs().max()) < 0.03


@pytest.mark.parametrize("spec", [TRANSFORMER, BAHDANAU], ids=["transformer", "bahdanau"])
def test_quantized_copy_scores_like_the_float_model(spec, make_model, make_src, make_prev):
    model = make_model(spec, seed=3)
    quantized = quantize_int8(model)
    assert not any(isinstance(m, nn.Linear) for m in quantized.modules())
    assert any(isinstance(m, nn.Linear) for m in model.modules())  # the original is kept
    src, prev = make_src([6, 4, 2]), make_prev(3, 5)
    with torch.no_grad():
        exact = torch.log_softmax(model(src, prev), -1)
        approx = torch.log_softmax(quantized(src, prev), -1)
    assert float((approx - exact).abs().mean()) < 0.05
    assert float((approx - exact).abs().max()) < 0.3
    assert float((approx.argmax(-1) == exact.argmax(-1)).float().mean()) > 0.9


def test_tied_output_layer_gets_its_own_copy(make_model):
    model = make_model(TRANSFORMER, seed=4)
    assert model.output.weight is model.tgt_embed.embed.weight
    quantized = quantize_int8(model)
    assert isinstance(quantized.output, Int8Linear)
    torch.testing.assert_close(quantized.tgt_embed.embed.weight, model.tgt_embed.embed.weight)


def _rows_of_different_ranges() -> torch.Tensor:
    torch.manual_seed(5)
    x = torch.randn(6, 3, 64)
    x[1:] *= 40  # the other sentences' activations range far wider than the first's
    return x


def test_per_row_scales_make_a_row_s_output_independent_of_its_batch():
    """``scale="row"``: the first sentence's outputs are the same, bit for bit, alone and in a
    batch; with one scale per call ("batch") the wide rows coarsen its quantisation."""
    linear, x = nn.Linear(64, 48), _rows_of_different_ranges()
    with torch.no_grad():
        row, batch = Int8Linear(linear, "row"), Int8Linear(linear, "batch")
        assert torch.equal(row(x[:1]), row(x)[:1])
        assert not torch.equal(batch(x[:1]), batch(x)[:1])
        exact = linear(x[:1])
        error = {q: float((q(x)[:1] - exact).abs().max()) for q in (row, batch)}
    assert error[row] < error[batch] / 4
    assert error[row] / float(exact.abs().max()) < 0.03


def test_per_row_scales_keep_the_bias_and_the_shape():
    linear = nn.Linear(64, 48)
    no_bias = nn.Linear(64, 48, bias=False)
    no_bias.weight.data.copy_(linear.weight.data)
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        with_bias, without = Int8Linear(linear, "row"), Int8Linear(no_bias, "row")
        assert with_bias(x).shape == (2, 5, 48) and without.bias is None
        torch.testing.assert_close(with_bias.bias, linear.bias)
        torch.testing.assert_close(with_bias(x) - without(x), linear.bias.expand(2, 5, 48))
        assert torch.equal(without(torch.zeros(3, 64)), torch.zeros(3, 48))  # (no 0 / 0)


def test_an_unknown_scale_is_named():
    with pytest.raises(XindaError, match="int8 activation scale 'rows': use one of batch, row"):
        quantize_int8(nn.Sequential(nn.Linear(4, 4)), "rows")


def test_per_row_scales_of_a_one_feature_layer():
    """(One row cannot hold both +1 and -1 of the fixed range: two rows do.)"""
    linear, x = nn.Linear(1, 3), torch.tensor([[0.5], [-40.0], [3.0]])
    with torch.no_grad():
        row = Int8Linear(linear, "row")
        assert torch.equal(row(x[:1]), row(x)[:1])
        torch.testing.assert_close(row(x), linear(x), rtol=0.02, atol=0.02)


def test_the_int8_copy_runs_with_gradients_enabled(make_model, make_src, make_prev):
    """Before: the per-row path's ``out=`` division raised under autograd (the copy's float
    embeddings still required gradients); the copy is for inference only."""
    model = make_model(TRANSFORMER, seed=5)
    quantized = quantize_int8(model, "row")
    assert not any(p.requires_grad for p in quantized.parameters())
    assert all(p.requires_grad for p in model.parameters())  # the original untouched
    assert quantized(make_src([4, 2]), make_prev(2, 3)).shape[:2] == (2, 3)
