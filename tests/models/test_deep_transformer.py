"""Deep Transformer options: DLCL (grouped), layer dropout, information-transfer fusion.

Small hand-built tensors check each equation; tiny models (d_model 16, 2-4 layers) check that
the options plug into the Transformer (off = plain, incremental = full decoding, presets train).
"""

import pytest
import torch
import torch.nn.functional as F

from xinda.data.vocab import VocabInfo
from xinda.errors import XindaError
from xinda.models.layers import SublayerConnection, skip_probability
from xinda.models.registry import build_model, resolve
from xinda.models.transformer.connections import (
    DenseConnection,
    InformationFusion,
    LinearFusion,
    RetentionGate,
    dlcl_aggregate,
    dlcl_init,
    mean_fusion,
    run_plain,
)

PAD, BOS, EOS, V = 0, 2, 3, 20
VOCAB = VocabInfo(src_size=V, tgt_size=V, pad=PAD, bos=BOS, eos=EOS, joint=True)
D = 16
TINY = {"arch": "transformer", "d_model": D, "heads": 2, "ffn_dim": 32,
        "encoder_layers": 2, "decoder_layers": 2}


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return build_model({**TINY, **overrides}, VOCAB).eval()


def batch(seed=1, b=2, s=5, t=6):
    """A source (B, S) with one padded row and a BOS-initial target prefix (B, T)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (b, s), generator=g)
    src[0, -2:] = PAD
    prev = torch.randint(4, V, (b, t), generator=g)
    prev[:, 0] = BOS
    return src, prev


def outputs(model, src, prev):
    with torch.no_grad():
        enc = model.encode(src)
        return enc.memory, model.decode(prev, enc)[0]


def copy_into(target, source):
    """Copy the shared parameters by name; returns the keys only ``target`` has."""
    missing, unexpected = target.load_state_dict(source.state_dict(), strict=False)
    assert not unexpected
    return missing


def recorder(fn, seen):
    """A unit applying ``fn`` that records every input it reads."""
    def unit(x):
        seen.append(x.clone())
        return fn(x)
    return unit


def randomise_norms(module, seed=0):
    """Give every LayerNorm distinct affine parameters, so using the wrong one shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g))


def ln(norm, x):
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


# --- 1. DLCL ---------------------------------------------------------------------------------

def test_dlcl_init_is_lower_triangular_mean_rows():
    """W_{k,i} = 1/(k+1) for i <= k, 0 above the diagonal."""
    expected = torch.tensor([[1, 0, 0, 0],
                             [1 / 2, 1 / 2, 0, 0],
                             [1 / 3, 1 / 3, 1 / 3, 0],
                             [1 / 4, 1 / 4, 1 / 4, 1 / 4]])
    torch.testing.assert_close(dlcl_init(4), expected)


def test_dlcl_aggregate_is_weighted_sum():
    """g = sum_i W_i z_i."""
    z = [torch.full((1, 2, 3), v) for v in (1.0, 10.0, 100.0)]
    out = dlcl_aggregate(torch.tensor([0.5, 0.25, 2.0]), z)
    torch.testing.assert_close(out, torch.full((1, 2, 3), 0.5 + 2.5 + 200.0))


def _custom_weights(conn):
    with torch.no_grad():
        conn.weights.copy_(torch.tensor([[1.0, 0, 0], [0.3, 0.7, 0], [0.2, -0.5, 1.5]]))
    return conn.weights.detach()


def test_dense_connection_pre_norm_by_hand():
    """Pre-norm DLCL: z_0 = x, z_k = LN_k(layer_k output), next input g_k = sum W_{k,i} z_i."""
    conn = DenseConnection(layers=2, dim=4, every=1, pre_norm=True)
    randomise_norms(conn)
    w = _custom_weights(conn)
    x = torch.randn(2, 3, 4)
    with torch.no_grad():
        out = conn(x, [lambda y: 2 * y, lambda y: y + 1])
        z1 = ln(conn.norms[0], 2 * x)
        g1 = w[1, 0] * x + w[1, 1] * z1
        z2 = ln(conn.norms[1], g1 + 1)
        expected = w[2, 0] * x + w[2, 1] * z1 + w[2, 2] * z2
    torch.testing.assert_close(out, expected)


def test_dense_connection_post_norm_by_hand():
    """Post-norm DLCL: z_k = layer_k output, next input g_k = LN_k(sum W_{k,i} z_i)."""
    conn = DenseConnection(layers=2, dim=4, every=1, pre_norm=False)
    randomise_norms(conn)
    w = _custom_weights(conn)
    x = torch.randn(2, 3, 4)
    with torch.no_grad():
        out = conn(x, [lambda y: 2 * y, lambda y: y + 1])
        z1 = 2 * x
        g1 = ln(conn.norms[0], w[1, 0] * x + w[1, 1] * z1)
        z2 = g1 + 1
        expected = ln(conn.norms[1], w[2, 0] * x + w[2, 1] * z1 + w[2, 2] * z2)
    torch.testing.assert_close(out, expected)


