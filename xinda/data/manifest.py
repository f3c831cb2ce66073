"""Reading what ``xinda prepare`` wrote: the manifest, the token arrays of a split, and the
vocabularies with their text pipelines (every consumer loads them here, through one function).

A prepared data directory, and every model directory trained from it, holds ``manifest.json``
and the sentencepiece model(s) it names, so ``load_vocabularies`` works on either.
"""

from __future__ import annotations

import hashlib
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
    _check_shape(path, manifest)
    return manifest


def _check_shape(path: Path, manifest: dict) -> None:
    """The entries the readers use have their types (a damaged manifest: one line, not a
    traceback from deep inside them)."""
    expected = {"spm.src": str, "spm.tgt": str, "text.src": dict, "text.tgt": dict,
                "splits": dict, "joint_vocab": bool}
    for key, kind in expected.items():
        if not isinstance(value := _entry(manifest, *key.split(".")), kind):
            raise XindaError(f"{path}: invalid manifest ({key} should be a "
                             f"{kind.__name__}, got {value!r:.60}); re-run xinda prepare")


def data_fingerprint(data_dir: str | Path, manifest: dict) -> str:
    """A digest of a prepared data directory: its manifest (splits, their sizes and token
    counts, settings) and its sentencepiece model(s)."""
    digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode())
    for name in sorted(set(manifest["spm"].values())):
        digest.update((Path(data_dir) / name).read_bytes())
    return digest.hexdigest()


def load_split(data_dir: str | Path, split: str) -> tuple[TokenArrays, TokenArrays]:
    """Memory-mapped (src, tgt) token arrays of one split, checked to hold the same number of
    sentences (the pairs the manifest records, where it does)."""
    data_dir = Path(data_dir)
    manifest = load_manifest(data_dir)
    if not (data_dir / f"{split}.src.ids.npy").is_file():
        available = ", ".join(manifest["splits"])
        raise XindaError(f"{data_dir}: no split '{split}' (available: {available})")
    arrays = {side: TokenArrays.load(data_dir, f"{split}.{side}") for side in SIDES}
    _check_pairs(data_dir, split, manifest, arrays)
    return arrays["src"], arrays["tgt"]


def _check_pairs(data_dir: Path, split: str, manifest: dict,
                 arrays: dict[str, TokenArrays]) -> None:
    """Both sides hold the pairs the manifest records (where it records none: as many as each
    other)."""
    pairs = _recorded(manifest, "splits", split, "pairs")
    if pairs is None:
        pairs, source = len(arrays["src"]), f"{split}.src.offsets.npy has {len(arrays['src'])}"
    else:
        source = f"{data_dir / MANIFEST} records {pairs} pairs for split '{split}'"
    for side in SIDES:
        if len(arrays[side]) != pairs:
            raise XindaError(f"{data_dir / f'{split}.{side}.offsets.npy'}: {len(arrays[side])} "
                             f"sentences, but {source}; re-run xinda prepare")


def _entry(manifest: dict, *keys: str):
    """``manifest[k1][k2]...``; None where a key (or a mapping on the way) is missing."""
    value = manifest
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _recorded(manifest: dict, *keys: str) -> int | None:
    """The count at ``manifest[k1][k2]...``; None where an older manifest lacks it."""
    value = _entry(manifest, *keys)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


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
    """One side's vocabulary, checked against the piece count the manifest records (manifests
    older than ``vocab_sizes`` record none)."""
    path = directory / manifest["spm"][side]
    if not path.is_file():
        raise XindaError(f"{path}: sentencepiece model not found — run xinda prepare again")
    try:
        vocab = Vocab(path)
    except (RuntimeError, OSError):
        raise XindaError(f"{path}: not a valid sentencepiece model — run xinda prepare again"
                         ) from None
    recorded = _recorded(manifest, "vocab_sizes", side)
    if recorded is not None and recorded != vocab.pieces:
        raise XindaError(f"{path}: {vocab.pieces} pieces, but {directory / MANIFEST} records "
                         f"{recorded}: not the sentencepiece model this directory was made "
                         "with (re-run xinda prepare, or put the original back)")
    return vocab


def _text_pipeline(directory: Path, manifest: dict, side: str) -> TextPipeline:
    try:
        return TextPipeline(**manifest["text"][side])
    except (TypeError, ValueError) as err:
        raise XindaError(f"{directory / MANIFEST}: invalid manifest (text.{side}: {err}); "
                         "re-run xinda prepare") from None


def load_vocabularies(directory: str | Path, manifest: dict | None = None) -> Vocabularies:
    """Manifest -> text pipelines and vocabularies of a data or model directory (``manifest``:
    the directory's manifest when the caller has already read it)."""
    directory = Path(directory)
    manifest = load_manifest(directory) if manifest is None else manifest
    vocab = {side: _side_vocab(directory, manifest, side) for side in SIDES}
    text = {side: _text_pipeline(directory, manifest, side) for side in SIDES}
    return Vocabularies(text["src"], text["tgt"], vocab["src"], vocab["tgt"],
                        manifest["joint_vocab"])
