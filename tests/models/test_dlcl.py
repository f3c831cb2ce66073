"""Dynamic linear combination of layers (DLCL, ``connections.DenseConnection``), plain and
grouped: small hand-built tensors check each equation; the tiny Transformer checks that a
connection which never aggregates is the plain model."""

import pytest
import torch

from xinda.models.registry import build_model
from xinda.models.transformer.connections import DenseConnection, dlcl_aggregate, dlcl_init


def _custom_weights(conn):
    with torch.no_grad():
        conn.weights.copy_(torch.tensor([[1.0, 0, 0], [0.3, 0.7, 0], [0.2, -0.5, 1.5]]))
    return conn.weights.detach()


@pytest.fixture
def two_layer_dlcl(randomise_norms):
    """``two_layer_dlcl(pre_norm)`` -> (connection, W, x, output): a 2-layer DLCL with
    randomised norms and a custom W, run on a random x through the layers 2y and y + 1."""
    def run(pre_norm: bool):
        conn = DenseConnection(layers=2, dim=4, every=1, pre_norm=pre_norm)
        randomise_norms(conn)
        w = _custom_weights(conn)
        x = torch.randn(2, 3, 4)
        with torch.no_grad():
            out = conn(x, [lambda y: 2 * y, lambda y: y + 1])
        return conn, w, x, out
    return run


# --- DLCL ------------------------------------------------------------------------------------

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


def test_dense_connection_pre_norm_by_hand(two_layer_dlcl, ln):
    """Pre-norm DLCL: z_0 = x, z_k = LN_k(layer_k output), next input g_k = sum W_{k,i} z_i."""
    conn, w, x, out = two_layer_dlcl(pre_norm=True)
    with torch.no_grad():
        z1 = ln(conn.norms[0], 2 * x)
        g1 = w[1, 0] * x + w[1, 1] * z1
        z2 = ln(conn.norms[1], g1 + 1)
        expected = w[2, 0] * x + w[2, 1] * z1 + w[2, 2] * z2
    torch.testing.assert_close(out, expected)


def test_dense_connection_post_norm_by_hand(two_layer_dlcl, ln):
    """Post-norm DLCL: z_k = layer_k output, next input g_k = LN_k(sum W_{k,i} z_i)."""
    conn, w, x, out = two_layer_dlcl(pre_norm=False)
    with torch.no_grad():
        z1 = 2 * x
        g1 = ln(conn.norms[0], w[1, 0] * x + w[1, 1] * z1)
        z2 = g1 + 1
        expected = ln(conn.norms[1], w[2, 0] * x + w[2, 1] * z1 + w[2, 2] * z2)
    torch.testing.assert_close(out, expected)


# --- Grouped DLCL ----------------------------------------------------------------------------

def test_grouped_dense_aggregates_only_after_every_pth_layer(randomise_norms, recorder, ln):
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


def test_grouped_dense_trailing_layers_run_plain(recorder):
    """layers 5, p 2: the 5th layer reads g_2 and its output is returned un-aggregated."""
    conn = DenseConnection(layers=5, dim=4, every=2)
    seen: list = []
    units = [recorder(lambda y: y + 1, seen) for _ in range(5)]
    with torch.no_grad():
        out = conn(torch.randn(1, 2, 4), units)
    assert conn.weights.shape == (3, 3)
    torch.testing.assert_close(out, seen[4] + 1)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_dense_every_beyond_depth_equals_plain_transformer(norm, tiny_transformer, tiny_batch,
                                                           tiny_vocab, outputs, copy_into):
    """p > layers never aggregates: identical to the plain Transformer with the same weights
    (a config asking for it is refused: this builds one past the check)."""
    plain = tiny_transformer(norm=norm)
    cfg = type(plain.cfg).model_construct(**{**plain.cfg.model_dump(), "dense": "both",
                                            "dense_every": 3})
    torch.manual_seed(7)
    dense = build_model(cfg, tiny_vocab).eval()
    missing = copy_into(dense, plain)
    assert sorted(missing) == ["decoder_connection.weights", "encoder_connection.weights"]
    src, prev = tiny_batch()
    for a, b in zip(outputs(plain, src, prev), outputs(dense, src, prev)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    # every trainable weight gets a gradient (DDP waits for each one): before, the unused W
    # stopped a torchrun job at its second update
    dense.decode(prev, dense.encode(src))[0].sum().backward()
    assert not [n for n, p in dense.named_parameters() if p.requires_grad and p.grad is None]


def test_dlcl_init_last_puts_all_weight_on_the_newest_output():
    """init="last": W = I, so each aggregation reads only z_k."""
    torch.testing.assert_close(dlcl_init(3, "last"), torch.eye(3))


def test_dense_init_reaches_the_model():
    """model.dense_init builds the connection with that initial W; mean stays the default."""
    from xinda.models.transformer.model import TransformerConfig, make_connection

    cfg = {"d_model": 8, "heads": 2, "ffn_dim": 16, "encoder_layers": 3, "decoder_layers": 1,
           "norm": "pre", "dense": "encoder"}
    default = make_connection(TransformerConfig(**cfg), "encoder", 3, 2)
    last = make_connection(TransformerConfig(**cfg, dense_init="last"), "encoder", 3, 2)
    torch.testing.assert_close(default.weights.data, dlcl_init(4))
    torch.testing.assert_close(last.weights.data, torch.eye(4))
