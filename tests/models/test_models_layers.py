"""Shared layers: positions, attention (fast vs reference path, masks), dropout, residuals."""

import math

import pytest
import torch

from xinda.models.layers import (
    Dropout,
    MultiHeadAttention,
    SublayerConnection,
    attention_reference,
    random_lanes,
    sinusoidal_table,
)

D, H = 16, 4


def _pad_keep(lengths, width):
    """(B, 1, 1, S) bool, True on the first ``length`` positions of each row."""
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]


@pytest.fixture
def self_attn():
    torch.manual_seed(0)
    return MultiHeadAttention(D, H, dropout=0.1, self_attention=True).eval()


@pytest.fixture
def cross_attn():
    torch.manual_seed(1)
    return MultiHeadAttention(D, H, dropout=0.1, self_attention=False).eval()


# --- sinusoidal positions -------------------------------------------------------------------

@pytest.mark.parametrize("dim", [16, 32])
def test_sinusoidal_table_matches_vaswani_formula(dim):
    table = sinusoidal_table(60, dim)
    assert table.shape == (60, dim)
    for pos in (0, 1, 7, 59):
        for i in (0, 1, dim // 4, dim // 2 - 1):
            angle = pos / 10000 ** (2 * i / dim)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_sinusoidal_table_position_zero_is_sin0_cos0():
    row = sinusoidal_table(4, 8)[0]
    assert torch.equal(row[0::2], torch.zeros(4))
    assert torch.equal(row[1::2], torch.ones(4))


# --- multi-head attention -------------------------------------------------------------------

def test_attention_fast_path_equals_reference_with_padding_mask(self_attn):
    torch.manual_seed(2)
    x = torch.randn(3, 6, D)
    keep = _pad_keep([6, 4, 1], 6)
    fast, none = self_attn(x, keep=keep)
    ref, weights = self_attn(x, keep=keep, need_weights=True)
    assert none is None and weights.shape == (3, 6, 6)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)


def test_attention_fast_path_equals_reference_with_causal_mask(self_attn):
    torch.manual_seed(3)
    x = torch.randn(2, 5, D)
    fast, _ = self_attn(x, causal=True)
    ref, _ = self_attn(x, causal=True, need_weights=True)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)


def test_attention_fast_path_equals_reference_with_causal_and_padding_mask(self_attn):
    torch.manual_seed(4)
    x = torch.randn(2, 5, D)
    keep = _pad_keep([5, 3], 5)
    fast, _ = self_attn(x, keep=keep, causal=True)
    ref, weights = self_attn(x, keep=keep, causal=True, need_weights=True)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    assert torch.all(weights[0].triu(1) == 0)  # the causal part is really applied


def test_cross_attention_fast_path_equals_reference(cross_attn):
    torch.manual_seed(5)
    x, memory = torch.randn(2, 3, D), torch.randn(2, 7, D)
    keep = _pad_keep([7, 2], 7)
    fast, _ = cross_attn(x, memory=memory, keep=keep)
    ref, weights = cross_attn(x, memory=memory, keep=keep, need_weights=True)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    assert weights.shape == (2, 3, 7)


def test_padded_keys_get_exactly_zero_attention_weight(cross_attn):
    torch.manual_seed(6)
    x, memory = torch.randn(3, 4, D), torch.randn(3, 6, D)
    lengths = [6, 3, 1]
    _, weights = cross_attn(x, memory=memory, keep=_pad_keep(lengths, 6), need_weights=True)
    for row, n in enumerate(lengths):
        assert torch.all(weights[row, :, n:] == 0.0)
        assert torch.all(weights[row, :, :n] > 0.0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4))


def test_padded_key_content_does_not_change_output(cross_attn):
    torch.manual_seed(7)
    x, memory = torch.randn(1, 4, D), torch.randn(1, 6, D)
    keep = _pad_keep([3], 6)
    changed = memory.clone()
    changed[:, 3:] = torch.randn(1, 3, D) * 10
    for need_weights in (False, True):
        a, _ = cross_attn(x, memory=memory, keep=keep, need_weights=need_weights)
        b, _ = cross_attn(x, memory=changed, keep=keep, need_weights=need_weights)
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("need_weights", [False, True])
def test_causal_output_at_t_ignores_future_tokens(self_attn, need_weights):
    torch.manual_seed(8)
    x = torch.randn(2, 6, D)
    t = 2
    changed = x.clone()
    changed[:, t + 1:] = torch.randn(2, 6 - t - 1, D)
    a, _ = self_attn(x, causal=True, need_weights=need_weights)
    b, _ = self_attn(changed, causal=True, need_weights=need_weights)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(a[:, t + 1:], b[:, t + 1:])


