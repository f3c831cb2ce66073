"""Reading what ``xinda prepare`` wrote: the manifest, the token arrays of a split, and the
vocabularies with their text pipelines (every consumer loads them here, through one function).

A prepared data directory, and every model directory trained from it, holds ``manifest.json``
and the sentencepiece model(s) it names, so ``load_vocabularies`` works on either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from xinda.data.arrays import TokenArrays
from xinda.data.text import TextPipeline
from xinda.data.vocab import Vocab, VocabInfo
from xinda.errors import XindaError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SIDES = ("src", "tgt")


def load_manifest(data_dir: str | Path) -> dict:
    """Read ``{data_dir}/manifest.json`` written by ``prepare``."""
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        raise XindaError(f"{path}: not found — run xinda prepare first")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise XindaError(f"{path}: invalid manifest ({err})") from None
    missing = [k for k in ("spm", "text", "splits", "joint_vocab")
               if not isinstance(manifest, dict) or k not in manifest]
    if missing:
        raise XindaError(f"{path}: not a manifest of xinda prepare (no {', '.join(missing)}); "
                         "re-run xinda prepare")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise XindaError(f"{path}: unsupported format_version {version} "
                         f"(expected {FORMAT_VERSION}); re-run xinda prepare")
    return manifest


def load_split(data_dir: str | Path, split: str) -> tuple[TokenArrays, TokenArrays]:
    """Memory-mapped (src, tgt) token arrays of one split."""
    data_dir = Path(data_dir)
    if not (data_dir / f"{split}.src.ids.npy").is_file():
        available = ", ".join(load_manifest(data_dir)["splits"])
        raise XindaError(f"{data_dir}: no split '{split}' (available: {available})")
    return TokenArrays.load(data_dir, f"{split}.src"), TokenArrays.load(data_dir, f"{split}.tgt")


@dataclass(frozen=True)
class Vocabularies:
    """Both sides' text pipelines and sentencepiece vocabularies, as ``prepare`` made them."""

    src_text: TextPipeline
    tgt_text: TextPipeline
    src: Vocab
    tgt: Vocab
    joint: bool  # one sentencepiece model for both sides

    @property
    def info(self) -> VocabInfo:
        """What a model is built from: sizes and the target side's special ids."""
        return VocabInfo(self.src.size, self.tgt.size, self.tgt.pad, self.tgt.bos, self.tgt.eos,
                         self.joint)


def _side_vocab(directory: Path, manifest: dict, side: str) -> Vocab:
    path = directory / manifest["spm"][side]
    if not path.is_file():
        raise XindaError(f"{path}: sentencepiece model not found — run xinda prepare again")
    try:
        return Vocab(path)
    except (RuntimeError, OSError):
        raise XindaError(f"{path}: not a valid sentencepiece model — run xinda prepare again"
                         ) from None


def load_vocabularies(directory: str | Path, manifest: dict | None = None) -> Vocabularies:
    """Manifest -> text pipelines and vocabularies of a data or model directory (``manifest``:
    the directory's manifest when the caller has already read it)."""
    directory = Path(directory)
    manifest = load_manifest(directory) if manifest is None else manifest
    vocab = {side: _side_vocab(directory, manifest, side) for side in SIDES}
    text = {side: TextPipeline(**manifest["text"][side]) for side in SIDES}
    return Vocabularies(text["src"], text["tgt"], vocab["src"], vocab["tgt"],
                        manifest["joint_vocab"])
