"""``xinda export ctranslate2``: a trained xinda Transformer as a CTranslate2 model directory.

The exported model is the same network, decoding by xinda's conventions (``ct2_spec`` maps the
weights):

- post- or pre-norm (with the final LayerNorms), ReLU or GELU, the fused q/k/v
  self-attention and k/v cross-attention projections (CTranslate2 fuses them the same way),
  embeddings x sqrt(d), the output projection (tied or not), and xinda's own sinusoidal table
  (sin and cos interleaved), given to CTranslate2 explicitly rather than its default layout;
- vocabularies of sentencepiece pieces, with xinda's special ids renamed to the spellings
  CTranslate2 looks for: unknown ``<unk>``, BOS ``<s>``, EOS ``</s>`` (and pad ``<pad>``);
- EOS appended to every source, decoding started from BOS, and pad and BOS never generated
  (xinda's search bans them; here a large negative bias on their output logits does, so
  CTranslate2's scores leave their probability out, where xinda's include it).

Greedy decoding therefore gives xinda's outputs, once CTranslate2's ``max_decoding_length``
(tokens before EOS) is xinda's limit (which counts the EOS) minus one and its
``min_decoding_length`` is 0 (xinda may end a sentence at once). Beam search without a length
penalty (``length_penalty=0``, ``alpha 0``) matched on most test sentences, but not where a
hypothesis reaches the length limit (the two choose candidates there differently); with one,
the two also rank finished hypotheses differently (CTranslate2 divides by length^penalty, xinda
by GNMT's ((5 + length) / 6)^alpha).

The model takes and returns space-separated sentencepiece pieces; xinda's text pipeline
(normalisation, pre-tokenisation) is not part of it. The sentencepiece model(s) are copied
beside it. Models CTranslate2 cannot represent (RNNs, DLCL, information fusion) are refused;
layer dropout acts only in training and needs nothing.
"""

from __future__ import annotations

import importlib
import shutil
import tempfile
from fnmatch import fnmatchcase
from pathlib import Path
from types import ModuleType

from xinda.checkpoint import checkpoint_dir
from xinda.config import load_config
from xinda.data.manifest import load_manifest
from xinda.data.vocab import Vocab
from xinda.decode.translator import Translator
from xinda.errors import XindaError
from xinda.models.registry import resolve
from xinda.models.transformer import TransformerConfig
from xinda.utils import check_writable, os_errors_named, write_errors

INSTALL_HINT = "pip install 'xinda[export]'"
SPECIAL_TOKENS = {"unk": "<unk>", "bos": "<s>", "eos": "</s>", "pad": "<pad>"}
EXPORT_FILES = ("model.bin", "config.json")  # in every export
EXPORT_EXTRAS = ("*vocabulary.json", "*vocabulary.txt", "*.model")  # vocabularies, spm models


def check_exportable(model_dir: Path) -> TransformerConfig:
    """The model config of ``model_dir``; a XindaError when CTranslate2 cannot represent it."""
    config = model_dir / "config.yaml"
    cfg = resolve(load_config(config).model, str(config))
    head = f"{model_dir}: cannot export to CTranslate2"
    if not isinstance(cfg, TransformerConfig):
        raise XindaError(f"{head}: only Transformer models are supported, this is a "
                         f"{cfg.arch!r} model")
    if cfg.dense != "none":
        raise XindaError(f"{head}: DLCL (model.dense: {cfg.dense}) has no CTranslate2 "
                         "equivalent")
    if cfg.fusion != "none":
        raise XindaError(f"{head}: information fusion (model.fusion: {cfg.fusion}) has no "
                         "CTranslate2 equivalent")
    return cfg


def vocabulary_tokens(vocab: Vocab) -> list[str]:
    """One token per id: the sentencepiece pieces, the special ids spelled as CTranslate2
    expects (``SPECIAL_TOKENS``); a XindaError if two ids would share a spelling."""
    names = {getattr(vocab, kind): token for kind, token in SPECIAL_TOKENS.items()}
    tokens = [names.get(i) or vocab.sp.id_to_piece(i) for i in range(vocab.size)]
    seen: dict[str, int] = {}
    for i, token in enumerate(tokens):
        if token in seen:
            raise XindaError(f"{vocab.path}: ids {seen[token]} and {i} would both be "
                             f"{token!r} in the CTranslate2 vocabulary")
        seen[token] = i
    return tokens


