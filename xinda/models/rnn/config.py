"""Typed configuration of the recurrent encoder-decoder, with its impossible combinations."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from xinda.models.base import ModelConfig


class RNNConfig(ModelConfig):
    arch: Literal["rnn"] = "rnn"
    cell: Literal["lstm", "gru", "rnn"] = "lstm"  # rnn = Elman tanh RNN
    embed_dim: int = Field(256, ge=1)
    hidden_dim: int = Field(256, ge=1)  # per direction in bidirectional encoder layers
    encoder_layers: int = Field(2, ge=1)
    decoder_layers: int = Field(2, ge=1)
    bidirectional: bool = False  # encoder layers read both ways (outputs concatenated)
    bidirectional_bottom_only: bool = False  # GNMT: only encoder layer 1 is bidirectional
    residual_from: int = Field(0, ge=0)  # layers >= this (1-based) add their input; 0 = none
    reverse_source: bool = False  # Sutskever: encode each source reversed (memory flipped back)
    attention: Literal["none", "dot", "general", "concat", "cosine", "location"] = "general"
    # bahdanau: s_{t-1} queries, context joins the RNN input; luong: h_t queries,
    # h~_t = tanh(W_c [c_t; h_t]) feeds the softmax; gnmt: the bottom layer's output queries,
    # the context joins the input of every higher layer
    attention_style: Literal["bahdanau", "luong", "gnmt"] = "luong"
    attention_window: Literal["global", "local-m", "local-p"] = "global"
    window_d: int = Field(10, ge=1)  # local attention half-width D (sigma = D / 2)
    input_feeding: bool = False  # Luong: h~_{t-1} joins the input (gnmt: context c_{t-1})
    decoder_init: Literal["learned", "zeros", "final"] = "learned"
    dropout: float = Field(0.2, ge=0, lt=1)  # embeddings, between layers, before the softmax
    share_embeddings: bool = True  # one source/target table, when the vocabulary is joint
    tie_output: bool = False  # output projection = target embeddings (needs embed = hidden)

    @property
    def model_dim(self) -> int:
        return self.hidden_dim

    @property
    def has_attention(self) -> bool:
        return self.attention != "none"

    def encoder_layout(self) -> list[tuple[int, int, bool]]:
        """(input width, output width, bidirectional) of each encoder layer."""
        layout, width = [], self.embed_dim
        for layer in range(self.encoder_layers):
            bi = self.bidirectional and (layer == 0 or not self.bidirectional_bottom_only)
            out = self.hidden_dim * (2 if bi else 1)
            layout.append((width, out, bi))
            width = out
        return layout

    @property
    def memory_dim(self) -> int:
        return self.encoder_layout()[-1][1]

    def residual(self, layer: int) -> bool:
        """Does 0-based ``layer`` add its input to its output?"""
        return self.residual_from > 0 and layer + 1 >= self.residual_from

    @model_validator(mode="after")
    def _check(self) -> RNNConfig:
        for problem in self._problems():
            raise ValueError(problem)
        return self

    def unused_settings(self):
        changed = {k for k in ("attention_style", "window_d")
                   if getattr(self, k) != type(self).model_fields[k].default}
        if self.attention == "none" and "attention_style" in changed:
            yield f"attention_style {self.attention_style} needs attention (attention is 'none')"
        if self.attention_window == "global" and "window_d" in changed:
            yield "window_d applies only with attention_window local-m or local-p"
        if self.residual_from > max(self.encoder_layers, self.decoder_layers):
            yield (f"residual_from {self.residual_from} is above the {self.encoder_layers}+"
                   f"{self.decoder_layers} layers: no layer adds its input (0 = none)")

    def _problems(self):
        attn = self.attention != "none"
        if self.bidirectional_bottom_only and not self.bidirectional:
            yield "bidirectional_bottom_only needs bidirectional: true"
        if not attn and self.input_feeding:
            yield "input_feeding needs attention (attention is 'none')"
        if not attn and self.attention_window != "global":
            yield "a local attention_window needs attention (attention is 'none')"
        if self.attention == "location" and self.attention_window != "global":
            yield "location attention has no content scores to window: use attention_window global"
        if self.attention in ("dot", "cosine") and self.memory_dim != self.hidden_dim:
            yield (f"{self.attention} attention needs encoder output width {self.memory_dim} == "
                   f"hidden_dim {self.hidden_dim}: use general/concat or a unidirectional top "
                   "layer")
        if attn and self.input_feeding and self.attention_style == "bahdanau":
            yield "bahdanau style already feeds the context to the RNN: input_feeding must be false"
        if attn and self.attention_style == "gnmt" and self.decoder_layers < 2:
            yield "gnmt attention style feeds the layers above the bottom: decoder_layers >= 2"
        if self.decoder_init == "final" and (self.bidirectional
                                             or self.encoder_layers != self.decoder_layers):
            yield ("decoder_init final copies each encoder layer's final state: it needs a "
                   "unidirectional encoder and encoder_layers == decoder_layers")
        if not attn and self.decoder_init == "zeros":
            yield ("attention 'none' with decoder_init zeros never reads the source: use "
                   "decoder_init learned or final, or an attention")
        if self.tie_output and self.embed_dim != self.hidden_dim:
            yield "tie_output needs embed_dim == hidden_dim"
        if self.residual_from == 1:
            yield "residual_from 1 would add the embeddings: use 0 (none) or >= 2"
        for layer, (width, out, _) in enumerate(self.encoder_layout()):
            if self.residual(layer) and width != out:
                yield (f"residual encoder layer {layer + 1} maps width {width} to {out}: "
                       "start residual_from above the bidirectional layers")
