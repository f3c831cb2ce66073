"""``xinda prepare``: raw parallel text -> sentencepiece models + binarised arrays + manifest.

Output directory layout (``cfg.out_dir``)::

    spm.model | spm.src.model + spm.tgt.model     sentencepiece model(s)
    {split}.{side}.ids.npy                        int32, every sentence's piece ids concatenated
    {split}.{side}.offsets.npy                    int64, n+1 offsets: sentence i = ids[o[i]:o[i+1]]
    {split}.{side}.txt                            valid/test only: the raw lines (refs, sources)
    manifest.json                                 written last: a directory with one is complete

``side`` is ``src`` or ``tgt``; ``split`` is ``train``, ``valid`` or a test-set name.
Only ``train`` is filtered; valid and test sets keep every line (even empty ones).
With ``data.long_pairs: truncate`` a side longer than ``data.max_len`` pieces is cut to that
length instead (in every split's arrays; the raw ``.txt`` keep the whole line), and the number
cut per side is logged and stored (``truncated`` in the filter report and the split's stats).

Control characters (Unicode category Cc other than tab, which is whitespace and collapsed like
a space: NUL, escape, carriage return inside a line, ...) never reach sentencepiece or the
arrays. A training pair with one on either side is dropped and counted under ``control_chars``
in the filter report (like every filter, before sentencepiece is trained, so it never learns
them). In valid and test sets, which keep every line, each one is replaced by a space (the
whitespace then collapses) in the arrays and in ``{split}.{side}.txt``; the number of lines so
cleaned is logged with the split and stored as ``control_chars_cleaned`` in its stats.

``manifest.json`` records ``vocab_sizes``, the number of pieces of each side's sentencepiece
model; a trained model with fewer pieces than ``data.vocab_size`` (too little training text)
is also logged as a warning.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm

from xinda.config import DataConfig
from xinda.data.arrays import TokenArrays
from xinda.data.manifest import FORMAT_VERSION, MANIFEST, SIDES
from xinda.data.text import TextPipeline
from xinda.data.vocab import SPECIAL_IDS, Vocab
from xinda.errors import XindaError
from xinda.utils import (
    atomic_path,
    atomic_write_text,
    has_control_chars,
    read_lines,
    replace_control_chars,
)

_SPLIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_ENCODE_CHUNK = 20_000

Pair = tuple[list[str], list[str]]  # (src lines, tgt lines)


# ---------------------------------------------------------------- encoding and reading


def encode_lines(sp: spm.SentencePieceProcessor, lines: Sequence[str]) -> TokenArrays:
    """Encode pre-tokenised lines in batches (no BOS/EOS)."""
    parts = [
        TokenArrays.from_sequences(sp.encode(list(lines[i:i + _ENCODE_CHUNK]), out_type=int))
        for i in range(0, len(lines), _ENCODE_CHUNK)
    ]
    return TokenArrays.concat(parts)




def corpus_file(prefix: str, lang: str) -> Path:
    """``{prefix}.{lang}`` if it exists, else ``{prefix}.{lang}.gz``."""
    plain = Path(f"{prefix}.{lang}")
    gz = Path(f"{plain}.gz")
    for path in (plain, gz):
        if path.is_file():
            return path
    for path in (plain, gz):
        if path.is_dir():
            raise XindaError(f"{path}: is a directory, not a corpus file")
    raise XindaError(f"{plain}: file not found (nor {gz})")


def read_parallel(prefix: str, src_lang: str, tgt_lang: str) -> Pair:
    """Read both sides of a parallel corpus, checking they are non-empty and aligned."""
    paths = [corpus_file(prefix, src_lang), corpus_file(prefix, tgt_lang)]
    sides = [list(read_lines(p)) for p in paths]
    for path, lines in zip(paths, sides):
        if not lines:
            raise XindaError(f"{path}: empty corpus (no lines)")
    if len(sides[0]) != len(sides[1]):
        short, long_ = (0, 1) if len(sides[0]) < len(sides[1]) else (1, 0)
        n = len(sides[short])
        raise XindaError(f"{paths[short]}:{n}: ends after {n} lines but {paths[long_]} has more")
    return sides[0], sides[1]


def control_mask(pair: Pair) -> np.ndarray:
    """True for each pair with a control character (Cc other than tab) on either side."""
    return np.array([has_control_chars(s) or has_control_chars(t) for s, t in zip(*pair)],
                    dtype=bool)


def clean_control(pair: Pair) -> tuple[Pair, int]:
    """Replace control characters by spaces; return the pair and how many lines changed."""
    cleaned, changed = [], 0
    for lines in pair:
        cleaned.append([replace_control_chars(x) if has_control_chars(x) else x for x in lines])
        changed += sum(has_control_chars(x) for x in lines)
    return (cleaned[0], cleaned[1]), changed


def _split_prefixes(cfg: DataConfig) -> dict[str, str]:
    """split name -> file prefix, train first."""
    if not cfg.train:
        raise XindaError("data.train: no training corpus given (set it to a file prefix)")
    splits = {"train": cfg.train}
    if cfg.valid:
        splits["valid"] = cfg.valid
    for name, prefix in cfg.test.items():
        if name in ("train", "valid") or not _SPLIT_NAME.match(name):
            raise XindaError(f"data.test: invalid test set name {name!r} (use letters, digits, "
                             "'_', '-', '.'; not 'train' or 'valid')")
        splits[name] = prefix
    return splits


# ---------------------------------------------------------------- sentencepiece


def _spm_error(err: Exception) -> str:
    """sentencepiece's one-line message without its source-location prefix."""
    msg = " ".join(str(err).split())
    return msg.split("] ", 1)[1] if "] " in msg else msg


