"""The contract every sequence-to-sequence model follows, so one search drives them all.

A model encodes a padded source batch once, then decodes either a whole target prefix
(teacher forcing) or, with an incremental ``state``, one new token per call. Beam search
reorders the state and encoder output with ``reorder`` when hypotheses move between beams.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import Field
from torch import Tensor, nn

from xinda.config import MAX_LENGTH, Strict
from xinda.data.vocab import VocabInfo


class ModelConfig(Strict):
    """The fields every architecture's config shares (each architecture adds its own)."""

    # longest sequence the model takes: position table / location-attention table; also the
    # search's cap on output length (at most MAX_LENGTH: 2e9 would be a 256 GB table)
    max_positions: int = Field(1024, ge=16, le=MAX_LENGTH)

    @property
    def model_dim(self) -> int:
        """The model width d of the Noam schedule (Vaswani et al. 2017, eq. 3)."""
        raise NotImplementedError

    @property
    def has_attention(self) -> bool:
        """Whether the model attends to the source (and can return those weights)."""
        return True

    def unused_settings(self):
        """Settings given that this model does not use: warned about when a run is set up
        (not refused: models saved with them must still load and resume)."""
        yield from ()


@dataclass
class EncoderOut:
    memory: Tensor  # (B, S, D) encoder states
    src_pad: Tensor  # (B, S) bool, True at padding

    @property
    def keep(self) -> Tensor:  # (B, 1, 1, S) bool, True where attention may look
        return ~self.src_pad[:, None, None, :]

    def reorder(self, order: Tensor) -> EncoderOut:
        """Decoder row i reads what row ``order[i]`` read."""
        return EncoderOut(self.memory.index_select(0, order), self.src_pad.index_select(0, order))

    def expand(self, k: int) -> EncoderOut:
        """``k`` consecutive decoder rows per sentence (beams, samples), each reading its own."""
        return self.reorder(torch.arange(self.src_pad.size(0),
                                         device=self.src_pad.device).repeat_interleave(k))

    def select(self, rows: Tensor, k: int) -> EncoderOut:
        """After ``expand(k)``: the new rows ``rows`` (k consecutive rows of one sentence at a
        time, as beam search keeps them)."""
        return self.reorder(rows)


@dataclass
class SharedEncoderOut(EncoderOut):
    """An encoder output that ``expand`` does not copy: the ``group`` consecutive decoder rows
    of a sentence share its one memory row, for decoders that attend group-wise (the
    Transformer's cross-attention). ``memory``/``src_pad`` have one row per sentence."""

    group: int = 1  # decoder rows per sentence: row r reads sentence r // group

    def reorder(self, order: Tensor) -> EncoderOut:
        """Only before ``expand``: the decoder's cross-attention cache keeps one row per
        sentence, which an arbitrary row order would not match (``select`` keeps groups)."""
        if self.group > 1:
            raise ValueError("an expanded shared encoder output is reordered with select")
        return EncoderOut(self.memory.index_select(0, order), self.src_pad.index_select(0, order))

    def expand(self, k: int) -> SharedEncoderOut:
        return SharedEncoderOut(self.memory, self.src_pad, self.group * k)

    def select(self, rows: Tensor, k: int) -> SharedEncoderOut:
        sentences = group_sentences(rows, self.group)
        return SharedEncoderOut(self.memory.index_select(0, sentences),
                                self.src_pad.index_select(0, sentences), self.group)


def group_sentences(rows: Tensor, group: int) -> Tensor:
    """The sentence of each run of ``group`` new rows, given as old rows (r // group)."""
    sentences = rows.view(-1, group) // group
    if not sentences.eq(sentences[:, :1]).all():
        raise ValueError("a row order that mixes the rows of different sentences in one group")
    return sentences[:, 0]


class Seq2SeqModel(nn.Module):
    """Base class: subclasses implement ``encode``, ``decode`` and ``reorder_state``."""

    cfg: ModelConfig
    vocab: VocabInfo

    @property
    def has_attention(self) -> bool:
        """Whether decode(need_weights=True) returns source attention: the config says."""
        return self.cfg.has_attention

    def encode(self, src: Tensor) -> EncoderOut:
        """src (B, S) token ids, right-padded -> EncoderOut."""
        raise NotImplementedError

    def decode(self, prev: Tensor, enc: EncoderOut, state: dict | None = None,
               need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """prev (B, T) target ids starting with BOS -> logits (B, T, V) and, when asked,
        source attention (B, T, S). With ``state`` (a dict the model fills), ``prev`` holds only
        the newest token (B, 1) and earlier steps are read from the state."""
        raise NotImplementedError

    def reorder_state(self, state: dict, order: Tensor) -> None:
        """Select/reorder the batch dimension of every cached tensor in ``state``."""
        raise NotImplementedError

    def decode_hidden(self, prev: Tensor, enc: EncoderOut) -> Tensor:
        """Teacher forcing without the output projection: prev (B, T) -> the states (B, T, D)
        that ``self.output`` (an ``nn.Linear``) maps to the logits of ``decode``. Optional:
        training computes the loss in chunks from them (``xinda.train.loss``)."""
        raise NotImplementedError

    @property
    def has_hidden(self) -> bool:
        """Does this model implement ``decode_hidden``?"""
        return type(self).decode_hidden is not Seq2SeqModel.decode_hidden

    def forward(self, src: Tensor, prev: Tensor, hidden: bool = False) -> Tensor:
        """Teacher-forced logits (B, T, V), or with ``hidden`` the states before the output
        projection (B, T, D)."""
        enc = self.encode(src)
        return self.decode_hidden(prev, enc) if hidden else self.decode(prev, enc)[0]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())


def reorder_nested(state, order: Tensor):
    """index_select every tensor in a nested dict/list on dim 0 (in place for containers)."""
    if isinstance(state, Tensor):
        return state.index_select(0, order)
    if isinstance(state, dict):
        for key, value in state.items():
            state[key] = reorder_nested(value, order)
    elif isinstance(state, list):
        for i, value in enumerate(state):
            state[i] = reorder_nested(value, order)
    return state