def test_causal_weights_are_lower_triangular(self_attn):
    torch.manual_seed(9)
    _, weights = self_attn(torch.randn(1, 5, D), causal=True, need_weights=True)
    assert torch.all(weights[0].triu(1) == 0.0)
    assert weights[0, 0, 0].item() == pytest.approx(1.0)


@pytest.mark.parametrize("need_weights", [False, True])
def test_self_attention_cache_matches_full_causal_pass(self_attn, need_weights):
    """Feeding a prefix, then the rest (one or several tokens at a time), through the cache
    gives the same outputs as one causal pass over the whole sequence."""
    torch.manual_seed(10)
    x = torch.randn(2, 6, D)
    full, _ = self_attn(x, causal=True, need_weights=need_weights)
    cache: dict = {}
    parts = [self_attn(x[:, :2], causal=True, cache=cache, need_weights=need_weights)[0],
             self_attn(x[:, 2:3], causal=True, cache=cache, need_weights=need_weights)[0],
             self_attn(x[:, 3:], causal=True, cache=cache, need_weights=need_weights)[0]]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)
    assert cache["k"].shape == (2, H, 6, D // H)


@pytest.mark.parametrize("mask", ["padding", "causal", "causal-behind-cache", "both"])
def test_training_attention_with_dropout_equals_reference(mask):
    """The training path (dropout on the weights, additive mask) = the reference with the
    same ``Dropout`` draw applied to its weights."""
    attn = MultiHeadAttention(D, H, dropout=0.2, self_attention=True).train()
    torch.manual_seed(16)
    t, s = (3, 5) if mask == "causal-behind-cache" else (5, 5)
    q, k, v = (torch.randn(2, H, t, D // H), torch.randn(2, H, s, D // H),
               torch.randn(2, H, s, D // H))
    keep = _pad_keep([5, 3], s) if mask in ("padding", "both") else None
    causal = mask != "padding"
    torch.manual_seed(17)
    out = attn._attend_with_dropout(q, k, v, keep, causal)
    allowed = keep
    if causal:  # bottom-right aligned: query i sees keys up to i + s - t
        future = torch.ones(t, s, dtype=torch.bool).tril(s - t)
        allowed = future if keep is None else keep & future
    _, weights = attention_reference(q, k, v, allowed)
    torch.manual_seed(17)
    expected = attn.weight_dropout(weights) @ v
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_attention_reference_is_softmax_qk_v():
    torch.manual_seed(11)
    q, k, v = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    out, weights = attention_reference(q, k, v, None)
    expected_w = torch.softmax(q[0, 0] @ k[0, 0].T / 2.0, dim=-1)
    torch.testing.assert_close(weights[0, 0], expected_w)
    torch.testing.assert_close(out[0, 0], expected_w @ v[0, 0])


def test_attention_rejects_width_not_divisible_by_heads():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 4, 0.0, True)


# --- dropout --------------------------------------------------------------------------------

def test_dropout_is_identity_in_eval():
    drop = Dropout(0.3).eval()
    x = torch.randn(100)
    assert drop(x) is x


def test_dropout_with_p0_is_identity_in_train():
    x = torch.randn(100)
    assert torch.equal(Dropout(0.0).train()(x), x)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_dropout_drops_fraction_p_and_scales_kept_values(p):
    torch.manual_seed(12)
    drop = Dropout(p).train()
    x = torch.full((1000, 1000), 2.0)
    y = drop(x)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - p) < 0.01
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 2.0 / (1 - p)), rtol=1e-4, atol=0)
    assert y.mean().item() == pytest.approx(2.0, rel=0.01)  # expectation preserved


@pytest.mark.parametrize("p", [0.999995, 1.0])
def test_dropout_that_rounds_to_one_drops_everything(p):
    """Before: p in [1 - 2^-17, 1) divided by zero when the layer was built."""
    assert torch.equal(Dropout(p).train()(torch.ones(3, 4)), torch.zeros(3, 4))


def test_dropout_mask_is_not_a_repeating_pattern():
    """Every int16 lane of the random draw is used: neighbouring elements are independent."""
    torch.manual_seed(13)
    y = Dropout(0.5).train()(torch.ones(400_000))
    kept = (y != 0).view(-1, 4).float()
    both = (kept[:, 0] * kept[:, 1]).mean().item()
    assert both == pytest.approx(0.25, abs=0.01)


