"""Recurrent encoder: a stack of (bi)directional layers over packed, padded sentences.

Options: bidirectional layers (Bahdanau et al. 2015: forward and backward states concatenated),
bidirectional bottom layer only and residual connections from a given layer up (GNMT, Wu et
al. 2016 sec. 3.1-3.2), source reversal (Sutskever et al. 2014 sec. 3.3) and dropout between layers.
Shapes: B batch, S source length, E embedding width, H hidden width per direction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from xinda.models.base import EncoderOut
from xinda.models.layers import Dropout
from xinda.models.rnn.cells import from_module_state, make_rnn, run_rnn
from xinda.models.rnn.config import RNNConfig


@dataclass
class RNNEncoderOut(EncoderOut):
    # per encoder layer: [h] or, for LSTMs, [h, c]; each (B, dirs*H), directions concatenated
    final: list[list[Tensor]]

    def reorder(self, order: Tensor) -> RNNEncoderOut:
        return RNNEncoderOut(self.memory.index_select(0, order),
                             self.src_pad.index_select(0, order),
                             [[t.index_select(0, order) for t in layer] for layer in self.final])


def reverse_padded(x: Tensor, lengths: Tensor) -> Tensor:
    """Reverse the first lengths[b] positions of each row of x (B, S, ...); padding stays put.
    Its own inverse, so it both reverses a source and flips the memory back."""
    pos = torch.arange(x.size(1), device=x.device)[None]  # (1, S)
    n = lengths[:, None]  # (B, 1)
    index = torch.where(pos < n, n - 1 - pos, pos)  # (B, S)
    index = index.view(*index.shape, *[1] * (x.dim() - 2)).expand_as(x)
    return x.gather(1, index)


class RNNEncoder(nn.Module):
    """Layer stack over the embedded source; returns the memory in source order and each
    layer's final state. One fused module per layer, so layers can differ (bidirectional
    bottom, residual connections, dropout in between)."""

    def __init__(self, cfg: RNNConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(make_rnn(cfg.cell, width, out // (2 if bi else 1), bi)
                                    for width, out, bi in cfg.encoder_layout())
        self.dropout = Dropout(cfg.dropout)
        self.reference = False  # True: run the readable cells, one sentence at a time

    def _packed(self, rnn: nn.RNNBase, x: Tensor, lengths: Tensor):
        """Fast path: the fused module over packed sentences. x (B, S, D) -> (B, S, dirs*H)."""
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, state = rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))
        return out, state

    def _unpadded(self, rnn: nn.RNNBase, x: Tensor, lengths: Tensor):
        """Reference path: each sentence alone, without its padding, through the plain cells."""
        outs, states = x.new_zeros(*x.shape[:2], rnn.hidden_size * (1 + rnn.bidirectional)), []
        for b, n in enumerate(lengths.tolist()):
            out, state = run_rnn(rnn, x[b:b + 1, :n], reference=True)
            outs[b, :n] = out[0]
            states.append(state)
        if isinstance(states[0], tuple):  # LSTM: (h, c), each (dirs, 1, H)
            return outs, tuple(torch.cat(parts, 1) for parts in zip(*states))
        return outs, torch.cat(states, 1)  # (dirs, B, H)

    def forward(self, src_embed: Tensor, src_pad: Tensor) -> RNNEncoderOut:
        """src_embed (B, S, E) embedded, dropped-out source; src_pad (B, S) True at padding."""
        lengths = (~src_pad).sum(1).clamp(min=1)  # (B,) an empty source reads one pad
        x = reverse_padded(src_embed, lengths) if self.cfg.reverse_source else src_embed
        run = self._unpadded if self.reference else self._packed
        final = []
        for layer, rnn in enumerate(self.layers):
            inp = self.dropout(x) if layer > 0 else x  # dropout between layers
            out, state = run(rnn, inp, lengths)  # (B, S, dirs*H)
            x = out + x if self.cfg.residual(layer) else out  # residual: the undropped input
            final.append(from_module_state(self.cfg.cell, state))
        memory = reverse_padded(x, lengths) if self.cfg.reverse_source else x  # (B, S, M)
        return RNNEncoderOut(memory, src_pad, final)
