"""Progressive training (Li et al. 2020, "Shallow-to-deep training for neural machine
translation"; Xiao Tong and Zhu Jingbo 2021, *Machine Translation: Foundations and Models*,
ch. 15): copy a trained h-layer encoder into a deeper N-layer one (h < N <= 2h)
and keep training, instead of training the deep model from scratch.

``grow_encoder(old, new)`` fills ``new`` with ``old``'s parameters:

- encoder layer j < h copies old layer j; layer j >= h copies old layer j - (N - h). For the
  usual N = 2h this stacks a copy of the whole trained encoder on top of itself; for N < 2h the
  top N - h layers are copies of the old top N - h layers.
- DLCL on the encoder (``dense``): the old (K+1) x (K+1) weight matrix goes into the top-left
  block of the new one (the new rows keep their ``dense_init``: 1/M for ``mean``, the newest
  output alone for ``last``) and the old norms
  into the first norms; the norm of each new aggregation point copies the norm of its source
  layer's aggregation point (or keeps its default initialisation when the source layer is not
  one, possible only when N - h is not a multiple of ``dense_every``).
- Encoder fusion: gates of the old fusion points are copied, a new point's gate copies its
  source unit's gate; learned linear fusions of new points start at their default (the mean).
- Everything else (embeddings, decoder, final norms, output) is copied as is.

The first h encoder layers of the grown model therefore compute exactly what the old encoder
computed (in eval mode), and the grown model differs only above them.
"""

from __future__ import annotations

import re

import torch

from xinda.errors import XindaError
from xinda.models.transformer.model import Transformer, TransformerConfig

_LAYER = re.compile(r"^encoder_layers\.(\d+)\.(.+)$")
_CONNECTION = re.compile(r"^encoder_connection\.(norms|gates|linear)\.(\d+)\.(.+)$")


def check_growth(old: TransformerConfig, layers: int) -> None:
    """Raise XindaError unless ``old.encoder_layers`` < ``layers`` <= 2 * old.encoder_layers."""
    h = old.encoder_layers
    if not h < layers <= 2 * h:
        raise XindaError(f"cannot grow a {h}-layer encoder to {layers} layers: need "
                         f"{h} < N <= {2 * h}")


def grown_config(old: TransformerConfig, layers: int) -> TransformerConfig:
    """``old`` with ``encoder_layers = layers`` (checked by ``check_growth``)."""
    check_growth(old, layers)
    return old.model_copy(update={"encoder_layers": layers})


def source_layer(j: int, h: int, n: int) -> int:
    """The old layer that new encoder layer ``j`` (0-based) of ``n`` copies, from ``h`` layers."""
    return j if j < h else j - (n - h)


def _source_name(name: str, cfg: TransformerConfig, h: int, n: int) -> str | None:
    """The old parameter that new parameter ``name`` copies; None keeps its initialisation.
    ``encoder_connection.weights`` is handled by the caller (block copy)."""
    if found := _LAYER.match(name):
        return f"encoder_layers.{source_layer(int(found[1]), h, n)}.{found[2]}"
    found = _CONNECTION.match(name)
    if not found:
        return name
    kind, slot, rest = found[1], int(found[2]), found[3]
    if kind == "norms":  # norm k follows layer (k + 1) * p (0-based: (k + 1) * p - 1)
        p = cfg.dense_every
        if slot < h // p:
            return name
        src = source_layer((slot + 1) * p - 1, h, n)
        return f"encoder_connection.norms.{(src + 1) // p - 1}.{rest}" if (src + 1) % p == 0 \
            else None
    # fusion: slot s fuses after unit s + 1 (0-based); a layer has `per` units
    per = 2 if cfg.fusion == "sublayer" else 1
    if slot < h * per - 1:
        return name
    if kind == "linear":  # its width depends on the slot: nothing of the right shape to copy
        return None
    unit = slot + 1
    src = source_layer(unit // per, h, n) * per + unit % per
    return f"encoder_connection.gates.{src - 1}.{rest}" if src >= 1 else None


@torch.no_grad()
def grow_encoder(old: Transformer, new: Transformer) -> Transformer:
    """Copy every parameter (and buffer) of ``old`` into the deeper-encoder ``new`` by the rule
    in the module docstring; returns ``new``. Their configs may differ only in
    ``encoder_layers``, with h < N <= 2h."""
    h, n = old.cfg.encoder_layers, new.cfg.encoder_layers
    check_growth(old.cfg, n)
    if grown_config(old.cfg, n) != new.cfg:
        raise XindaError("grow: the new model's config must equal the old one except for "
                         "encoder_layers")
    if old.vocab != new.vocab:
        raise XindaError("grow: the old and new models have different vocabularies")
    source = old.state_dict()
    for name, target in new.state_dict().items():
        if name == "encoder_connection.weights":
            k = source[name].size(0)
            target[:k, :k].copy_(source[name])
            continue
        src = _source_name(name, new.cfg, h, n)
        if src is None:
            continue
        if src not in source or source[src].shape != target.shape:
            raise XindaError(f"grow: no source of the right shape for {name} ({src})")
        target.copy_(source[src])
    return new
