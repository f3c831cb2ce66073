"""Layer dropout: sub-layer l of N skipped with probability l / N * phi in training
(``layers.skip_probability``, ``layers.SublayerConnection``), never at inference."""

import pytest
import torch

from xinda.models.layers import SublayerConnection, skip_probability


def test_skip_probability_rises_linearly():
    """p_l = l / N * phi."""
    assert skip_probability(1, 4, 0.4) == pytest.approx(0.1)
    assert skip_probability(4, 4, 0.4) == pytest.approx(0.4)
    assert skip_probability(3, 6, 0.3) == pytest.approx(0.15)
    assert skip_probability(2, 4, 0.0) == 0.0


def test_model_assigns_skip_probabilities_per_sublayer(tiny_transformer):
    """Encoder sub-layer l of 2L gets l/(2L) phi, decoder sub-layer l of 3L gets l/(3L) phi."""
    phi, layers = 0.6, 2
    model = tiny_transformer(layer_dropout=phi)
    enc = [s.skip_prob for layer in model.encoder_layers for s in (layer.attn_sub, layer.ffn_sub)]
    dec = [s.skip_prob for layer in model.decoder_layers
           for s in (layer.self_sub, layer.cross_sub, layer.ffn_sub)]
    assert enc == pytest.approx([l / (2 * layers) * phi for l in range(1, 5)])
    assert dec == pytest.approx([l / (3 * layers) * phi for l in range(1, 7)])
    only_enc = tiny_transformer(layer_dropout=phi, layer_dropout_side="encoder")
    assert only_enc.encoder_layers[1].ffn_sub.skip_prob == pytest.approx(phi)
    assert all(m.skip_prob == 0 for m in only_enc.decoder_layers.modules()
               if isinstance(m, SublayerConnection))


def test_layer_dropout_is_off_in_eval_mode(tiny_transformer, tiny_batch, outputs, copy_into):
    """Inference never skips: deterministic and equal to layer_dropout 0 with the same weights."""
    plain = tiny_transformer()
    dropped = tiny_transformer(seed=3, layer_dropout=0.9)
    assert not copy_into(dropped, plain)
    src, prev = tiny_batch()
    first, second = outputs(dropped, src, prev), outputs(dropped, src, prev)
    for a, b, c in zip(first, second, outputs(plain, src, prev)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
        torch.testing.assert_close(a, c, atol=0, rtol=0)


@pytest.mark.parametrize("pre_norm", [True, False])
def test_sublayer_skipped_in_training_with_probability_near_one(pre_norm):
    """Skipped: x_{l+1} = x_l (pre-norm) or LN(x_l) (post-norm); F is never called."""
    conn = SublayerConnection(4, 0.0, pre_norm, skip_prob=0.999).train()
    calls: list = []
    x = torch.randn(2, 3, 4)
    torch.manual_seed(0)
    out, extra = conn(x, lambda y: (calls.append(y) or y * 5, "attn"))
    assert not calls and extra is None
    torch.testing.assert_close(out, x if pre_norm else conn.norm(x))


def test_sublayer_skip_frequency_and_rescaling():
    """Skipped with frequency ~p; kept: x + F(LN(x)) / (1 - p)."""
    p, trials = 0.3, 4000
    conn = SublayerConnection(4, 0.0, True, skip_prob=p).train()
    x = torch.randn(1, 2, 4)
    f = lambda y: (y * 2 + 1, None)
    kept = x + f(conn.norm(x))[0] / (1 - p)
    torch.manual_seed(0)
    skipped = 0
    with torch.no_grad():
        for _ in range(trials):
            out, _ = conn(x, f)
            if torch.equal(out, x):
                skipped += 1
            else:
                torch.testing.assert_close(out, kept)
    assert abs(skipped / trials - p) < 0.03  # ~4 standard deviations


def test_model_in_training_with_every_sublayer_skipped_is_embedding_plus_norm(tiny_transformer,
                                                                              tiny_batch):
    """Pre-norm, all skip probabilities ~1: the encoder returns LN_final(embedding)."""
    model = tiny_transformer(norm="pre", dropout=0.0, layer_dropout=0.5).train()
    for m in model.modules():
        if isinstance(m, SublayerConnection):
            m.skip_prob = 0.9999
    src, _ = tiny_batch()
    torch.manual_seed(0)
    with torch.no_grad():
        memory = model.encode(src).memory
        expected = model.encoder_norm(model.src_embed(src))
    torch.testing.assert_close(memory, expected)
