"""The Transformer (Vaswani et al. 2017), composed from the shared layers.

Encoder layer: self-attention and FFN sub-layers; decoder layer: masked self-attention,
encoder-decoder attention and FFN. Each sub-layer sits in a ``SublayerConnection`` (residual +
LayerNorm, post- or pre-norm). Pre-norm stacks end with a final LayerNorm.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import Tensor, nn

from xinda.config import Strict
from xinda.models.base import EncoderOut, Seq2SeqModel, VocabInfo, reorder_nested
from xinda.models.layers import FeedForward, MultiHeadAttention, SublayerConnection, TokenEmbedding


class TransformerConfig(Strict):
    arch: Literal["transformer"] = "transformer"
    d_model: int = Field(512, ge=8)
    heads: int = Field(8, ge=1)
    ffn_dim: int = Field(2048, ge=1)
    encoder_layers: int = Field(6, ge=1)
    decoder_layers: int = Field(6, ge=1)
    dropout: float = Field(0.1, ge=0, lt=1)  # embeddings+positions and every residual branch
    attention_dropout: float = Field(0.1, ge=0, lt=1)  # on attention weights
    activation_dropout: float = Field(0.1, ge=0, lt=1)  # after the FFN's ReLU
    activation: Literal["relu", "gelu"] = "relu"
    norm: Literal["post", "pre"] = "post"  # where each sub-layer's LayerNorm sits
    share_embeddings: bool = True  # one source/target table, when the vocabulary is joint
    tie_output: bool = True  # output projection = target embedding matrix
    max_positions: int = Field(1024, ge=16)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.attention_dropout, True)
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_dim, cfg.activation_dropout, cfg.activation)
        self.attn_sub = SublayerConnection(cfg.d_model, cfg.dropout, pre)
        self.ffn_sub = SublayerConnection(cfg.d_model, cfg.dropout, pre)

    def forward(self, x: Tensor, keep: Tensor) -> Tensor:
        x, _ = self.attn_sub(x, lambda y: self.self_attn(y, keep=keep))
        x, _ = self.ffn_sub(x, lambda y: (self.ffn(y), None))
        return x


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.attention_dropout, True)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.attention_dropout, False)
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_dim, cfg.activation_dropout, cfg.activation)
        self.self_sub, self.cross_sub, self.ffn_sub = (
            SublayerConnection(cfg.d_model, cfg.dropout, pre) for _ in range(3))

    def forward(self, x: Tensor, enc: EncoderOut, cache: dict | None,
                need_weights: bool) -> tuple[Tensor, Tensor | None]:
        self_cache = cross_cache = None
        if cache is not None:
            self_cache, cross_cache = cache.setdefault("self", {}), cache.setdefault("cross", {})
        x, _ = self.self_sub(x, lambda y: self.self_attn(y, causal=True, cache=self_cache))
        x, attn = self.cross_sub(x, lambda y: self.cross_attn(
            y, memory=enc.memory, keep=enc.keep, cache=cross_cache, need_weights=need_weights))
        x, _ = self.ffn_sub(x, lambda y: (self.ffn(y), None))
        return x, attn


class Transformer(Seq2SeqModel):
    def __init__(self, cfg: TransformerConfig, vocab: VocabInfo):
        super().__init__()
        self.cfg, self.vocab = cfg, vocab
        d = cfg.d_model

        def embedding(size: int) -> TokenEmbedding:
            return TokenEmbedding(size, d, vocab.pad, cfg.dropout, cfg.max_positions)

        self.src_embed = embedding(vocab.src_size)
        shared = cfg.share_embeddings and vocab.joint
        self.tgt_embed = self.src_embed if shared else embedding(vocab.tgt_size)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        final = cfg.norm == "pre"  # pre-norm leaves the residual stream un-normalised
        self.encoder_norm = nn.LayerNorm(d) if final else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d) if final else nn.Identity()
        self.output = nn.Linear(d, vocab.tgt_size, bias=False)
        if cfg.tie_output:
            self.output.weight = self.tgt_embed.embed.weight
        else:
            nn.init.normal_(self.output.weight, std=d**-0.5)

    def encode(self, src: Tensor) -> EncoderOut:
        src_pad = src.eq(self.vocab.pad)  # (B, S)
        keep = ~src_pad[:, None, None, :]  # (B, 1, 1, S)
        x = self.src_embed(src)  # (B, S, D)
        for layer in self.encoder_layers:
            x = layer(x, keep)
        return EncoderOut(self.encoder_norm(x), src_pad)

    def decode(self, prev: Tensor, enc: EncoderOut, state: dict | None = None,
               need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        start = 0 if state is None else state.get("step", 0)
        x = self.tgt_embed(prev, start=start)  # (B, T, D)
        caches = None
        if state is not None:
            caches = state.setdefault("layers", [{} for _ in self.decoder_layers])
            state["step"] = start + prev.size(1)
        attn = None
        for i, layer in enumerate(self.decoder_layers):
            last = i == len(self.decoder_layers) - 1
            x, a = layer(x, enc, None if caches is None else caches[i], need_weights and last)
            attn = a if last else attn
        return self.output(self.decoder_norm(x)), attn  # (B, T, V), (B, T, S) or None

    def reorder_state(self, state: dict, order: Tensor) -> None:
        reorder_nested(state.get("layers", []), order)
