"""The CTranslate2 side of ``xinda export ctranslate2``: a ``Converter`` whose ``_load`` fills a
``TransformerSpec`` with a xinda Transformer's weights. It needs the optional ``ctranslate2``
package, so only ``xinda.export.ctranslate2`` imports it, when exporting.

xinda -> CTranslate2 names, per layer: ``self_attn.qkv`` -> ``self_attention.linear[0]`` (q, k,
v fused in that order in both), ``self_attn.out`` -> ``linear[1]``; ``cross_attn.q`` / ``.kv``
/ ``.out`` -> ``attention.linear[0]`` / ``[1]`` / ``[2]``; ``ffn.w1`` / ``w2`` -> ``ffn.linear_0``
/ ``linear_1``; each sub-layer's LayerNorm -> its block's ``layer_norm`` (applied before the
block in pre-norm, after the residual sum in post-norm, in both toolkits).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from ctranslate2.converters import Converter
from ctranslate2.specs import common_spec, transformer_spec
from torch import Tensor, nn

from xinda.models.layers import TokenEmbedding
from xinda.models.transformer import Transformer

# Added to the pad and BOS output logits so that CTranslate2 never generates them (xinda's search
# bans both); exp(-1e4) is 0 in float32, and -1e4 still fits float16.
BANNED_LOGIT = -1.0e4
ACTIVATIONS = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}


def _array(tensor: Tensor) -> np.ndarray:
    """A float32 numpy copy of a parameter or buffer."""
    return tensor.detach().to(device="cpu", dtype=torch.float32).numpy().copy()


def set_linear(spec, linear: nn.Linear) -> None:
    spec.weight = _array(linear.weight)
    if linear.bias is not None:
        spec.bias = _array(linear.bias)


def set_norm(spec, norm: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def set_embeddings(spec, embedding: TokenEmbedding, weight_spec) -> None:
    """Token table (scaled by sqrt(d) at run time) and xinda's position table, explicitly."""
    weight_spec.weight = _array(embedding.embed.weight)
    spec.scale_embeddings = True
    spec.position_encodings.encodings = _array(embedding.positions)


def set_ffn(spec, layer: nn.Module) -> None:
    set_norm(spec.layer_norm, layer.ffn_sub.norm)
    set_linear(spec.linear_0, layer.ffn.w1)
    set_linear(spec.linear_1, layer.ffn.w2)


def set_encoder(spec, model: Transformer) -> None:
    set_embeddings(spec, model.src_embed, spec.embeddings[0])
    for layer_spec, layer in zip(spec.layer, model.encoder_layers):
        attention = layer_spec.self_attention
        set_linear(attention.linear[0], layer.self_attn.qkv)
        set_linear(attention.linear[1], layer.self_attn.out)
        set_norm(attention.layer_norm, layer.attn_sub.norm)
        set_ffn(layer_spec.ffn, layer)
    if model.cfg.norm == "pre":
        set_norm(spec.layer_norm, model.encoder_norm)


def set_decoder(spec, model: Transformer) -> None:
    set_embeddings(spec, model.tgt_embed, spec.embeddings)
    for layer_spec, layer in zip(spec.layer, model.decoder_layers):
        own, cross = layer_spec.self_attention, layer_spec.attention
        set_linear(own.linear[0], layer.self_attn.qkv)
        set_linear(own.linear[1], layer.self_attn.out)
        set_norm(own.layer_norm, layer.self_sub.norm)
        for k, linear in enumerate((layer.cross_attn.q, layer.cross_attn.kv,
                                    layer.cross_attn.out)):
            set_linear(cross.linear[k], linear)
        set_norm(cross.layer_norm, layer.cross_sub.norm)
        set_ffn(layer_spec.ffn, layer)
    if model.cfg.norm == "pre":
        set_norm(spec.layer_norm, model.decoder_norm)
    set_linear(spec.projection, model.output)
    spec.projection.bias = output_bias(model)


def output_bias(model: Transformer) -> np.ndarray:
    """The output layer's bias (zeros if it has none) with pad and BOS banned."""
    bias = model.output.bias
    out = np.zeros(model.vocab.tgt_size, np.float32) if bias is None else _array(bias)
    out[[model.vocab.pad, model.vocab.bos]] = BANNED_LOGIT
    return out


def transformer_spec_of(model: Transformer) -> transformer_spec.TransformerSpec:
    """The spec of ``model``'s shape, filled with its weights and xinda's decoding settings."""
    cfg = model.cfg
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers), cfg.heads, pre_norm=cfg.norm == "pre",
        activation=ACTIVATIONS[cfg.activation])
    set_encoder(spec.encoder, model)
    set_decoder(spec.decoder, model)
    spec.config.add_source_eos = True  # xinda's sources end with EOS, no BOS
    spec.config.decoder_start_token = "<s>"  # and its targets start with BOS
    spec.config.layer_norm_epsilon = model.encoder_layers[0].attn_sub.norm.eps
    return spec


class XindaConverter(Converter):
    """Converts a loaded xinda ``Transformer`` (eval mode) given its source and target token
    lists (``vocabulary_tokens``); ``files`` are copied into the model directory."""

    def __init__(self, model: Transformer, source_tokens: list[str], target_tokens: list[str],
                 files: Sequence[Path] = ()):
        self.model, self.files = model, list(files)
        self.source_tokens, self.target_tokens = source_tokens, target_tokens

    def _load(self) -> transformer_spec.TransformerSpec:
        with torch.no_grad():
            spec = transformer_spec_of(self.model)
        spec.register_source_vocabulary(self.source_tokens)
        spec.register_target_vocabulary(self.target_tokens)
        for path in self.files:
            spec.register_file(str(path), path.name)
        return spec
