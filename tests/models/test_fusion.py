"""Information-transfer fusion (``connections.InformationFusion``): the retention gate, mean
and linear fusion of earlier outputs, layer-wise, sub-layer-wise and last-only fusion."""

import math

import pytest
import torch

from xinda.models.transformer.connections import (
    InformationFusion,
    LinearFusion,
    RetentionGate,
    gate_parameters,
    mean_fusion,
    run_plain,
)

# --- Retention gate --------------------------------------------------------------------------

def test_elementwise_gate_by_hand(randomise_norms, ln):
    """The paper's W in R^{D x 2}: g_d = sigmoid(W_d1 f_d + W_d2 c_d + b_d), written out per
    dimension with plain floats; out = LN((1-g) c + g f)."""
    torch.manual_seed(0)
    gate = RetentionGate(3, "elementwise")
    randomise_norms(gate)
    with torch.no_grad():
        gate.bias.normal_()
    current, fusion = torch.randn(1, 2, 3), torch.randn(1, 2, 3)
    w, b = gate.weight.tolist(), gate.bias.tolist()
    by_hand = [[1 / (1 + math.exp(-(w[d][0] * float(fusion[0, t, d])
                                    + w[d][1] * float(current[0, t, d]) + b[d])))
                for d in range(3)] for t in range(2)]
    with torch.no_grad():
        g, out = gate.gate(current, fusion), gate(current, fusion)
    assert gate.weight.shape == (3, 2)
    torch.testing.assert_close(g[0], torch.tensor(by_hand))
    torch.testing.assert_close(out, ln(gate.norm, (1 - g) * current + g * fusion))


@pytest.mark.parametrize("form, rows", [("matrix", 4), ("scalar", 1)])
def test_matrix_and_scalar_gates_by_hand(form, rows, randomise_norms, ln):
    """matrix: W in R^{D x 2D}, one gate per dimension from all 2D numbers; scalar: W in
    R^{1 x 2D}, one gate per position shared by every dimension."""
    torch.manual_seed(0)
    gate = RetentionGate(4, form)
    randomise_norms(gate)
    with torch.no_grad():
        gate.weight.normal_()
        gate.bias.normal_()
    current, fusion = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    with torch.no_grad():
        g = gate.gate(current, fusion)
        w, b = gate.weight, gate.bias
        by_hand = torch.sigmoid(fusion @ w[:, :4].T + current @ w[:, 4:].T + b)
        out = gate(current, fusion)
    assert g.shape == (2, 3, rows)
    assert ((g > 0) & (g < 1)).all()
    torch.testing.assert_close(g, by_hand)
    torch.testing.assert_close(out, ln(gate.norm, (1 - g) * current + g * fusion))


@pytest.mark.parametrize("form", ["elementwise", "matrix", "scalar"])
def test_every_gate_form_starts_near_one_half(form):
    """Before: the matrix and scalar forms' Xavier W gave pre-activations of std ~1.2 on
    unit-variance inputs, some gates below 0.1 or above 0.9 from the start (found by review)."""
    torch.manual_seed(0)
    gate = RetentionGate(512, form)
    current, fusion = torch.randn(4, 16, 512), torch.randn(4, 16, 512)
    with torch.no_grad():
        g = gate.gate(current, fusion)
    assert (g - 0.5).abs().max() < 0.15


@pytest.mark.parametrize("form", ["elementwise", "matrix", "scalar"])
def test_gate_parameter_counts(form):
    """3D (elementwise), 2D^2 + D (matrix), 2D + 1 (scalar), plus the LayerNorm's 2D."""
    d = 16
    gate = RetentionGate(d, form)
    assert sum(p.numel() for p in gate.parameters()) == gate_parameters(d, form) + 2 * d
    assert gate_parameters(d, form) == {"elementwise": 48, "matrix": 528, "scalar": 33}[form]


@pytest.mark.parametrize("form", ["elementwise", "matrix", "scalar"])
@pytest.mark.parametrize("bias, keeps", [(-1e3, "current"), (1e3, "fusion")])
def test_retention_gate_saturates(form, bias, keeps):
    """b -> -inf: g -> 0, out = LN(current); b -> +inf: g -> 1, out = LN(fusion)."""
    torch.manual_seed(0)
    gate = RetentionGate(4, form)
    with torch.no_grad():
        gate.bias.fill_(bias)
    current, fusion = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    with torch.no_grad():
        out = gate(current, fusion)
    torch.testing.assert_close(out, gate.norm(current if keeps == "current" else fusion))


# --- Mean vs linear fusion -------------------------------------------------------------------

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
def test_information_fusion_inputs_per_unit(function, randomise_norms, recorder):
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


def test_information_fusion_last_only_changes_only_the_final_output(recorder):
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


def test_linear_fusion_model_has_more_parameters_than_mean(tiny_transformer):
    """Linear fusion adds a D x iD matrix per fusion point; the gates are shared by both."""
    mean = tiny_transformer(fusion="sublayer", fusion_function="mean")
    linear = tiny_transformer(fusion="sublayer", fusion_function="linear")
    plain = tiny_transformer()
    d = plain.cfg.d_model  # 16
    # Encoder 4 sub-layers, decoder 6: fusion points i = 1..3 and 1..5, W_i of D x iD.
    extra = d * d * (sum(range(1, 4)) + sum(range(1, 6)))
    assert linear.num_parameters() == mean.num_parameters() + extra
    gates = (3 + 5) * (3 * d + 2 * d)  # elementwise W (D x 2) + b + LayerNorm per point
    assert mean.num_parameters() == plain.num_parameters() + gates


@pytest.mark.parametrize("form", ["elementwise", "matrix", "scalar"])
def test_gate_form_sets_the_model_parameters(form, tiny_transformer):
    """``fusion_gate`` picks the form of all 3 + 5 gates of a sub-layer fusion model."""
    model = tiny_transformer(fusion="sublayer", fusion_gate=form)
    plain = tiny_transformer()
    d = plain.cfg.d_model
    gates = list(model.encoder_connection.gates) + list(model.decoder_connection.gates)
    assert {g.form for g in gates} == {form} and len(gates) == 8
    assert model.num_parameters() == plain.num_parameters() + 8 * (gate_parameters(d, form)
                                                                   + 2 * d)
