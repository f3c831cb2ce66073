"""Ensembles: several trained models decode as one (``xinda translate M1 --ensemble M2 ...``).

At every step each model runs its own incremental decoder (its cache lives in its own part of
the search state) and the ensemble's next-token distribution is the normalised mean of the
models' log-probabilities, log p(y) ∝ (1/M) Σ_m log p_m(y) (a geometric mean; the search's
log-softmax normalises it). The models must share the source and target vocabularies (the
same sentencepiece models), which ``check_same_vocabularies`` enforces with a clear error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from xinda.data.manifest import Vocabularies
from xinda.errors import XindaError
from xinda.models.base import EncoderOut, Seq2SeqModel


@dataclass
class EnsembleEncoderOut(EncoderOut):
    """The first model's memory and padding (what the search reads) plus every model's own."""

    parts: list[EncoderOut]

    @staticmethod
    def of(parts: list[EncoderOut]) -> EnsembleEncoderOut:
        return EnsembleEncoderOut(parts[0].memory, parts[0].src_pad, parts)

    def reorder(self, order: Tensor) -> EnsembleEncoderOut:
        return self.of([part.reorder(order) for part in self.parts])

    def expand(self, k: int) -> EnsembleEncoderOut:
        return self.of([part.expand(k) for part in self.parts])

    def select(self, rows: Tensor, k: int) -> EnsembleEncoderOut:
        return self.of([part.select(rows, k) for part in self.parts])


class Ensemble(Seq2SeqModel):
    """``models`` decoding together; the config of the first (max_positions: the smallest).
    They must have the same vocabularies (sizes and special ids)."""

    def __init__(self, models: Sequence[Seq2SeqModel]):
        super().__init__()
        if not models:
            raise XindaError("an ensemble needs at least one model")
        for i, model in enumerate(models[1:], start=2):
            if model.vocab != models[0].vocab:
                raise XindaError(f"ensemble model {i} has other vocabularies ({model.vocab}) "
                                 f"than model 1 ({models[0].vocab})")
        self.members = nn.ModuleList(models)
        self.vocab = models[0].vocab
        limit = min(m.cfg.max_positions for m in models)
        self.cfg = models[0].cfg.model_copy(update={"max_positions": limit})

    @property
    def has_attention(self) -> bool:
        """Only when every member returns source attention (``decode`` averages them)."""
        return all(m.has_attention for m in self.members)

    def encode(self, src: Tensor) -> EnsembleEncoderOut:
        return EnsembleEncoderOut.of([m.encode(src) for m in self.members])

    def decode(self, prev: Tensor, enc: EnsembleEncoderOut, state: dict | None = None,
               need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """prev (B, T) -> the mean log-probabilities (B, T, V) of the members and, when asked,
        their mean source attention (B, T, S): None unless every member returns one."""
        states = None if state is None else state.setdefault("members", [{} for _ in
                                                                         self.members])
        logps, attns = [], []
        for i, (model, part) in enumerate(zip(self.members, enc.parts)):
            logits, attn = model.decode(prev, part, None if states is None else states[i],
                                        need_weights)
            logps.append(torch.log_softmax(logits.float(), dim=-1))
            attns.append(attn)
        every = all(attn is not None for attn in attns)
        mean_attn = torch.stack(attns).mean(0) if every else None
        return torch.stack(logps).mean(0), mean_attn

    def reorder_state(self, state: dict, order: Tensor) -> None:
        for model, member_state in zip(self.members, state.get("members", [])):
            model.reorder_state(member_state, order)


def check_same_vocabularies(dirs: Sequence[Path], vocabs: Sequence[Vocabularies]) -> None:
    """XindaError unless every model has the first one's source and target sentencepiece
    models (compared byte for byte) and text pipelines (every member reads the first model's
    preprocessed input)."""
    first = vocabs[0]
    for folder, other in zip(dirs[1:], vocabs[1:]):
        for side, a, b in (("source", first.src_text, other.src_text),
                           ("target", first.tgt_text, other.tgt_text)):
            if a != b:
                raise XindaError(f"--ensemble {folder}: its {side} text settings ({b.to_dict()}) "
                                 f"differ from {dirs[0]}'s ({a.to_dict()}); an ensemble needs "
                                 "models prepared the same way")
        for side, a, b in (("source", first.src, other.src), ("target", first.tgt, other.tgt)):
            if a.path.read_bytes() != b.path.read_bytes():
                raise XindaError(f"--ensemble {folder}: its {side} vocabulary ({b.path.name}, "
                                 f"{b.size} pieces) differs from {dirs[0]}'s ({a.size} pieces); "
                                 "an ensemble needs models with the same vocabularies")
