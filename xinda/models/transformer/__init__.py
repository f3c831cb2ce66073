"""Transformer family: registration and presets.

The deep presets follow ch. 15 of Xiao Tong and Zhu Jingbo 2021, *Machine Translation:
Foundations and Models* ("textbook ch. 15"); the fusion presets, the information-transfer
enhancement paper of ``connections`` ("fusion paper").
"""

from xinda.models.registry import register_architecture, register_preset
from xinda.models.transformer.model import Transformer, TransformerConfig

register_architecture("transformer", TransformerConfig,
                      "encoder-decoder Transformer (post-/pre-norm)")(Transformer)

# Vaswani et al. 2017, table 3 "base" and "big"; dropout only on the sub-layer outputs and the
# embedding sums (sec. 5.4), none on attention weights or inside the FFN (as fairseq's defaults).
VASWANI = {"attention_dropout": 0.0, "activation_dropout": 0.0}
register_preset("transformer-base", "Vaswani et al. 2017 base: 6+6 x 512, post-norm",
                arch="transformer", **VASWANI)
register_preset("transformer-big", "Vaswani et al. 2017 big: 6+6 x 1024, 16 heads",
                arch="transformer", d_model=1024, heads=16, ffn_dim=4096,
                dropout=0.3, **VASWANI)
# Deep encoder, shallow decoder: pre-norm keeps a 30-layer stack trainable (textbook ch. 15).
register_preset("transformer-deep", "pre-norm, 30-layer encoder, 6-layer decoder",
                arch="transformer", norm="pre", encoder_layers=30,
                decoder_layers=6)
# DLCL (Wang et al. 2019): the deep pre-norm stack with dynamic linear combination of layers.
register_preset("transformer-dlcl", "pre-norm 30+6 layers, DLCL on encoder and decoder",
                arch="transformer", norm="pre", encoder_layers=30, decoder_layers=6,
                dense="both")
# Information-transfer enhancement (fusion paper) on Transformer base, encoder and decoder.
register_preset("transformer-layer-fusion", "base + layer-wise mean fusion, elementwise "
                "retention gate", arch="transformer", fusion="layer", fusion_function="mean",
                fusion_side="both", **VASWANI)
register_preset("transformer-sublayer-fusion", "base + sub-layer-wise mean fusion, elementwise "
                "retention gate", arch="transformer", fusion="sublayer", fusion_function="mean",
                fusion_side="both", **VASWANI)
# Small enough for the demo and for tests on a laptop CPU.
register_preset("transformer-tiny", "2+2 x 128, pre-norm: demo and tests",
                arch="transformer", d_model=128, heads=4, ffn_dim=512,
                encoder_layers=2, decoder_layers=2, norm="pre")
# The peer benchmark's matched configuration (3+3, d 256, 4 heads, FFN 1024, pre-norm).
register_preset("transformer-small", "3+3 x 256, 4 heads, FFN 1024, pre-norm: peer benchmark",
                arch="transformer", d_model=256, heads=4, ffn_dim=1024,
                encoder_layers=3, decoder_layers=3, norm="pre")

__all__ = ["Transformer", "TransformerConfig"]
