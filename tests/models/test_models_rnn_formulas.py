"""Recurrent decoder steps recomputed by hand from the module's own parameters: the published
equations of Luong et al. 2015 (input feeding) and Bahdanau et al. 2015 (the previous top
state queries, deep-output readout with the previous target embedding). The incremental vs
full-pass and batch-invariance tests elsewhere also pass with wrong formulas; these do not."""

import torch

# embed != hidden != memory width, so a misplaced term fails on shapes or on values
TINY = {"arch": "rnn", "embed_dim": 6, "hidden_dim": 8, "dropout": 0.0,
        "decoder_init": "zeros", "encoder_layers": 1, "decoder_layers": 2}


def lstm_step(rnn, x, h, c):
    """One LSTM step with gates i, f, g, o (PyTorch's layout) written out."""
    pre = x @ rnn.weight_ih_l0.T + rnn.bias_ih_l0 + h @ rnn.weight_hh_l0.T + rnn.bias_hh_l0
    i, f, g, o = pre.chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def attend(scores, memory, src_pad):
    """softmax over the real source positions of scores (B, S) -> context (B, M), weights."""
    weights = torch.softmax(scores.masked_fill(src_pad, float("-inf")), dim=-1)
    return (weights[:, :, None] * memory).sum(1), weights


def spread(model):
    """Every parameter drawn from N(0, 0.8^2): at the default initialisation the states are
    ~1e-3, too small for a wrong query or a dropped term to move the logits visibly."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.8 * torch.randn(p.shape, generator=g))
    return model


def run_model(model, src, prev):
    with torch.no_grad():
        enc = model.encode(src)
        logits, attn = model.decode(prev, enc, need_weights=True)
    return enc, logits, attn


def test_luong_input_feeding_by_hand(make_model, make_src, make_prev):
    """Luong sec. 3.3: h~_{t-1} = tanh(W_c [c_{t-1}; h_{t-1}]) is concatenated to E y_t at the
    bottom input; h_t (top layer) queries with the general score h_t^T W h_s."""
    model = spread(make_model(TINY, attention="general", attention_style="luong",
                              input_feeding=True))
    src, prev = make_src([5, 3]), make_prev(2, 3)
    enc, logits, attn = run_model(model, src, prev)
    dec, b, hdim = model.decoder, src.size(0), 8
    with torch.no_grad():
        emb = model.tgt_embed(prev)
        hidden = [[torch.zeros(b, hdim), torch.zeros(b, hdim)] for _ in range(2)]
        feed = torch.zeros(b, hdim)  # h~_0 = 0
        want_logits, want_attn = [], []
        for t in range(prev.size(1)):
            x = torch.cat([emb[:, t], feed], -1)
            for i, rnn in enumerate(dec.layers):
                hidden[i] = list(lstm_step(rnn, x, *hidden[i]))
                x = hidden[i][0]
            h = x  # top layer h_t
            scores = ((h @ dec.attention.w)[:, None] * enc.memory).sum(-1)  # (B, S)
            context, weights = attend(scores, enc.memory, enc.src_pad)
            feed = torch.tanh(torch.cat([context, h], -1) @ dec.combine.weight.T
                              + dec.combine.bias)
            want_logits.append(model.output(feed))
            want_attn.append(weights)
    torch.testing.assert_close(attn, torch.stack(want_attn, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, torch.stack(want_logits, 1), atol=1e-5, rtol=1e-5)


def test_bahdanau_step_by_hand(make_model, make_src, make_prev):
    """Bahdanau eq. 4-6 with two decoder layers: the TOP layer's previous state s_{t-1}
    queries v^T tanh(W_q s + W_m h), s_t = RNN([E y_{t-1}; c_t]) and the deep-output readout
    tanh(W_o [s_t; c_t; E y_{t-1}]) includes the previous target embedding."""
    model = spread(make_model(TINY, attention="concat", attention_style="bahdanau",
                              bidirectional=True))
    src, prev = make_src([5, 3]), make_prev(2, 3)
    enc, logits, attn = run_model(model, src, prev)
    dec, b, hdim = model.decoder, src.size(0), 8
    att = dec.attention
    with torch.no_grad():
        emb = model.tgt_embed(prev)
        hidden = [[torch.zeros(b, hdim), torch.zeros(b, hdim)] for _ in range(2)]
        keys = enc.memory @ att.w_memory.weight.T  # (B, S, A)
        want_logits, want_attn = [], []
        for t in range(prev.size(1)):
            query = hidden[-1][0] @ att.w_query.weight.T  # s_{t-1} of the top layer
            scores = torch.tanh(query[:, None] + keys) @ att.v  # (B, S)
            context, weights = attend(scores, enc.memory, enc.src_pad)
            x = torch.cat([emb[:, t], context], -1)
            for i, rnn in enumerate(dec.layers):
                hidden[i] = list(lstm_step(rnn, x, *hidden[i]))
                x = hidden[i][0]
            readout = torch.tanh(torch.cat([x, context, emb[:, t]], -1) @ dec.readout.weight.T
                                 + dec.readout.bias)
            want_logits.append(model.output(readout))
            want_attn.append(weights)
    torch.testing.assert_close(attn, torch.stack(want_attn, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, torch.stack(want_logits, 1), atol=1e-5, rtol=1e-5)