def _ct2_spec() -> ModuleType:
    """``xinda.export.ct2_spec``, which needs the optional ``ctranslate2`` package."""
    try:
        return importlib.import_module("xinda.export.ct2_spec")
    except ImportError as err:
        if (err.name or "").split(".")[0] != "ctranslate2":
            raise
        raise XindaError(f"exporting to CTranslate2 needs the ctranslate2 package: "
                         f"{INSTALL_HINT}") from None


def _check_output(model_dir: Path, out_dir: Path, force: bool,
                  checkpoint: Path | None = None) -> None:
    """Refuse an existing ``out_dir`` without ``force``, and always a folder that is or holds
    what the export reads (the model directory, its checkpoints, the ``checkpoint`` file) or
    that is not an earlier export (a trained model, data, a user's folder)."""
    out = out_dir.resolve()
    inputs = [model_dir, checkpoint_dir(model_dir), *([checkpoint] if checkpoint else [])]
    for given in inputs:
        path = Path(given).resolve()
        if out == path or out in path.parents:
            raise XindaError(f"{out_dir}: the output folder may not hold {given} (the export "
                             "replaces the folder it writes)")
    if out_dir.exists() and not out_dir.is_dir():
        raise XindaError(f"{out_dir}: not a folder (the export is a folder)")
    if out_dir.exists():
        _check_earlier_export(out_dir)
        if not force:
            raise XindaError(f"{out_dir}: already exists (--force replaces it)")
    check_writable(out_dir.parent, folder=True)  # made if missing


def _check_earlier_export(out_dir: Path) -> None:
    """Refuse a folder that is neither empty nor an earlier export (``EXPORT_FILES``, and files
    named as ``EXPORT_EXTRAS``, nothing else): a trained model, data or a user's folder."""
    with os_errors_named(out_dir, "cannot read"):
        entries = sorted(out_dir.iterdir())
    odd = [p.name for p in entries if not p.is_file()
           or not any(fnmatchcase(p.name, name) for name in (*EXPORT_FILES, *EXPORT_EXTRAS))]
    missing = [name for name in EXPORT_FILES if not (out_dir / name).is_file()]
    if entries and (odd or missing):
        why = f"it holds {odd[0]}" if odd else f"it has no {missing[0]}"
        raise XindaError(f"{out_dir}: not an earlier CTranslate2 export ({why}): --force "
                         "replaces only such a folder; choose another one, or an empty one")


def _spm_files(model_dir: Path) -> list[Path]:
    """The model directory's sentencepiece model(s), one path per distinct file."""
    spm = load_manifest(model_dir)["spm"]
    return [model_dir / name for name in dict.fromkeys((spm["src"], spm["tgt"]))]


def export_ctranslate2(model_dir: str | Path, out_dir: str | Path,
                       checkpoint: str | Path | None = None, quantization: str | None = None,
                       force: bool = False) -> Path:
    """Write the Transformer of ``model_dir`` (its default weights, or ``checkpoint``) as a
    CTranslate2 model directory ``out_dir`` (float32 weights unless ``quantization``, one of
    CTranslate2's types such as int8); ``force`` replaces an existing ``out_dir`` that holds an
    earlier export (any other folder is refused unless empty). The folder appears complete or
    not at all. Returns ``out_dir``."""
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    check_exportable(model_dir)
    _check_output(model_dir, out_dir, force, None if checkpoint is None else Path(checkpoint))
    target = out_dir.resolve()  # "." or "..": the temporary folder must sit beside it
    spec_module = _ct2_spec()
    translator = Translator.load(model_dir, checkpoint)
    vocabs = translator.vocabs
    converter = spec_module.XindaConverter(
        translator.model, vocabulary_tokens(vocabs.src), vocabulary_tokens(vocabs.tgt),
        _spm_files(model_dir))
    with write_errors(out_dir):
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        try:
            with write_errors(out_dir):  # (CTranslate2's OSErrors name no file: a full disk)
                converter.convert(str(tmp), quantization=quantization, force=True)
        except ValueError as err:  # e.g. an unknown quantization type
            raise XindaError(f"CTranslate2 conversion failed: {' '.join(str(err).split())}"
                             ) from None
        with write_errors(out_dir):
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