# --- 2. Grouped DLCL -------------------------------------------------------------------------

def test_grouped_dense_aggregates_only_after_every_pth_layer():
    """layers 4, p 2: K = 2 points, W is 3x3; layers 2 and 4 aggregate, 1 and 3 are plain."""
    conn = DenseConnection(layers=4, dim=4, every=2, pre_norm=True)
    assert conn.weights.shape == (3, 3) and len(conn.norms) == 2
    randomise_norms(conn)
    w = _custom_weights(conn)
    seen: list = []
    fns = [lambda y, k=k: y * (k + 2) + k for k in range(4)]
    x = torch.randn(2, 3, 4)
    with torch.no_grad():
        out = conn(x, [recorder(f, seen) for f in fns])
        out2 = fns[1](fns[0](x))
        z1 = ln(conn.norms[0], out2)
        g1 = w[1, 0] * x + w[1, 1] * z1
        out4 = fns[3](fns[2](g1))
        expected = w[2, 0] * x + w[2, 1] * z1 + w[2, 2] * ln(conn.norms[1], out4)
    for got, want in zip(seen, [x, fns[0](x), g1, fns[2](g1)]):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(out, expected)


def test_grouped_dense_trailing_layers_run_plain():
    """layers 5, p 2: the 5th layer reads g_2 and its output is returned un-aggregated."""
    conn = DenseConnection(layers=5, dim=4, every=2)
    seen: list = []
    units = [recorder(lambda y: y + 1, seen) for _ in range(5)]
    with torch.no_grad():
        out = conn(torch.randn(1, 2, 4), units)
    assert conn.weights.shape == (3, 3)
    torch.testing.assert_close(out, seen[4] + 1)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_dense_every_beyond_depth_equals_plain_transformer(norm):
    """p > layers never aggregates: identical to the plain Transformer with the same weights."""
    plain = tiny_model(norm=norm)
    dense = tiny_model(seed=7, norm=norm, dense="both", dense_every=3)
    missing = copy_into(dense, plain)
    assert sorted(missing) == ["decoder_connection.weights", "encoder_connection.weights"]
    src, prev = batch()
    for a, b in zip(outputs(plain, src, prev), outputs(dense, src, prev)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


# --- 3. Layer dropout ------------------------------------------------------------------------

def test_skip_probability_rises_linearly():
    """p_l = l / N * phi."""
    assert skip_probability(1, 4, 0.4) == pytest.approx(0.1)
    assert skip_probability(4, 4, 0.4) == pytest.approx(0.4)
    assert skip_probability(3, 6, 0.3) == pytest.approx(0.15)
    assert skip_probability(2, 4, 0.0) == 0.0


def test_model_assigns_skip_probabilities_per_sublayer():
    """Encoder sub-layer l of 2L gets l/(2L) phi, decoder sub-layer l of 3L gets l/(3L) phi."""
    phi, layers = 0.6, 2
    model = tiny_model(layer_dropout=phi)
    enc = [s.skip_prob for layer in model.encoder_layers for s in (layer.attn_sub, layer.ffn_sub)]
    dec = [s.skip_prob for layer in model.decoder_layers
           for s in (layer.self_sub, layer.cross_sub, layer.ffn_sub)]
    assert enc == pytest.approx([l / (2 * layers) * phi for l in range(1, 5)])
    assert dec == pytest.approx([l / (3 * layers) * phi for l in range(1, 7)])
    only_enc = tiny_model(layer_dropout=phi, layer_dropout_side="encoder")
    assert only_enc.encoder_layers[1].ffn_sub.skip_prob == pytest.approx(phi)
    assert all(m.skip_prob == 0 for m in only_enc.decoder_layers.modules()
               if isinstance(m, SublayerConnection))


def test_layer_dropout_is_off_in_eval_mode():
    """Inference never skips: deterministic and equal to layer_dropout 0 with the same weights."""
    plain = tiny_model()
    dropped = tiny_model(seed=3, layer_dropout=0.9)
    assert not copy_into(dropped, plain)
    src, prev = batch()
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


def test_model_in_training_with_every_sublayer_skipped_is_embedding_plus_norm():
    """Pre-norm, all skip probabilities ~1: the encoder returns LN_final(embedding)."""
    model = tiny_model(norm="pre", dropout=0.0, layer_dropout=0.5).train()
    for m in model.modules():
        if isinstance(m, SublayerConnection):
            m.skip_prob = 0.9999
    src, _ = batch()
    torch.manual_seed(0)
    with torch.no_grad():
        memory = model.encode(src).memory
        expected = model.encoder_norm(model.src_embed(src))
    torch.testing.assert_close(memory, expected)


# --- 4. Retention gate -----------------------------------------------------------------------

def test_retention_gate_by_hand():
    """g = sigmoid(W [fusion; current] + b), one per dimension; out = LN((1-g) c + g f)."""
    torch.manual_seed(0)
    gate = RetentionGate(4)
    randomise_norms(gate)
    with torch.no_grad():
        gate.proj.bias.normal_()
    current, fusion = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    with torch.no_grad():
        g = gate.gate(current, fusion)
        w, b = gate.proj.weight, gate.proj.bias
        by_hand = torch.sigmoid(fusion @ w[:, :4].T + current @ w[:, 4:].T + b)
        out = gate(current, fusion)
    assert g.shape == (2, 3, 4)
    assert ((g > 0) & (g < 1)).all()
    assert not torch.allclose(g, g[..., :1].expand_as(g))  # differs across dimensions
    torch.testing.assert_close(g, by_hand)
    torch.testing.assert_close(out, ln(gate.norm, (1 - g) * current + g * fusion))


@pytest.mark.parametrize("bias, keeps", [(-1e3, "current"), (1e3, "fusion")])
def test_retention_gate_saturates(bias, keeps):
    """b -> -inf: g -> 0, out = LN(current); b -> +inf: g -> 1, out = LN(fusion)."""
    torch.manual_seed(0)
    gate = RetentionGate(4)
    with torch.no_grad():
        gate.proj.bias.fill_(bias)
    current, fusion = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    with torch.no_grad():
        out = gate(current, fusion)
    torch.testing.assert_close(out, gate.norm(current if keeps == "current" else fusion))


# --- 5. Mean vs linear fusion ----------------------------------------------------------------

def test_mean_fusion_by_hand():
    h = [torch.full((1, 1, 2), v) for v in (1.0, 2.0, 6.0)]
    torch.testing.assert_close(mean_fusion(h), torch.full((1, 1, 2), 3.0))


def test_linear_fusion_starts_at_mean_then_is_a_linear_map():
    """Init W = [I/n ... I/n] (= mean); in general f = sum_j W[:, jD:(j+1)D] h_j."""
    torch.manual_seed(0)
    fusion = LinearFusion(3, 4)
    h = [torch.randn(2, 3, 4) for _ in range(3)]
    with torch.no_grad():
        torch.testing.assert_close(fusion(h), mean_fusion(h))
        fusion.proj.weight.normal_()
        w = fusion.proj.weight
        by_hand = sum(hj @ w[:, 4 * j:4 * (j + 1)].T for j, hj in enumerate(h))
        torch.testing.assert_close(fusion(h), by_hand)


@pytest.mark.parametrize("function", ["mean", "linear"])
def test_information_fusion_inputs_per_unit(function):
    """Unit i+1 reads gate_i(out_i, f(out_0..out_{i-1})) for i >= 1; unit 1 reads out_0."""
    torch.manual_seed(0)
    conn = InformationFusion(4, 4, function)
    randomise_norms(conn)
    if function == "linear":
        with torch.no_grad():
            for lin in conn.linear:
                lin.proj.weight.normal_()
    fns = [lambda y, k=k: y * (k + 2) + k for k in range(4)]
    seen: list = []
    x = torch.randn(2, 3, 4)
    with torch.no_grad():
        result = conn(x, [recorder(f, seen) for f in fns])
        fuse = mean_fusion if function == "mean" else (lambda hs: conn.linear[len(hs) - 1](hs))
        inputs, outs = [x], []
        for i, f in enumerate(fns):
            outs.append(f(inputs[-1]))
            nxt = outs[-1] if i == 0 else conn.gates[i - 1](outs[-1], fuse(outs[:-1]))
            inputs.append(nxt)
    assert len(conn.gates) == 3
    for got, want in zip(seen, inputs):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(result, inputs[-1])


def test_information_fusion_last_only_changes_only_the_final_output():
    """last_only: plain chain, then out = gate(out_{n-1}, mean(out_0..out_{n-2}))."""
    torch.manual_seed(0)
    conn = InformationFusion(3, 4, last_only=True)
    fns = [lambda y, k=k: y * (k + 2) + k for k in range(3)]
    fused, plain = [], []
    x = torch.randn(2, 3, 4)
    with torch.no_grad():
        out = conn(x, [recorder(f, fused) for f in fns])
        reference = run_plain(x, [recorder(f, plain) for f in fns])
        o0 = fns[0](x)
        o1 = fns[1](o0)
        expected = conn.gates[0](reference, mean_fusion([o0, o1]))
    assert len(conn.gates) == 1
    for a, b in zip(fused, plain):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    torch.testing.assert_close(out, expected)
    assert not torch.allclose(out, reference)


def test_linear_fusion_model_has_more_parameters_than_mean():
    """Linear fusion adds a D x iD matrix per fusion point; the gates are shared by both."""
    mean = tiny_model(fusion="sublayer", fusion_function="mean")
    linear = tiny_model(fusion="sublayer", fusion_function="linear")
    plain = tiny_model()
    # Encoder 4 sub-layers, decoder 6: fusion points i = 1..3 and 1..5, W_i of D x iD.
    extra = D * D * (sum(range(1, 4)) + sum(range(1, 6)))
    assert linear.num_parameters() == mean.num_parameters() + extra
    gates = (3 + 5) * (2 * D * D + D + 2 * D)  # proj (D x 2D + bias) + LayerNorm per point
    assert mean.num_parameters() == plain.num_parameters() + gates


# --- 6. Everything off == plain --------------------------------------------------------------

OFF = {"dense": "none", "dense_every": 1, "layer_dropout": 0.0, "layer_dropout_side": "both",
       "fusion": "none", "fusion_function": "mean", "fusion_side": "both", "residual": True}


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_all_new_options_off_equals_default_transformer(norm):
    default, off = tiny_model(norm=norm), tiny_model(norm=norm, **OFF)
    assert default.encoder_connection is None and off.decoder_connection is None
    shapes = lambda m: [(k, tuple(v.shape)) for k, v in m.state_dict().items()]
    assert shapes(default) == shapes(off)
    for (k, a), b in zip(default.state_dict().items(), off.state_dict().values()):
        assert torch.equal(a, b), k
    src, prev = batch()
    for a, b in zip(outputs(default, src, prev), outputs(off, src, prev)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


# --- 7. Incremental decoding == full decoding ------------------------------------------------

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
def test_incremental_decoding_matches_teacher_forcing(name):
    model = tiny_model(**VARIANTS[name])
    src, prev = batch(seed=5, b=3, t=7)
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
    plain = tiny_model(**overrides)
    copy_into(model, plain)  # same shared weights, the option's own at their init
    changed = not torch.allclose(outputs(model, src, prev)[1], outputs(plain, src, prev)[1])
    assert changed == (name != "layer-dropout-eval")


# --- 8. Config validation --------------------------------------------------------------------

@pytest.mark.parametrize("fields, message", [
    ({"dense": "both", "fusion": "layer"}, "pick one"),
    ({"residual": False}, "residual: false needs fusion: sublayer"),
    ({"residual": False, "fusion": "layer"}, "residual: false needs fusion: sublayer"),
    ({"fusion": "last", "fusion_side": "both"}, "fusion_side: decoder"),
    ({"fusion": "layer", "fusion_side": "none"}, "needs fusion_side"),
    ({"layer_dropout": 0.2, "layer_dropout_side": "none"}, "needs layer_dropout_side"),
    ({"dense_every": 0}, "dense_every"),
])
def test_invalid_option_combinations_raise(fields, message):
    with pytest.raises(XindaError, match=message):
        resolve({**TINY, **fields})


# --- 9. Presets ------------------------------------------------------------------------------

PRESET_FIELDS = {
    "transformer-deep": {"norm": "pre", "encoder_layers": 30, "decoder_layers": 6},
    "transformer-dlcl": {"norm": "pre", "encoder_layers": 30, "decoder_layers": 6, "dense": "both"},
    "transformer-layer-fusion": {"fusion": "layer", "fusion_function": "mean", "fusion_side": "both"},
    "transformer-sublayer-fusion": {"fusion": "sublayer", "fusion_side": "both"},
}
SMALL = {"d_model": D, "heads": 2, "ffn_dim": 32, "encoder_layers": 4, "decoder_layers": 2}


@pytest.mark.parametrize("preset", list(PRESET_FIELDS))
def test_preset_resolves_builds_and_trains_one_step(preset):
    cfg = resolve({"preset": preset})
    for key, value in PRESET_FIELDS[preset].items():
        assert getattr(cfg, key) == value, key
    torch.manual_seed(0)
    model = build_model({"preset": preset, **SMALL}, VOCAB).train()
    src, prev = batch(b=3, t=6)
    target = torch.roll(prev, -1, 1)
    loss = F.cross_entropy(model(src, prev).flatten(0, 1), target.flatten(), ignore_index=PAD)
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
        assert gates and all(g.proj.weight.grad.abs().sum() > 0 for g in gates)
