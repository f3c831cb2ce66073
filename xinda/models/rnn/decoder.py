"""Recurrent decoders: no attention (Sutskever), Bahdanau, Luong and GNMT attention styles.

All state lives in a dict so one step at a time and teacher forcing run the same code:
``hidden`` (per layer [h] or [h, c], each (B, H)), ``feed`` (B, 1, F) the input-feeding vector,
``keys`` (B, S, A) the precomputed part of concat scores, and ``step`` (target positions done).
Without feedback from one step's output into the next input (Bahdanau style or input feeding)
a whole teacher-forced prefix runs through the fused RNNs at once; otherwise step by step.
Shapes: B batch, T target length, S source length, E embedding, H hidden, M memory width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from xinda.models.layers import Dropout
from xinda.models.rnn.attention import SourceAttention
from xinda.models.rnn.cells import from_module_state, make_rnn, run_rnn, step_fused, to_module_state
from xinda.models.rnn.config import RNNConfig
from xinda.models.rnn.encoder import RNNEncoderOut


def _linear(n_in: int, n_out: int) -> nn.Linear:
    lin = nn.Linear(n_in, n_out)
    nn.init.xavier_uniform_(lin.weight)
    nn.init.zeros_(lin.bias)
    return lin


class RNNDecoder(nn.Module):
    def __init__(self, cfg: RNNConfig):
        super().__init__()
        self.cfg = cfg
        h, e, m = cfg.hidden_dim, cfg.embed_dim, cfg.memory_dim
        self.style = "none" if cfg.attention == "none" else cfg.attention_style
        self.feed_dim = {"luong": h, "gnmt": m}.get(self.style, 0) if cfg.input_feeding else 0
        bottom = e + (m if self.style == "bahdanau" else 0) + self.feed_dim
        upper = h + (m if self.style == "gnmt" else 0)
        self.layers = nn.ModuleList(make_rnn(cfg.cell, bottom if i == 0 else upper, h)
                                    for i in range(cfg.decoder_layers))
        if self.style != "none":
            self.attention = SourceAttention(cfg.attention, h, m, cfg.attention_window,
                                             cfg.window_d, cfg.max_positions)
        if self.style == "luong":
            self.combine = _linear(m + h, h)  # W_c of h~_t = tanh(W_c [c_t; h_t])
        if self.style == "bahdanau":
            self.readout = _linear(h + m + e, h)  # deep output tanh(W_o [s_t; c_t; E y_{t-1}])
        if cfg.decoder_init == "learned":
            parts = 2 if cfg.cell == "lstm" else 1
            layout = cfg.encoder_layout()
            self.bridges = nn.ModuleList(
                nn.ModuleList(_linear(layout[self._source_layer(i)][1], h) for _ in range(parts))
                for i in range(cfg.decoder_layers))
        self.dropout = Dropout(cfg.dropout)
        self.stepwise = self.style == "bahdanau" or cfg.input_feeding
        self.reference = False  # True: the readable cells instead of the fused modules

    def _source_layer(self, layer: int) -> int:
        """Encoder layer whose final state initialises decoder ``layer``: tops aligned when
        the encoder is deeper, the top encoder layer repeated when the decoder is deeper."""
        shift = max(self.cfg.encoder_layers - self.cfg.decoder_layers, 0)
        return min(layer + shift, self.cfg.encoder_layers - 1)

    def initial_state(self, enc: RNNEncoderOut) -> dict:
        """Decoder state before the first target token (``decoder_init``): zeros, the encoder's
        final states copied (Sutskever), or learned s_0 = tanh(W_s h_enc) (Bahdanau sec. A.2.2)
        for each layer and state part, directions concatenated (A.2.2 takes the backward
        direction's first state only, without a bias; here both directions and a bias)."""
        batch, h = enc.memory.size(0), self.cfg.hidden_dim
        parts = 2 if self.cfg.cell == "lstm" else 1
        if self.cfg.decoder_init == "zeros":
            hidden = [[enc.memory.new_zeros(batch, h) for _ in range(parts)]
                      for _ in self.layers]
        elif self.cfg.decoder_init == "final":
            hidden = [list(enc.final[i]) for i in range(len(self.layers))]
        else:
            hidden = [[torch.tanh(bridge(state)) for bridge, state in
                       zip(self.bridges[i], enc.final[self._source_layer(i)])]
                      for i in range(len(self.layers))]
        state = {"hidden": hidden, "step": 0}
        if self.feed_dim:
            state["feed"] = enc.memory.new_zeros(batch, 1, self.feed_dim)
        keys = self.attention.precompute(enc.memory) if self.style != "none" else None
        if keys is not None:
            state["keys"] = keys
        return state

    def _layer(self, i: int, x: Tensor, state: dict) -> Tensor:
        """Decoder layer i over x (B, T, In), continuing from and updating its state."""
        kind = self.cfg.cell
        if x.size(1) == 1 and not self.reference:  # one step: the cell kernel
            state["hidden"][i] = step_fused(self.layers[i], x[:, 0], state["hidden"][i])
            return state["hidden"][i][0][:, None]  # (B, 1, H)
        out, new = run_rnn(self.layers[i], x, to_module_state(kind, state["hidden"][i]),
                           self.reference)
        state["hidden"][i] = from_module_state(kind, new)
        return out  # (B, T, H)

    def _stack(self, x: Tensor, state: dict, first: int, context: Tensor | None = None) -> Tensor:
        """Layers first.. over x (B, T, In): dropout between layers, ``context`` (B, T, M)
        joins every layer's input (GNMT), residual layers add their hidden input before
        dropout, as TF-NMT's ResidualWrapper around its DropoutWrapper does."""
        for i in range(first, len(self.layers)):
            inp = self.dropout(x) if i > 0 else x  # dropout between layers
            out = self._layer(i, inp if context is None else torch.cat([inp, context], -1), state)
            x = out + x if self.cfg.residual(i) else out
        return x  # (B, T, H)

    def _attend(self, query: Tensor, enc: RNNEncoderOut, state: dict, steps: Tensor):
        return self.attention(query, enc.memory, enc.src_pad, steps, state.get("keys"))

    def _none(self, x: Tensor, enc: RNNEncoderOut, state: dict, steps: Tensor):
        """Sutskever et al. 2014: logits from the top state alone."""
        return self._stack(x, state, 0), None

    def _bahdanau(self, x: Tensor, enc: RNNEncoderOut, state: dict, steps: Tensor):
        """Bahdanau et al. 2015 eq. 4-6 (one step): the previous top state s_{t-1} queries,
        s_t = RNN([E y_{t-1}; c_t], s_{t-1}), readout tanh(W_o [s_t; c_t; E y_{t-1}]): a tanh
        deep output where A.2.2 uses maxout, and s_t as eq. 4 has it (A.2.2 writes s_{t-1})."""
        query = state["hidden"][-1][0][:, None]  # (B, 1, H) s_{t-1}
        context, weights = self._attend(query, enc, state, steps)  # (B, 1, M), (B, 1, S)
        s = self._stack(torch.cat([x, context], -1), state, 0)  # (B, 1, H)
        return torch.tanh(self.readout(torch.cat([s, context, x], -1))), weights

    def _luong(self, x: Tensor, enc: RNNEncoderOut, state: dict, steps: Tensor):
        """Luong et al. 2015 eq. 5: the current top state h_t queries, attentional vector
        h~_t = tanh(W_c [c_t; h_t]); with input feeding h~_{t-1} joins the input (sec. 3.3)."""
        if self.feed_dim:
            x = torch.cat([x, state["feed"]], -1)  # (B, 1, E + H)
        h = self._stack(x, state, 0)  # (B, T, H)
        context, weights = self._attend(h, enc, state, steps)  # (B, T, M), (B, T, S)
        attentional = torch.tanh(self.combine(torch.cat([context, h], -1)))  # (B, T, H)
        if self.feed_dim:
            state["feed"] = attentional
        return attentional, weights

    def _gnmt(self, x: Tensor, enc: RNNEncoderOut, state: dict, steps: Tensor):
        """GNMT (Wu et al. 2016 sec. 3): the context joins the input of every higher layer; with
        input feeding c_{t-1} joins the bottom input. The query is the bottom layer's output at
        this step, as TensorFlow NMT's GNMT cell does (the paper uses the previous step's)."""
        if self.feed_dim:
            x = torch.cat([x, state["feed"]], -1)  # (B, 1, E + M)
        bottom = self._layer(0, x, state)  # (B, T, H)
        context, weights = self._attend(bottom, enc, state, steps)  # (B, T, M), (B, T, S)
        if self.feed_dim:
            state["feed"] = context
        return self._stack(bottom, state, 1, context), weights

    def forward(self, emb: Tensor, enc: RNNEncoderOut, state: dict) -> tuple[Tensor, Tensor | None]:
        """emb (B, T, E) embedded targets -> readout (B, T, H) for the output layer and source
        attention (B, T, S) or None. ``state`` is filled on the first call and updated."""
        if "hidden" not in state:
            state.update(self.initial_state(enc))
        run = {"none": self._none, "bahdanau": self._bahdanau, "luong": self._luong,
               "gnmt": self._gnmt}[self.style]
        outs, attns = [], []
        for x in emb.split(1, dim=1) if self.stepwise else [emb]:
            steps = torch.arange(x.size(1), device=x.device) + state["step"]  # (T,)
            out, attn = run(x, enc, state, steps)
            state["step"] += x.size(1)
            outs.append(out)
            attns.append(attn)
        attn = None if attns[0] is None else torch.cat(attns, 1)
        return torch.cat(outs, 1), attn