def train_spm(lines: list[str], cfg: DataConfig) -> bytes:
    """Train a sentencepiece model on non-empty pre-tokenised lines; return its bytes."""
    if hasattr(spm, "set_random_generator_seed"):
        spm.set_random_generator_seed(cfg.seed)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_writer=model,
            model_type=cfg.subword, vocab_size=cfg.vocab_size, hard_vocab_limit=False,
            character_coverage=cfg.character_coverage, **SPECIAL_IDS,
            input_sentence_size=2_000_000, shuffle_input_sentence=True, num_threads=2,
            normalization_rule_name="identity",  # TextPipeline already normalised the text
            minloglevel=2,
        )
    except RuntimeError as err:
        raise XindaError(f"{cfg.train}: sentencepiece training failed: {_spm_error(err)}") from None
    return model.getvalue()


def _write_model(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def _copy_spm_model(src: str, out_dir: Path) -> None:
    path = Path(src)
    if not path.is_file():
        raise XindaError(f"{path}: sentencepiece model not found (data.spm_model)")
    data = path.read_bytes()
    try:
        spm.SentencePieceProcessor(model_proto=data)
    except RuntimeError:
        raise XindaError(f"{path}: not a valid sentencepiece model (data.spm_model)") from None
    _write_model(out_dir / "spm.model", data)


def build_spm(cfg: DataConfig, out_dir: Path, train_text: Pair) -> dict[str, str]:
    """Copy or train the sentencepiece model(s); return side -> file name in ``out_dir``."""
    if cfg.spm_model:
        _copy_spm_model(cfg.spm_model, out_dir)
        return {"src": "spm.model", "tgt": "spm.model"}
    if cfg.joint_vocab:
        lines = [line for side in train_text for line in side if line]
        _write_model(out_dir / "spm.model", train_spm(lines, cfg))
        return {"src": "spm.model", "tgt": "spm.model"}
    names = {"src": "spm.src.model", "tgt": "spm.tgt.model"}
    for side, text in zip(SIDES, train_text):
        _write_model(out_dir / names[side], train_spm([line for line in text if line], cfg))
    return names


# ---------------------------------------------------------------- filtering


def _report(read: int, dropped: dict[str, int]) -> dict:
    return {"read": read, "kept": read - sum(dropped.values()), "dropped": dropped}


def _dropped_counts(report: dict) -> str:
    d = report["dropped"]
    return (f"empty {d['empty']}, too long {d['too_long']}, length ratio {d['length_ratio']}, "
            f"duplicate {d['duplicate']}, control characters {d['control_chars']}")


def _truncated_note(counts: dict | None) -> str:
    return (f"; cut to data.max_len: {counts['src']} sources, {counts['tgt']} targets"
            if counts else "")


def format_report(split: str, report: dict) -> str:
    return (f"{split}: read {report['read']} pairs, kept {report['kept']}; dropped: "
            f"{_dropped_counts(report)}{_truncated_note(report.get('truncated'))}")


def _check_not_all_filtered(prefix: str, report: dict) -> None:
    if report["kept"] == 0:
        raise XindaError(
            f"{prefix}: all {report['read']} training pairs were removed by filtering "
            f"({_dropped_counts(report)}; see data.max_len, data.max_len_ratio)"
        )


def _first_occurrences(raw: Pair, candidates: np.ndarray) -> np.ndarray:
    """Mask of candidate pairs that are not an exact repeat of an earlier candidate."""
    seen: set[tuple[str, str]] = set()
    first = np.zeros_like(candidates)
    for i in np.flatnonzero(candidates):
        pair = (raw[0][i], raw[1][i])
        if pair not in seen:
            seen.add(pair)
            first[i] = True
    return first


def filter_train(raw: Pair, src: TokenArrays, tgt: TokenArrays, cfg: DataConfig,
                 control: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """Keep-mask and report; each dropped pair is counted under its first failed check
    (``control``, the pairs with control characters, first)."""
    ls, lt = src.lengths, tgt.lengths
    if control is None:
        control = np.zeros(len(ls), dtype=bool)
    empty = ~control & ((ls == 0) | (lt == 0))
    too_long = ~control & ~empty & ((ls > cfg.max_len) | (lt > cfg.max_len))
    ok = ~control & ~empty & ~too_long
    ratio = np.maximum(ls, lt) / np.maximum(np.minimum(ls, lt), 1)
    bad_ratio = ok & (ratio > cfg.max_len_ratio)
    keep = ok & ~bad_ratio
    duplicate = np.zeros_like(keep)
    if cfg.dedup:
        duplicate = keep & ~_first_occurrences(raw, keep)
        keep &= ~duplicate
    counts = {"empty": empty, "too_long": too_long, "length_ratio": bad_ratio,
              "duplicate": duplicate, "control_chars": control}
    return keep, _report(len(ls), {k: int(v.sum()) for k, v in counts.items()})


# ---------------------------------------------------------------- prepare


def _pipelines(cfg: DataConfig) -> dict[str, TextPipeline]:
    return {
        "src": TextPipeline(cfg.normalize, cfg.lowercase, cfg.pretok_src, cfg.src_lang),
        "tgt": TextPipeline(cfg.normalize, cfg.lowercase, cfg.pretok_tgt, cfg.tgt_lang),
    }


def _precheck_empty(prefix: str, text: Pair, control: np.ndarray) -> None:
    """Fail before training sentencepiece if every training pair has an empty side or a
    control character."""
    n, n_control = len(text[0]), int(control.sum())
    if not any(s and t and not c for s, t, c in zip(*text, control)):
        _check_not_all_filtered(prefix, _report(n, {
            "empty": n - n_control, "too_long": 0, "length_ratio": 0, "duplicate": 0,
            "control_chars": n_control}))


def _blank(text: Pair, mask: np.ndarray) -> Pair:
    """``text`` with the masked pairs emptied (kept out of sentencepiece and the arrays)."""
    src, tgt = (["" if m else x for x, m in zip(lines, mask)] for lines in text)
    return src, tgt


def _check_vocab_sizes(cfg: DataConfig, spm_files: dict[str, str], vocabs: dict[str, Vocab],
                       log: Callable[[str], None]) -> dict[str, int]:
    """Pieces per side; warn about a trained model smaller than ``data.vocab_size``."""
    sizes = {side: vocabs[side].pieces for side in SIDES}
    if not cfg.spm_model:  # a given model is used as it is
        for name, n in {spm_files[side]: sizes[side] for side in SIDES}.items():
            if n < cfg.vocab_size:
                log(f"warning: {name} has {n} pieces, fewer than data.vocab_size "
                    f"{cfg.vocab_size} (the training text is too small)")
    return sizes


def _binarise_split(split: str, raw: Pair, text: Pair, vocabs: dict[str, Vocab],
                    cfg: DataConfig, out_dir: Path,
                    control: np.ndarray | None = None) -> tuple[dict, dict | None]:
    """Encode, filter (train only) and write one split; return its stats and filter report."""
    src, tgt = (encode_lines(vocabs[side].sp, lines) for side, lines in zip(SIDES, text))
    truncated = None
    if cfg.long_pairs == "truncate":
        (src, n_src), (tgt, n_tgt) = src.truncate(cfg.max_len), tgt.truncate(cfg.max_len)
        truncated = {"src": n_src, "tgt": n_tgt}
    report = None
    if split == "train":
        keep, report = filter_train(raw, src, tgt, cfg, control)
        _check_not_all_filtered(cfg.train, report)
        src, tgt = src.select(keep), tgt.select(keep)
        if truncated:
            report["truncated"] = truncated
    else:
        for side, lines in zip(SIDES, raw):
            atomic_write_text(out_dir / f"{split}.{side}.txt", "".join(f"{x}\n" for x in lines))
    src.save(out_dir, f"{split}.src")
    tgt.save(out_dir, f"{split}.tgt")
    stats = {"pairs": len(src), "src_tokens": int(src.ids.size), "tgt_tokens": int(tgt.ids.size)}
    if truncated:
        stats["truncated"] = truncated
    return stats, report


def prepare(cfg: DataConfig, log: Callable[[str], None] = print) -> dict:
    """Run the whole ``xinda prepare`` pipeline; write ``cfg.out_dir`` and return the manifest."""
    prefixes = _split_prefixes(cfg)
    raw = {split: read_parallel(p, cfg.src_lang, cfg.tgt_lang) for split, p in prefixes.items()}
    control = control_mask(raw["train"])
    cleaned = {}
    for split in [name for name in raw if name != "train"]:
        raw[split], cleaned[split] = clean_control(raw[split])
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST).unlink(missing_ok=True)  # the directory is incomplete until the end
    pipes = _pipelines(cfg)
    text = {split: tuple(pipes[side].preprocess_many(lines) for side, lines in zip(SIDES, pair))
            for split, pair in raw.items()}
    text["train"] = _blank(text["train"], control)
    _precheck_empty(cfg.train, text["train"], control)
    spm_files = build_spm(cfg, out_dir, text["train"])
    vocabs = {side: Vocab(out_dir / spm_files[side]) for side in SIDES}
    vocab_sizes = _check_vocab_sizes(cfg, spm_files, vocabs, log)
    splits, filter_report = {}, {}
    for split, pair in raw.items():
        splits[split], report = _binarise_split(split, pair, text[split], vocabs, cfg, out_dir,
                                                control if split == "train" else None)
        if report is not None:
            filter_report = report
            log(format_report(split, report))
        else:
            splits[split]["control_chars_cleaned"] = cleaned[split]
            note = (f"; {cleaned[split]} lines with control characters cleaned"
                    if cleaned[split] else "") + _truncated_note(splits[split].get("truncated"))
            log(f"{split}: {splits[split]['pairs']} pairs (not filtered{note})")
    manifest = {
        "format_version": FORMAT_VERSION,
        "src_lang": cfg.src_lang,
        "tgt_lang": cfg.tgt_lang,
        "joint_vocab": spm_files["src"] == spm_files["tgt"],
        "spm": spm_files,
        "vocab_sizes": vocab_sizes,
        "text": {side: pipes[side].to_dict() for side in SIDES},
        "splits": splits,
        "filter_report": filter_report,
        "config": cfg.model_dump(mode="json"),
    }
    atomic_write_text(out_dir / MANIFEST, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest
