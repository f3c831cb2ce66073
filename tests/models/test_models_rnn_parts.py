"""Recurrent building blocks: cells against hand computations and fused modules, the book's
initialisation, the five attention scores and the local windows on hand examples."""

import math

import pytest
import torch
from torch import nn

from xinda.models.rnn.attention import (
    SourceAttention,
    concat_score,
    cosine_score,
    dot_score,
    gaussian,
    general_score,
    key_strength,
    local_window,
    location_score,
    masked_softmax,
    predictive_position,
)
from xinda.models.rnn.cells import (
    gru_cell,
    init_rnn_,
    lstm_cell,
    make_rnn,
    rnn_cell,
    step_fused,
    unroll_reference,
)


def sigmoid(v):
    return 1 / (1 + math.exp(-v))


def t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


# --- cells by hand --------------------------------------------------------------------------

def test_lstm_gate_equations_by_hand():
    # 1-dim cell, gate blocks in PyTorch order i, f, g, o
    w_ih, w_hh = t([0.5], [-1.0], [2.0], [1.0]), t([1.0], [0.5], [-0.5], [2.0])
    b_ih, b_hh = t(0.0, 1.0, 0.0, 0.0), t(0.1, 0.0, 0.2, -0.3)
    x, h0, c0 = t([1.0]), t([0.5]), t([0.2])
    i = sigmoid(0.5 * 1 + 1.0 * 0.5 + 0.1)  # 1.1
    f = sigmoid(-1.0 + 1.0 + 0.5 * 0.5)  # 0.25
    g = math.tanh(2.0 - 0.5 * 0.5 + 0.2)  # 1.95
    o = sigmoid(1.0 + 2.0 * 0.5 - 0.3)  # 1.7
    c = f * 0.2 + i * g
    h = o * math.tanh(c)
    got_h, got_c = lstm_cell(x, h0, c0, w_ih, w_hh, b_ih, b_hh)
    assert got_c.item() == pytest.approx(c, abs=1e-6)
    assert got_h.item() == pytest.approx(h, abs=1e-6)


def test_gru_gate_equations_by_hand():
    # 1-dim cell, blocks r, z, n; the reset gate scales U_n h + b_hn (PyTorch's convention)
    w_ih, w_hh = t([1.0], [-0.5], [2.0]), t([0.5], [1.0], [-1.0])
    b_ih, b_hh = t(0.0, 0.1, 0.2), t(0.3, 0.0, 0.4)
    x, h0 = t([1.0]), t([0.6])
    r = sigmoid(1.0 + 0.5 * 0.6 + 0.3)
    z = sigmoid(-0.5 + 0.1 + 1.0 * 0.6)
    n = math.tanh(2.0 + 0.2 + r * (-1.0 * 0.6 + 0.4))
    expected = (1 - z) * n + z * 0.6
    assert gru_cell(x, h0, w_ih, w_hh, b_ih, b_hh).item() == pytest.approx(expected, abs=1e-6)


def test_rnn_equation_by_hand():
    # 2-dim Elman cell: h = tanh(W x + U h + b)
    w, u = t([1.0, 0.0], [0.0, 2.0]), t([0.5, -0.5], [1.0, 0.0])
    b_ih, b_hh = t(0.1, 0.0), t(0.0, -0.2)
    x, h0 = t([1.0, -1.0]), t([0.2, 0.4])
    expected = [math.tanh(1.0 + 0.5 * 0.2 - 0.5 * 0.4 + 0.1), math.tanh(-2.0 + 0.2 - 0.2)]
    got = rnn_cell(x, h0, w, u, b_ih, b_hh)
    torch.testing.assert_close(got, torch.tensor([expected]))


# --- reference cells == fused modules -------------------------------------------------------

@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn"])
def test_reference_cell_equals_torch_cell(kind):
    torch.manual_seed(0)
    cell = {"lstm": nn.LSTMCell, "gru": nn.GRUCell, "rnn": nn.RNNCell}[kind](3, 4)
    x, h, c = torch.randn(2, 3), torch.randn(2, 4), torch.randn(2, 4)
    weights = (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
    with torch.no_grad():
        if kind == "lstm":
            ref, fused = lstm_cell(x, h, c, *weights), cell(x, (h, c))
        else:
            ref, fused = (gru_cell if kind == "gru" else rnn_cell)(x, h, *weights), cell(x, h)
    torch.testing.assert_close(ref, fused, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_unrolled_reference_equals_fused_module(kind, bidirectional):
    torch.manual_seed(1)
    module = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[kind](
        3, 4, num_layers=2, bidirectional=bidirectional, batch_first=True)
    dirs = 2 if bidirectional else 1
    x = torch.randn(2, 5, 3)
    h0 = torch.randn(2 * dirs, 2, 4)
    state = (h0, torch.randn(2 * dirs, 2, 4)) if kind == "lstm" else h0
    with torch.no_grad():
        ref_out, ref_state = unroll_reference(module, x, state)
        out, fused_state = module(x, state)
    torch.testing.assert_close(ref_out, out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ref_state, fused_state, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn"])
def test_one_step_cell_kernel_equals_the_sequence_module(kind):
    """step_fused (torch.lstm_cell etc.) == the single-layer module run for T = 1."""
    torch.manual_seed(2)
    module = make_rnn(kind, 3, 4)
    x, parts = torch.randn(2, 3), [torch.randn(2, 4) for _ in range(2 if kind == "lstm" else 1)]
    state = tuple(p[None] for p in parts) if kind == "lstm" else parts[0][None]
    with torch.no_grad():
        out, new = module(x[:, None], state)
        stepped = step_fused(module, x, parts)
    expected = list(new) if kind == "lstm" else [new]
    for got, want in zip(stepped, expected):
        torch.testing.assert_close(got, want[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(stepped[0], out[:, 0], atol=1e-6, rtol=1e-6)


# --- initialisation -------------------------------------------------------------------------

def test_lstm_forget_gate_bias_totals_one_and_other_biases_zero():
    rnn = make_rnn("lstm", 3, 4, bidirectional=True)
    for sfx in ("_l0", "_l0_reverse"):
        total = getattr(rnn, "bias_ih" + sfx) + getattr(rnn, "bias_hh" + sfx)  # (4H,)
        i, f, g, o = total.detach().chunk(4)
        assert torch.equal(f, torch.ones(4))
        assert not i.any() and not g.any() and not o.any()


@pytest.mark.parametrize("kind", ["gru", "rnn"])
def test_gru_and_rnn_biases_are_zero(kind):
    rnn = make_rnn(kind, 3, 4)
    assert not rnn.bias_ih_l0.any() and not rnn.bias_hh_l0.any()


def test_weights_are_xavier_uniform_per_gate():
    torch.manual_seed(2)
    rnn = nn.LSTM(30, 50)
    init_rnn_(rnn)
    for name, inputs in (("weight_ih_l0", 30), ("weight_hh_l0", 50)):
        bound = math.sqrt(6 / (inputs + 50))  # each gate block is one (H, I) matrix
        for block in getattr(rnn, name).detach().chunk(4):
            assert block.abs().max() <= bound
            assert block.abs().max() > 0.9 * bound  # fills the range
            assert block.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)


# --- score functions on a hand example ------------------------------------------------------

S_Q = t([[1.0, 2.0]])  # (B=1, T=1, H=2)
S_M = t([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])  # (B=1, S=3, M=2)


def test_dot_score_by_hand():
    torch.testing.assert_close(dot_score(S_Q, S_M), t([[1.0, 2.0, 3.0]]))


def test_general_score_by_hand():
    weight = t([1.0, 0.0], [0.0, -1.0])  # s^T W = [1, -2]
    torch.testing.assert_close(general_score(S_Q, S_M, weight), t([[1.0, -2.0, -1.0]]))


def test_concat_score_by_hand():
    w_q = t([1.0, 0.0], [0.0, 0.0])  # W_q s = [1, 0]
    w_m = t([0.0, 0.0], [0.5, 1.0])  # W_m h = [0, 0.5], [0, 1], [0, 1.5]
    v = t(1.0, 2.0)
    th = math.tanh
    expected = t([[th(1) + 2 * th(0.5), th(1) + 2 * th(1.0), th(1) + 2 * th(1.5)]])
    torch.testing.assert_close(concat_score(S_Q, S_M, w_q, w_m, v), expected)
    precomputed = concat_score(S_Q, S_M, w_q, w_m, v, memory_proj=S_M @ w_m.T)
    torch.testing.assert_close(precomputed, expected)


def test_cosine_score_by_hand():
    r5 = math.sqrt(5)
    expected = t([[1 / r5, 2 / r5, 3 / (r5 * math.sqrt(2))]])
    torch.testing.assert_close(cosine_score(S_Q, S_M), expected)


def test_key_strength_by_hand():
    weight, bias = t([0.5, -1.0]), torch.tensor([0.25])  # w . s_t + b = 0.5 - 2 + 0.25 = -1.25
    expected = math.log(1 + math.exp(-1.25))  # softplus
    torch.testing.assert_close(key_strength(S_Q, weight, bias), t([[expected]]))


def test_cosine_attention_can_focus_where_the_bare_cosine_cannot():
    """Bare cosine scores in [-1, 1] cap one position's weight at e^2 / (e^2 + S - 1) (0.28 for
    S = 20); the key strength (about 10 at the start) lets attention pick one position."""
    attn = SourceAttention("cosine", 8, 8, "global", 10, max_positions=32)
    memory = -torch.eye(8)[:1].repeat(20, 1)[None]  # (1, 20, 8), all opposite the query...
    memory[0, 7] = torch.eye(8)[0]  # ... but position 7
    query = torch.eye(8)[:1][None]  # (1, 1, 8)
    _, weights = attn(query, memory, torch.zeros(1, 20, dtype=torch.bool), torch.arange(1))
    beta = key_strength(query, attn.strength.weight, attn.strength.bias).item()
    assert 9 < beta < 11
    bare = math.exp(2) / (math.exp(2) + 19)
    torch.testing.assert_close(weights[0, 0, 7].item(), 1 / (1 + 19 * math.exp(-2 * beta)))
    assert weights[0, 0, 7] > 0.99 > bare


def test_cosine_attention_saved_without_a_key_strength_loads_with_strength_one():
    torch.manual_seed(5)
    attn = SourceAttention("cosine", 4, 4, "global", 10, max_positions=16)
    old = {k: v for k, v in attn.state_dict().items() if not k.startswith("strength.")}
    assert not old  # the bare cosine had no parameters
    attn.load_state_dict(old)
    memory, query = torch.randn(1, 5, 4), torch.randn(1, 3, 4)
    _, weights = attn(query, memory, torch.zeros(1, 5, dtype=torch.bool), torch.arange(3))
    torch.testing.assert_close(weights, torch.softmax(cosine_score(query, memory), -1))


def test_location_score_by_hand_truncated_to_source_length():
    weight = t([1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0])  # 4 positions, source has 3
    bias = t(0.0, 0.5, 0.0, 9.0)
    torch.testing.assert_close(location_score(S_Q, weight, bias, 3), t([[1.0, 2.5, 3.0]]))
    with pytest.raises(ValueError, match="max_positions"):
        location_score(S_Q, weight, bias, 5)


def test_masked_softmax_gives_padding_exactly_zero():
    scores = t([[1.0, 2.0, 50.0]])
    keep = torch.tensor([[[True, True, False]]])
    weights = masked_softmax(scores, keep)
    e1, e2 = math.exp(1), math.exp(2)
    torch.testing.assert_close(weights, t([[e1 / (e1 + e2), e2 / (e1 + e2), 0.0]]))
    assert weights[0, 0, 2].item() == 0.0
    assert not masked_softmax(scores, torch.zeros_like(keep)).any()  # empty row: all zero


@pytest.mark.parametrize("score", ["dot", "general", "concat", "cosine", "location"])
def test_attention_module_weights_padding_exactly_zero(score):
    torch.manual_seed(3)
    attn = SourceAttention(score, 4, 4, "global", 10, max_positions=16)
    memory, query = torch.randn(2, 5, 4), torch.randn(2, 3, 4)
    src_pad = torch.tensor([[False] * 5, [False, False, True, True, True]])
    context, weights = attn(query, memory, src_pad, torch.arange(3), attn.precompute(memory))
    assert weights.shape == (2, 3, 5) and context.shape == (2, 3, 4)
    assert torch.all(weights[1, :, 2:] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3))
    torch.testing.assert_close(context, weights @ memory)


def test_location_attention_uses_only_the_real_source_positions():
    torch.manual_seed(4)
    attn = SourceAttention("location", 2, 3, "global", 10, max_positions=16)
    query = torch.randn(1, 2, 2)
    memory = torch.randn(1, 4, 3)
    src_pad = torch.tensor([[False, False, False, True]])
    _, weights = attn(query, memory, src_pad, torch.arange(2))
    logits = query @ attn.w_loc.weight[:3].T + attn.w_loc.bias[:3]  # (1, 2, 3)
    torch.testing.assert_close(weights[..., :3], torch.softmax(logits, -1))
    assert torch.all(weights[..., 3] == 0)
    with torch.no_grad():  # rows for positions >= 3 play no part
        attn.w_loc.weight[3:] += 5.0
    torch.testing.assert_close(attn(query, memory, src_pad, torch.arange(2))[1], weights)


# --- local attention ------------------------------------------------------------------------

def test_local_window_and_gaussian_by_hand():
    p = t([1.5])  # (B=1, T=1)
    assert local_window(p, 6, 2).tolist() == [[[True, True, True, True, False, False]]]
    expected = [math.exp(-((s - 1.5) ** 2) / 2) for s in range(6)]  # sigma = D / 2 = 1
    torch.testing.assert_close(gaussian(p, 6, 2), t([expected]))


def test_predictive_position_is_source_length_times_sigmoid():
    query = t([[1.0, 0.0]])  # tanh(W_p h) = [tanh 1, 0] with W_p = I
    v_p = t(-math.log(3) / math.tanh(1), 5.0)  # v_p . tanh(W_p h) = -ln 3 -> sigmoid = 1/4
    p = predictive_position(query, torch.eye(2), v_p, torch.tensor([6]))
    torch.testing.assert_close(p, t([1.5]))


def test_local_p_attention_window_and_gaussian_by_hand():
    attn = SourceAttention("dot", 2, 2, window="local-p", d=2, max_positions=16)
    with torch.no_grad():
        attn.w_p.weight.copy_(torch.eye(2))
        attn.v_p.copy_(t(-math.log(3) / math.tanh(1), 0.0))  # p_t = S / 4
    query = t([[1.0, 0.0]], [[1.0, 0.0]])  # (B=2, T=1, H=2)
    memory = torch.zeros(2, 6, 2)  # equal scores: softmax uniform over the window
    src_pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    _, weights = attn(query, memory, src_pad, torch.arange(1))
    # sentence 0: S = 6, p = 1.5, window {0..3}; sentence 1: S = 4, p = 1.0, window {0..3}
    for row, p in ((0, 1.5), (1, 1.0)):
        expected = [0.25 * math.exp(-((s - p) ** 2) / 2) if s <= 3 else 0.0 for s in range(6)]
        torch.testing.assert_close(weights[row, 0], torch.tensor(expected))


def test_local_p_window_holds_2d_plus_1_positions_around_a_fractional_centre():
    """Before: |s - p_t| <= D kept 2D positions when p_t was not whole (found by review);
    Luong et al.'s a_t has 2D + 1, centred on floor(p_t) as in their code."""
    attn = SourceAttention("dot", 2, 2, window="local-p", d=2, max_positions=16)
    with torch.no_grad():
        attn.w_p.weight.copy_(torch.eye(2))
        attn.v_p.copy_(t(-math.log(3) / math.tanh(1), 0.0))  # p_t = S / 4 = 2.5
    _, weights = attn(t([[1.0, 0.0]]), torch.zeros(1, 10, 2), torch.zeros(1, 10, dtype=torch.bool),
                      torch.arange(1))
    expected = [0.2 * math.exp(-((s - 2.5) ** 2) / 2) if s <= 4 else 0.0 for s in range(10)]
    torch.testing.assert_close(weights[0, 0], torch.tensor(expected))  # window {0..4}


def test_local_m_window_follows_target_position_clipped_to_source():
    attn = SourceAttention("dot", 2, 2, window="local-m", d=1, max_positions=16)
    memory = torch.zeros(1, 5, 2)
    src_pad = torch.tensor([[False, False, False, True, True]])  # S = 3
    _, weights = attn(torch.zeros(1, 3, 2), memory, src_pad, torch.tensor([0, 1, 5]))
    expected = t([0.5, 0.5, 0, 0, 0], [1 / 3, 1 / 3, 1 / 3, 0, 0], [0, 0.5, 0.5, 0, 0])
    torch.testing.assert_close(weights[0], expected)  # no Gaussian for local-m (eq. 7)


def test_local_p_window_and_gaussian_unchanged_by_bf16_autocast():
    """p_t and the source positions s must stay float32: in bf16, p = 207.4 rounds to 207
    and positions above 256 collapse in pairs (257 -> 256), moving the window and Gaussian."""
    attn = SourceAttention("dot", 2, 2, window="local-p", d=10, max_positions=1024)
    S, target = 300, 207.4
    with torch.no_grad():
        attn.w_p.weight.copy_(torch.eye(2))
        logit = math.log(target / S / (1 - target / S))  # sigmoid(logit) = p / S
        attn.v_p.copy_(torch.tensor([logit / math.tanh(1.0), 0.0]))
    query = torch.tensor([[[1.0, 0.0]]])
    memory = torch.zeros(1, S, 2)  # equal scores: only the window and the Gaussian matter
    src_pad = torch.zeros(1, S, dtype=torch.bool)
    with torch.no_grad():
        _, exact = attn(query, memory, src_pad, torch.arange(1))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, mixed = attn(query, memory, src_pad, torch.arange(1))
    assert torch.equal(exact > 0, mixed > 0)  # same window: s in [p - D, p + D]
    torch.testing.assert_close(mixed.float(), exact, atol=1e-3, rtol=1e-3)