def test_dropout_is_deterministic_under_manual_seed():
    drop = Dropout(0.2).train()
    x = torch.randn(3, 7, 5)
    torch.manual_seed(14)
    a = drop(x)
    torch.manual_seed(14)
    b = drop(x)
    assert torch.equal(a, b)
    assert not torch.equal(a, drop(x))  # a fresh draw differs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_equals_the_boolean_mask_formula(dtype):
    """Same random lanes, same values and gradient as where(lane >= threshold, x / (1-p), 0)."""
    drop = Dropout(0.1).train()
    x = torch.randn(6, 7, 9, dtype=dtype, requires_grad=True)
    grad = torch.randn(6, 7, 9, dtype=dtype)
    torch.manual_seed(15)
    y = drop(x)
    y.backward(grad)
    torch.manual_seed(15)
    keep = random_lanes(x.numel(), x.device).view(x.shape) >= drop.threshold
    assert torch.equal(y, torch.where(keep, x * drop.scale, 0.0))
    assert torch.equal(x.grad, torch.where(keep, grad, 0.0) * drop.scale)


def test_random_lanes_repeat_under_the_torch_seed_and_are_uniform():
    """Seeded by torch's generator (manual_seed, a resumed RNG state); every int16 value about
    equally likely, no lane stuck, odd counts cut from the last 64-bit draw."""
    torch.manual_seed(21)
    a = random_lanes(1_000_003, torch.device("cpu"))
    torch.manual_seed(21)
    assert torch.equal(a, random_lanes(1_000_003, torch.device("cpu")))
    assert a.shape == (1_000_003,) and a.dtype == torch.int16
    assert not torch.equal(a[:1000], random_lanes(1000, torch.device("cpu")))  # next draw
    counts = torch.bincount((a.long() + 32768) // 4096, minlength=16).float()  # 16 bins
    assert (counts / counts.mean() - 1).abs().max() < 0.02
    for lane in range(4):  # each int16 lane of the 64-bit words takes both signs
        assert 0.49 < (a[lane::4] < 0).float().mean() < 0.51


def test_random_lanes_advance_the_torch_generator():
    """A draw moves torch's generator on, so the next torch draw differs from an undisturbed
    one: dropout masks and other random numbers come from one seeded sequence."""
    torch.manual_seed(22)
    before = torch.rand(3)
    torch.manual_seed(22)
    random_lanes(10, torch.device("cpu"))
    assert not torch.equal(torch.rand(3), before)


def test_dropout_keeps_shape_and_dtype():
    y = Dropout(0.1).train()(torch.randn(3, 5, 7, dtype=torch.float64))
    assert y.shape == (3, 5, 7) and y.dtype == torch.float64


# --- residual connection --------------------------------------------------------------------

def _hand_layer_norm(x, norm):
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def _sublayer_and_input(seed, pre_norm):
    """An eval-mode SublayerConnection (width 8, dropout 0.5) with a random LayerNorm affine
    part, and a (2, 3, 8) input."""
    torch.manual_seed(seed)
    sub = SublayerConnection(8, dropout=0.5, pre_norm=pre_norm).eval()
    with torch.no_grad():
        sub.norm.weight.uniform_(0.5, 1.5)
        sub.norm.bias.uniform_(-0.5, 0.5)
    return sub, torch.randn(2, 3, 8)


def test_sublayer_connection_pre_norm_is_x_plus_f_of_ln_x():
    sub, x = _sublayer_and_input(15, pre_norm=True)
    out, extra = sub(x, lambda y: (3.0 * y + 1.0, "extra"))
    expected = x + 3.0 * _hand_layer_norm(x, sub.norm) + 1.0
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert extra == "extra"


def test_sublayer_connection_post_norm_is_ln_of_x_plus_f_x():
    sub, x = _sublayer_and_input(16, pre_norm=False)
    out, extra = sub(x, lambda y: (y * y, None))
    expected = _hand_layer_norm(x + x * x, sub.norm)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert extra is None


def test_sublayer_connection_dropout_applies_to_branch_only():
    torch.manual_seed(17)
    sub = SublayerConnection(8, dropout=0.5, pre_norm=True).train()
    x = torch.randn(4, 8)
    out, _ = sub(x, lambda y: (torch.zeros_like(y), None))
    assert torch.equal(out, x)  # a zero branch leaves the residual stream untouched


@pytest.mark.parametrize("need_weights", [False, True])
def test_grouped_cross_attention_equals_memory_copied_per_row(cross_attn, need_weights):
    """group=G: G consecutive query rows share one memory row; same output and weights as
    copying the memory to every row."""
    torch.manual_seed(2)
    group, lengths = 3, [5, 2]
    x, memory = torch.randn(len(lengths) * group, 1, D), torch.randn(len(lengths), 5, D)
    keep = _pad_keep(lengths, 5)
    rows = torch.arange(len(lengths)).repeat_interleave(group)
    grouped = cross_attn(x, memory, keep, need_weights=need_weights, group=group)
    copied = cross_attn(x, memory[rows], keep[rows], need_weights=need_weights)
    torch.testing.assert_close(grouped[0], copied[0])
    if need_weights:
        torch.testing.assert_close(grouped[1], copied[1])
