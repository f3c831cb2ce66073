"""The recurrent encoder-decoder: embeddings, encoder, decoder and output softmax.

Sutskever et al. 2014 (no attention), Bahdanau et al. 2015, Luong et al. 2015 and GNMT
(Wu et al. 2016) are configurations of this one model; see ``RNNConfig``.
"""

from __future__ import annotations

from torch import Tensor, nn

from xinda.data.vocab import VocabInfo
from xinda.models.base import Seq2SeqModel, reorder_nested
from xinda.models.layers import Dropout
from xinda.models.rnn.config import RNNConfig
from xinda.models.rnn.decoder import RNNDecoder
from xinda.models.rnn.encoder import RNNEncoder, RNNEncoderOut


def _embedding(size: int, dim: int, pad: int) -> nn.Embedding:
    """Uniform(-0.1, 0.1) as in Luong et al. 2015 (Sutskever et al. 2014: +-0.08); the padding
    row is 0."""
    embed = nn.Embedding(size, dim, padding_idx=pad)
    nn.init.uniform_(embed.weight, -0.1, 0.1)
    embed.weight.data[pad].zero_()
    return embed


class RNNModel(Seq2SeqModel):
    """Embeddings -> ``RNNEncoder`` -> ``RNNDecoder`` -> dropout -> linear softmax layer."""

    def __init__(self, cfg: RNNConfig, vocab: VocabInfo):
        super().__init__()
        self.cfg, self.vocab = cfg, vocab
        self.src_embed = _embedding(vocab.src_size, cfg.embed_dim, vocab.pad)
        shared = cfg.share_embeddings and vocab.joint
        self.tgt_embed = (self.src_embed if shared
                          else _embedding(vocab.tgt_size, cfg.embed_dim, vocab.pad))
        self.encoder = RNNEncoder(cfg)
        self.decoder = RNNDecoder(cfg)
        self.dropout = Dropout(cfg.dropout)
        self.output = nn.Linear(cfg.hidden_dim, vocab.tgt_size)
        nn.init.zeros_(self.output.bias)
        if cfg.tie_output:  # one matrix (Press & Wolf 2017)
            self.output.weight = self.tgt_embed.weight
        else:
            nn.init.xavier_uniform_(self.output.weight)

    def set_reference(self, reference: bool = True) -> RNNModel:
        """Run the readable cells instead of the fused modules (slow; for tests)."""
        self.encoder.reference = self.decoder.reference = reference
        return self

    def encode(self, src: Tensor) -> RNNEncoderOut:
        """src (B, S) right-padded ids -> memory (B, S, M) and the final states."""
        src_pad = src.eq(self.vocab.pad)  # (B, S)
        return self.encoder(self.dropout(self.src_embed(src)), src_pad)

    def decode(self, prev: Tensor, enc: RNNEncoderOut, state: dict | None = None,
               need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """prev (B, T) -> logits (B, T, V) and, when asked, attention (B, T, S) (None without
        attention). Without ``state`` the whole prefix is teacher-forced from the start."""
        state = {} if state is None else state
        readout, attn = self.decoder(self.dropout(self.tgt_embed(prev)), enc, state)
        logits = self.output(self.dropout(readout))  # (B, T, V)
        return logits, attn if need_weights else None

    def decode_hidden(self, prev: Tensor, enc: RNNEncoderOut) -> Tensor:
        """The (dropped-out) readout (B, T, H) that ``output`` projects to the logits."""
        readout, _ = self.decoder(self.dropout(self.tgt_embed(prev)), enc, {})
        return self.dropout(readout)

    def reorder_state(self, state: dict, order: Tensor) -> None:
        reorder_nested(state, order)
