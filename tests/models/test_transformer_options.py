"""The deep-Transformer options (DLCL, layer dropout, fusion) as Transformer options: all off is
the plain model, incremental decoding equals full decoding under each, impossible combinations
are refused, and the presets build and train."""

import pytest
import torch
import torch.nn.functional as F

from xinda.errors import XindaError
from xinda.models.registry import resolve

# --- Everything off == plain -----------------------------------------------------------------

OFF = {"dense": "none", "dense_every": 1, "layer_dropout": 0.0, "layer_dropout_side": "both",
       "fusion": "none", "fusion_function": "mean", "fusion_side": "both", "residual": True}


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_all_new_options_off_equals_default_transformer(norm, tiny_transformer, tiny_batch,
                                                        outputs):
    default, off = tiny_transformer(norm=norm), tiny_transformer(norm=norm, **OFF)
    assert default.encoder_connection is None and off.decoder_connection is None
    shapes = lambda m: [(k, tuple(v.shape)) for k, v in m.state_dict().items()]
    assert shapes(default) == shapes(off)
    for (k, a), b in zip(default.state_dict().items(), off.state_dict().values()):
        assert torch.equal(a, b), k
    src, prev = tiny_batch()
    for a, b in zip(outputs(default, src, prev), outputs(off, src, prev)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


# --- Incremental decoding == full decoding ---------------------------------------------------

VARIANTS = {
    "dense-both": {"norm": "pre", "dense": "both"},
    "dense-both-post": {"norm": "post", "dense": "both"},
    "dense-every-2": {"norm": "pre", "dense": "both", "dense_every": 2, "decoder_layers": 4},
    "fusion-layer": {"fusion": "layer"},
    "fusion-sublayer-mean": {"fusion": "sublayer", "fusion_function": "mean"},
    "fusion-sublayer-linear": {"fusion": "sublayer", "fusion_function": "linear"},
    "fusion-last": {"fusion": "last", "fusion_side": "decoder"},
    "sublayer-no-residual": {"norm": "pre", "fusion": "sublayer", "residual": False},
    "layer-dropout-eval": {"layer_dropout": 0.3},
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_incremental_decoding_matches_teacher_forcing(name, tiny_transformer, tiny_batch,
                                                      outputs, copy_into):
    model = tiny_transformer(**VARIANTS[name])
    src, prev = tiny_batch(seed=5, b=3, t=7)
    with torch.no_grad():
        enc = model.encode(src)
        full, full_attn = model.decode(prev, enc, need_weights=True)
        state: dict = {}
        steps = [model.decode(prev[:, t:t + 1], enc, state, need_weights=True)
                 for t in range(prev.size(1))]
    assert state["step"] == prev.size(1)
    torch.testing.assert_close(torch.cat([s[0] for s in steps], 1), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat([s[1] for s in steps], 1), full_attn,
                               atol=1e-5, rtol=1e-5)
    # The option really changes the computation (layer dropout is a no-op at inference).
    overrides = {k: v for k, v in VARIANTS[name].items() if k in ("norm", "decoder_layers")}
    plain = tiny_transformer(**overrides)
    copy_into(model, plain)  # same shared weights, the option's own at their init
    changed = not torch.allclose(outputs(model, src, prev)[1], outputs(plain, src, prev)[1])
    assert changed == (name != "layer-dropout-eval")


# --- Config validation -----------------------------------------------------------------------

@pytest.mark.parametrize("fields, message", [
    ({"dense": "both", "fusion": "layer"}, "pick one"),
    ({"residual": False}, "residual: false needs fusion: sublayer"),
    ({"residual": False, "fusion": "layer"}, "residual: false needs fusion: sublayer"),
    ({"fusion": "last", "fusion_side": "both"}, "fusion_side: decoder"),
    ({"fusion": "layer", "fusion_side": "none"}, "needs fusion_side"),
    ({"layer_dropout": 0.2, "layer_dropout_side": "none"}, "needs layer_dropout_side"),
    ({"dense_every": 0}, "dense_every"),
    # before: each built the plain Transformer without a word
    ({"dense_every": 2}, "dense_every: 2 applies only with dense on"),
    ({"dense_init": "last"}, "dense_init: last applies only with dense on"),
    ({"fusion_gate": "scalar", "fusion_function": "linear"},
     "fusion_function: linear, fusion_gate: scalar applies only with fusion on"),
    ({"fusion_side": "decoder"}, "fusion_side: decoder applies only with fusion on"),
    ({"layer_dropout_side": "encoder"}, "layer_dropout_side: encoder applies only with"),
])
def test_invalid_option_combinations_raise(fields, message, tiny_spec):
    with pytest.raises(XindaError, match=message):
        resolve({**tiny_spec, **fields})


# --- Presets ---------------------------------------------------------------------------------

PRESET_FIELDS = {
    "transformer-deep": {"norm": "pre", "encoder_layers": 30, "decoder_layers": 6},
    "transformer-dlcl": {"norm": "pre", "encoder_layers": 30, "decoder_layers": 6,
                         "dense": "both"},
    "transformer-layer-fusion": {"fusion": "layer", "fusion_function": "mean",
                                 "fusion_side": "both"},
    "transformer-sublayer-fusion": {"fusion": "sublayer", "fusion_side": "both"},
}
SMALL = {"d_model": 16, "heads": 2, "ffn_dim": 32, "encoder_layers": 4, "decoder_layers": 2}


@pytest.mark.parametrize("preset", list(PRESET_FIELDS))
def test_preset_resolves_builds_and_trains_one_step(preset, make_model, tiny_vocab, tiny_batch):
    cfg = resolve({"preset": preset})
    for key, value in PRESET_FIELDS[preset].items():
        assert getattr(cfg, key) == value, key
    model = make_model({"preset": preset, **SMALL}, vocab=tiny_vocab).train()
    src, prev = tiny_batch(b=3, t=6)
    target = torch.roll(prev, -1, 1)
    loss = F.cross_entropy(model(src, prev).flatten(0, 1), target.flatten(),
                           ignore_index=tiny_vocab.pad)
    loss.backward()
    assert torch.isfinite(loss)
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    if preset == "transformer-dlcl":
        for conn in (model.encoder_connection, model.decoder_connection):
            grad = conn.weights.grad
            used = torch.ones_like(grad, dtype=torch.bool).tril()
            used[0, 0] = False  # row 0 (z_0 alone) is never read
            assert (grad[used] != 0).all() and (grad[~used] == 0).all()
    if "fusion" in preset:
        gates = [g for conn in (model.encoder_connection, model.decoder_connection)
                 for g in conn.gates]
        assert gates and all(g.weight.grad.abs().sum() > 0 for g in gates)


def test_layer_dropout_without_residuals_is_refused():
    """A skipped sub-layer returns x, a kept one F / (1 - p) without x: in expectation F + p x,
    not the F inference computes."""
    from xinda.errors import XindaError
    from xinda.models.registry import resolve

    with pytest.raises(XindaError, match="layer_dropout needs the residual connections"):
        resolve({"preset": "transformer-tiny", "fusion": "sublayer", "fusion_side": "both",
                 "residual": False, "layer_dropout": 0.2})
    resolve({"preset": "transformer-tiny", "fusion": "sublayer", "fusion_side": "decoder",
             "residual": False, "layer_dropout": 0.2, "layer_dropout_side": "encoder"})


@pytest.mark.parametrize("preset", ["transformer-base", "transformer-big",
                                    "transformer-sublayer-fusion"])
def test_vaswani_presets_drop_out_only_sub_layer_outputs_and_embeddings(preset):
    from xinda.models.registry import resolve

    cfg = resolve({"preset": preset})
    assert (cfg.attention_dropout, cfg.activation_dropout) == (0.0, 0.0) and cfg.dropout > 0


# --- residual: false only where the sub-layer fusion runs ------------------------------------

@pytest.mark.parametrize("side", ["decoder", "encoder"])
def test_residual_false_keeps_the_residuals_of_the_stack_without_fusion(side, tiny_transformer,
                                                                        tiny_batch, copy_into):
    """With fusion_side one stack, residual: false drops the residuals there only: the other
    stack computes exactly what the same weights with residuals compute, the fused one not."""
    fields = {"fusion": "sublayer", "fusion_side": side}
    bare, kept = tiny_transformer(residual=False, **fields), tiny_transformer(**fields)
    assert not copy_into(kept, bare)  # the very same weights
    src, prev = tiny_batch()
    with torch.no_grad():
        enc_bare, enc_kept = bare.encode(src), kept.encode(src)
        # both decoders read the same memory, so only their own residuals can differ
        dec_bare, dec_kept = bare.decode(prev, enc_kept)[0], kept.decode(prev, enc_kept)[0]
    same, other = (enc_bare.memory, enc_kept.memory), (dec_bare, dec_kept)
    if side == "encoder":
        same, other = other, same
    torch.testing.assert_close(*same, atol=0, rtol=0)
    assert not torch.allclose(*other, atol=1e-3)
