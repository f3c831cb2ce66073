"""Vocabulary = a sentencepiece model plus the four special ids every model needs.

Models that xinda trains reserve ``<pad>=0 <unk>=1 <s>=2 </s>=3``. A sentencepiece model made
elsewhere (e.g. the peer benchmark's, which has no pad piece) still works: a missing pad gets the
first id after the pieces, so ``size`` is one larger than the model's piece count.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

from xinda.errors import XindaError

WORD_START = "\u2581"  # sentencepiece's "▁": the piece starts a word
UNK_SURFACE = "\u2047"  # "⁇": the text sentencepiece decodes <unk> to
SPECIAL_IDS = {"pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3}  # sentencepiece trainer args


@dataclass(frozen=True)
class VocabInfo:
    """What a model needs to know about its vocabularies."""

    src_size: int
    tgt_size: int
    pad: int
    bos: int
    eos: int
    joint: bool  # one vocabulary for both sides (allows shared embeddings)


class Vocab:
    """Maps text or pieces to ids and back through one sentencepiece model."""

    def __init__(self, model_file: str | Path):
        self.path = Path(model_file)
        self.sp = spm.SentencePieceProcessor(model_file=str(model_file))
        n = self.sp.get_piece_size()
        self.pieces = n  # the sentencepiece model's own pieces (``size`` adds missing specials)
        self.unk = self.sp.unk_id()
        self.unk_piece = self.sp.id_to_piece(self.unk)  # "<unk>"
        self.bos = self.sp.bos_id() if self.sp.bos_id() >= 0 else self._extra(n, 0)
        self.eos = self.sp.eos_id() if self.sp.eos_id() >= 0 else self._extra(n, 1)
        self.pad = self.sp.pad_id() if self.sp.pad_id() >= 0 else self._extra(n, 2)
        self.size = max(n, self.bos + 1, self.eos + 1, self.pad + 1)
        self._specials = {self.pad, self.bos, self.eos}

    def _extra(self, n: int, k: int) -> int:
        """Id for a special the model lacks: appended after its pieces, in a fixed order."""
        missing = [s for s in ("bos", "eos", "pad") if getattr(self.sp, f"{s}_id")() < 0]
        return n + missing.index(("bos", "eos", "pad")[k])

    def __len__(self) -> int:
        return self.size

    def encode(self, text: str) -> list[int]:
        """Text (already pre-tokenised) -> piece ids, without BOS/EOS."""
        return self.sp.encode(text, out_type=int)

    def encode_pieces(self, text: str) -> list[str]:
        return self.sp.encode(text, out_type=str)

    def pieces_to_ids(self, pieces: list[str]) -> list[int]:
        return [self.sp.piece_to_id(p) for p in pieces]

    def line_to_ids(self, line: str, where: str, source: bool) -> list[int]:
        """The ids of a line of space-separated pieces (input given as pieces). A XindaError
        naming ``where``: ``<pad>`` in a source (read as padding, never by the model), and any
        control piece (``<pad>``, ``<s>``, ``</s>``) in a target prefix (the search places
        them itself)."""
        pieces = line.split()
        ids = self.pieces_to_ids(pieces)
        refused = {self.pad} if source else self._specials
        if control := [p for p, i in zip(pieces, ids) if i in refused]:
            what = "the padding piece: the model would not read it" if source else \
                "a control piece of the search, not one of the output"
            raise XindaError(f"{where}: {control[0]!r} is {what}")
        return ids

    def ids_to_pieces(self, ids: list[int]) -> list[str]:
        return [self.sp.id_to_piece(i) for i in ids if i not in self._specials]

    def labels(self, ids: list[int]) -> list[str]:
        """One label per id, specials included (``<pad>``, ``<s>``, ``</s>``): what a model
        read, position by position."""
        names = {self.pad: "<pad>", self.bos: "<s>", self.eos: "</s>"}
        return [names.get(i) or self.sp.id_to_piece(i) for i in ids]

    def decode(self, ids: list[int]) -> str:
        """Piece ids -> text; specials (pad/bos/eos) are dropped."""
        return self.sp.decode([i for i in ids if i not in self._specials])
