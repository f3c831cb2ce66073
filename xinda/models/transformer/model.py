"""The Transformer (Vaswani et al. 2017), composed from the shared layers, with the deep-network
methods and the information-transfer fusion of ``connections`` as options (all off by default).

Encoder layer: self-attention and FFN sub-layers; decoder layer: masked self-attention,
encoder-decoder attention and FFN. Each sub-layer sits in a ``SublayerConnection`` (residual +
LayerNorm, post- or pre-norm, optional layer dropout). Pre-norm stacks end with a final
LayerNorm. How layers feed each other (plain, DLCL, fusion) is in ``connections``.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from xinda.data.vocab import VocabInfo
from xinda.models.base import (
    EncoderOut,
    ModelConfig,
    Seq2SeqModel,
    SharedEncoderOut,
    group_sentences,
    reorder_nested,
)
from xinda.models.layers import (
    FeedForward,
    MultiHeadAttention,
    SublayerConnection,
    TokenEmbedding,
    skip_probability,
)
from xinda.models.transformer.connections import (
    DenseConnection,
    DenseInit,
    GateForm,
    InformationFusion,
    run_plain,
)

Side = Literal["none", "encoder", "decoder", "both"]


class TransformerConfig(ModelConfig):
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
    # Deep Transformers (``connections`` and ``layers.SublayerConnection``).
    dense: Side = "none"  # DLCL on these stacks
    dense_every: int = Field(1, ge=1)  # p: aggregate every p layers (1 = DLCL)
    dense_init: DenseInit = "mean"  # DLCL's initial weights: mean of all, or all on the newest
    layer_dropout: float = Field(0.0, ge=0, lt=1)  # phi: sub-layer l of N skipped w.p. l/N*phi
    layer_dropout_side: Side = "both"
    # Information-transfer enhancement (``connections.InformationFusion``): layer-wise,
    # sub-layer-wise, or once after the last decoder layer ("last", decoder only).
    fusion: Literal["none", "layer", "sublayer", "last"] = "none"
    fusion_function: Literal["mean", "linear"] = "mean"
    fusion_gate: GateForm = "elementwise"  # the retention gate's W (connections.RetentionGate)
    fusion_side: Side = "both"
    residual: bool = True  # False: no residual connections where sub-layer fusion runs

    @property
    def model_dim(self) -> int:
        return self.d_model

    def uses(self, option: str, side: str) -> bool:
        """Does ``dense`` / ``layer_dropout`` / ``fusion`` apply to the encoder or decoder?"""
        where = {"dense": self.dense, "layer_dropout": self.layer_dropout_side,
                 "fusion": self.fusion_side}[option]
        active = {"dense": self.dense != "none", "layer_dropout": self.layer_dropout > 0,
                  "fusion": self.fusion != "none"}[option]
        return active and where in (side, "both")

    @model_validator(mode="after")
    def _check(self) -> TransformerConfig:
        if self.d_model % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide d_model ({self.d_model}): "
                             "each head attends over d_model / heads dimensions")
        for option, active, details in (
                ("dense", self.dense != "none", ("dense_every", "dense_init")),
                ("fusion", self.fusion != "none",
                 ("fusion_function", "fusion_gate", "fusion_side")),
                ("layer_dropout", self.layer_dropout > 0, ("layer_dropout_side",))):
            unused = [f"{d}: {getattr(self, d)}" for d in details if not active
                      and getattr(self, d) not in (type(self).model_fields[d].default, "none")]
            if unused:
                raise ValueError(f"{', '.join(unused)} applies only with {option} on "
                                 f"({option} is {getattr(self, option)!r}): set {option} too, "
                                 "or leave these out")
        if self.dense != "none" and self.fusion != "none":
            raise ValueError("dense (DLCL) and fusion both rewire the layer inputs: pick one")
        if self.fusion != "none" and self.fusion_side == "none":
            raise ValueError(f"fusion {self.fusion!r} needs fusion_side encoder/decoder/both")
        if self.fusion == "last" and self.fusion_side != "decoder":
            raise ValueError("fusion 'last' fuses once after the last decoder layer: set "
                             "fusion_side: decoder")
        if not self.residual and self.fusion != "sublayer":
            raise ValueError("residual: false needs fusion: sublayer (without residuals only "
                             "the sub-layer fusion carries earlier information)")
        if self.layer_dropout > 0 and self.layer_dropout_side == "none":
            raise ValueError("layer_dropout > 0 needs layer_dropout_side encoder/decoder/both")
        if self.layer_dropout > 0 and not self.residual and any(
                self.uses("fusion", side) and self.uses("layer_dropout", side)
                for side in ("encoder", "decoder")):
            raise ValueError("layer_dropout needs the residual connections where it skips "
                             "sub-layers: a skipped sub-layer without one is not its expected "
                             "value (set residual: true or layer_dropout: 0)")
        return self

    def unused_settings(self):
        dense = [s for s in ("encoder", "decoder") if self.uses("dense", s)]
        short = {s: getattr(self, f"{s}_layers") for s in dense
                 if self.dense_every > getattr(self, f"{s}_layers")}  # never aggregates
        if short:  # (connections.py)
            where = (" (a plain Transformer)" if len(short) == len(dense) else
                     f" there (only the {next(s for s in dense if s not in short)}'s acts)")
            yield (f"dense_every {self.dense_every} is more than the layers of "
                   f"{' and '.join(f'{n} {s}' for s, n in short.items())}: DLCL never "
                   f"aggregates{where}")


def sublayer_connection(cfg: TransformerConfig, side: str, index: int,
                        total: int) -> SublayerConnection:
    """The residual block of sub-layer ``index`` (1-based) of ``total`` in the ``side`` stack."""
    skip = skip_probability(index, total, cfg.layer_dropout) if cfg.uses(
        "layer_dropout", side) else 0.0
    residual = cfg.residual or not cfg.uses("fusion", side)
    return SublayerConnection(cfg.d_model, cfg.dropout, cfg.norm == "pre", skip, residual)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig, index: int = 0):
        super().__init__()
        total = 2 * cfg.encoder_layers
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.attention_dropout, True)
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_dim, cfg.activation_dropout, cfg.activation)
        self.attn_sub = sublayer_connection(cfg, "encoder", 2 * index + 1, total)
        self.ffn_sub = sublayer_connection(cfg, "encoder", 2 * index + 2, total)

    def sublayers(self, keep: Tensor) -> list:
        """The two sub-layers as units (B, S, D) -> (B, S, D)."""
        return [lambda x: self.attn_sub(x, lambda y: self.self_attn(y, keep=keep))[0],
                lambda x: self.ffn_sub(x, lambda y: (self.ffn(y), None))[0]]

    def forward(self, x: Tensor, keep: Tensor) -> Tensor:
        return run_plain(x, self.sublayers(keep))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig, index: int = 0):
        super().__init__()
        total = 3 * cfg.decoder_layers
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.attention_dropout, True)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.attention_dropout, False)
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_dim, cfg.activation_dropout, cfg.activation)
        self.self_sub, self.cross_sub, self.ffn_sub = (
            sublayer_connection(cfg, "decoder", 3 * index + k, total) for k in (1, 2, 3))

    def sublayers(self, enc: EncoderOut, cache: dict | None, need_weights: bool,
                  found: dict) -> list:
        """The three sub-layers as units (B, T, D) -> (B, T, D); the cross-attention weights
        land in ``found["attn"]``."""
        self_cache = cross_cache = None
        if cache is not None:
            self_cache, cross_cache = cache.setdefault("self", {}), cache.setdefault("cross", {})

        def cross(x: Tensor) -> Tensor:
            x, found["attn"] = self.cross_sub(x, lambda y: self.cross_attn(
                y, memory=enc.memory, keep=enc.keep, cache=cross_cache,
                need_weights=need_weights, group=getattr(enc, "group", 1)))
            return x

        return [lambda x: self.self_sub(
                    x, lambda y: self.self_attn(y, causal=True, cache=self_cache))[0],
                cross,
                lambda x: self.ffn_sub(x, lambda y: (self.ffn(y), None))[0]]


def make_connection(cfg: TransformerConfig, side: str, layers: int,
                    sublayers_per_layer: int) -> nn.Module | None:
    """The ``side`` stack's DLCL or fusion module, or None for plain connections."""
    pre = cfg.norm == "pre"
    if cfg.uses("dense", side):
        return DenseConnection(layers, cfg.d_model, cfg.dense_every, pre, cfg.dense_init)
    if cfg.uses("fusion", side):
        units = layers * (1 if cfg.fusion == "layer" else sublayers_per_layer)
        return InformationFusion(units, cfg.d_model, cfg.fusion_function, cfg.fusion == "last",
                                 cfg.fusion_gate)
    return None


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
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg, i)
                                            for i in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg, i)
                                            for i in range(cfg.decoder_layers))
        self.encoder_connection = make_connection(cfg, "encoder", cfg.encoder_layers, 2)
        self.decoder_connection = make_connection(cfg, "decoder", cfg.decoder_layers, 3)
        final = cfg.norm == "pre"  # pre-norm's stream is un-normalised (Xiong et al. 2020, table 1)
        self.encoder_norm = nn.LayerNorm(d) if final else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d) if final else nn.Identity()
        self.output = nn.Linear(d, vocab.tgt_size, bias=False)
        if cfg.tie_output:  # one matrix (Press & Wolf 2017; Vaswani et al. 2017, sec. 3.4)
            self.output.weight = self.tgt_embed.embed.weight
        else:
            nn.init.normal_(self.output.weight, std=d**-0.5)

    def _units_of(self, layers: list, sublayers: list[list]) -> list:
        """Layer units, or the flat list of sub-layer units for sub-layer-wise fusion."""
        if self.cfg.fusion in ("sublayer", "last"):
            return [unit for group in sublayers for unit in group]
        return layers

    def encode(self, src: Tensor) -> EncoderOut:
        src_pad = src.eq(self.vocab.pad)  # (B, S)
        keep = ~src_pad[:, None, None, :]  # (B, 1, 1, S)
        x = self.src_embed(src)  # (B, S, D)
        if self.encoder_connection is None:
            for layer in self.encoder_layers:
                x = layer(x, keep)
        else:
            layers = [lambda y, layer=layer: layer(y, keep) for layer in self.encoder_layers]
            sublayers = [layer.sublayers(keep) for layer in self.encoder_layers]
            x = self.encoder_connection(x, self._units_of(layers, sublayers))
        return SharedEncoderOut(self.encoder_norm(x), src_pad)

    def decode(self, prev: Tensor, enc: EncoderOut, state: dict | None = None,
               need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        x, attn = self._decode_states(prev, enc, state, need_weights)
        return self.output(x), attn  # (B, T, V), (B, T, S)

    def decode_hidden(self, prev: Tensor, enc: EncoderOut) -> Tensor:
        return self._decode_states(prev, enc, None, False)[0]

    def _decode_states(self, prev: Tensor, enc: EncoderOut, state: dict | None,
                       need_weights: bool) -> tuple[Tensor, Tensor | None]:
        """The final (normalised) decoder states (B, T, D) and the last layer's cross-attention
        weights (B, T, S) when asked."""
        start = 0 if state is None else state.get("step", 0)
        x = self.tgt_embed(prev, start=start)  # (B, T, D)
        caches: list = [None] * len(self.decoder_layers)
        if state is not None:
            caches = state.setdefault("layers", [{} for _ in self.decoder_layers])
            state["step"] = start + prev.size(1)
            state["group"] = getattr(enc, "group", 1)  # rows per cross-attention cache row
        last = len(self.decoder_layers) - 1
        found: dict = {}  # the last layer's cross-attention weights
        sublayers = [layer.sublayers(enc, caches[i], need_weights and i == last,
                                     found if i == last else {})
                     for i, layer in enumerate(self.decoder_layers)]
        if self.decoder_connection is None:
            x = run_plain(x, [unit for group in sublayers for unit in group])
        else:
            layers = [lambda y, group=group: run_plain(y, group) for group in sublayers]
            x = self.decoder_connection(x, self._units_of(layers, sublayers))
        return self.decoder_norm(x), found.get("attn")

    def reorder_state(self, state: dict, order: Tensor) -> None:
        """Self-attention caches follow the rows; cross-attention caches, one row per
        sentence when grouped (``SharedEncoderOut``), follow the rows' sentences."""
        group, layers = state.get("group", 1), state.get("layers", [])
        sentences = order if group == 1 else group_sentences(order, group)
        cached = layers[0].get("cross", {}).get("k") if layers else None
        same = group > 1 and cached is not None and sentences.numel() == cached.size(0) and \
            bool(sentences.eq(torch.arange(sentences.numel(), device=order.device)).all())
        for cache in layers:
            reorder_nested(cache.get("self", {}), order)
            if not same:  # beams moved within their sentences: the sentences stay put
                reorder_nested(cache.get("cross", {}), sentences)
