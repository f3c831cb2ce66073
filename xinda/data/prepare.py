"""``xinda prepare``: raw parallel text -> sentencepiece models + binarised arrays + manifest.

Output directory layout (``cfg.out_dir``)::

    spm.model | spm.src.model + spm.tgt.model     sentencepiece model(s)
    {split}.{side}.ids.npy                        int32, every sentence's piece ids concatenated
    {split}.{side}.offsets.npy                    int64, n+1 offsets: sentence i = ids[o[i]:o[i+1]]
    {split}.{side}.txt                            valid/test only: the raw lines (refs, sources)
    manifest.json                                 written last: a directory with one is complete
    .staging-*/                                   while it runs: the new dataset, moved into place
                                                  only once whole (a failed or interrupted run
                                                  leaves the directory's earlier dataset as it
                                                  was); inside it .spool-*/, the preprocessed
                                                  training text; removed at the end, on errors
                                                  and on Ctrl-C

``side`` is ``src`` or ``tgt``; ``split`` is ``train``, ``valid`` or a test-set name.
Only ``train`` is filtered; valid and test sets keep every line (even empty ones).
With ``data.long_pairs: truncate`` a side longer than ``data.max_len`` pieces is cut to that
length instead (in every split's arrays; the raw ``.txt`` keep the whole line), and the number
cut per side is logged and stored (``truncated`` in the filter report and the split's stats).

Control characters (Unicode category Cc other than tab, which is whitespace and collapsed like
a space: NUL, escape, carriage return inside a line, ...; a file in UTF-16 is an error when it
is read, see ``xinda.utils.decode_lines``) never reach sentencepiece or the arrays. A training pair
with one on either side is dropped and counted under ``control_chars`` in the filter report.
Pairs with a control character or an empty side, and repeats of an earlier pair (with
``data.dedup``), are left out of sentencepiece's sample, so it never learns them; the filters
that count pieces (``data.max_len``, ``data.max_len_ratio``) need the trained model and run
after it. In valid and test sets, which keep every line, each control character is replaced by
a space (the whitespace then collapses) in the arrays and in ``{split}.{side}.txt``; the number
of lines so cleaned is logged with the split and stored as ``control_chars_cleaned`` in its
stats.

``manifest.json`` records ``vocab_sizes``, the number of pieces of each side's sentencepiece
model; a trained model with fewer pieces than ``data.vocab_size`` (too little training text)
is also logged as a warning.

The training corpus is streamed (``xinda.data.train_stream``): sentencepiece trains on a seeded
sample of ``data.spm_sample`` pairs (the whole corpus, in order, when it is smaller) and the
arrays grow chunk by chunk, so memory does not grow with the corpus (except for the
deduplication digest, about 100 bytes per distinct pair, see ``xinda.data.filtering``). Valid
and test sets are small and read whole. The output does not depend on ``data.chunk_size`` or
``data.workers``.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import sentencepiece as spm

from xinda.config import DataConfig
from xinda.data.filtering import (
    DROPPED_FILE,
    filter_train,  # noqa: F401 - re-exported for callers
    format_report,
    heavy_drop_warning,
    truncated_note,
)
from xinda.data.lock import locked
from xinda.data.manifest import FORMAT_VERSION, MANIFEST, SIDES
from xinda.data.stream import (
    Pair,
    corpus_file,  # noqa: F401 - re-exported for callers
    corpus_files,
    read_parallel,
)
from xinda.data.text import TextPipeline, moses_has_rules
from xinda.data.train_stream import (
    binarise_train,
    encode_lines,
    spool_train,
    worker_pool,
)
from xinda.data.vocab import SPECIAL_IDS, Vocab
from xinda.errors import XindaError
from xinda.utils import (
    atomic_path,
    atomic_write_text,
    check_writable,
    has_control_chars,
    os_errors_named,
    replace_control_chars,
    write_errors,
)

LOCK = ".prepare.lock"  # held in data.out_dir while a prepare writes it
LOCKED = ("{path.parent}: another xinda prepare is writing this folder (it holds {path.name}); "
          "wait for it or choose another data.out_dir")
_SPLIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


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


def _spm_error(err: Exception, byte_fallback: bool) -> str:
    """sentencepiece's one-line message without its source-location prefix, in xinda's
    setting names."""
    msg = " ".join(str(err).split())
    msg = msg.split("] ", 1)[1] if "] " in msg else msg
    hint = ("(data.character_coverage); data.byte_fallback's 256 byte pieces count too"
            if byte_fallback else "(data.character_coverage), or set data.byte_fallback")
    return msg.replace("Increase vocab_size", "Increase data.vocab_size").replace(
        "with --character_coverage option", hint)


def train_spm(lines: list[str], cfg: DataConfig) -> bytes:
    """Train a sentencepiece model on non-empty pre-tokenised lines; return its bytes."""
    if hasattr(spm, "set_random_generator_seed"):
        spm.set_random_generator_seed(cfg.seed)
    model = io.BytesIO()
    longest = max((len(line.encode()) for line in lines), default=0)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_writer=model,
            model_type=cfg.subword, vocab_size=cfg.vocab_size, hard_vocab_limit=False,
            character_coverage=cfg.character_coverage, byte_fallback=cfg.byte_fallback,
            **SPECIAL_IDS,
            input_sentence_size=0,  # all the lines given: data.spm_sample sampled them
            # in bytes: sentencepiece skips longer lines (by default over 4192) without a
            # word, and characters only they hold become <unk>
            max_sentence_length=max(4192, longest + 16),
            num_threads=2,
            normalization_rule_name="identity",  # TextPipeline already normalised the text
            minloglevel=2,
        )
    except RuntimeError as err:
        raise XindaError(f"{cfg.train}: sentencepiece training failed: "
                         f"{_spm_error(err, cfg.byte_fallback)}") from None
    return model.getvalue()


def _write_model(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def read_spm_model(src: str) -> bytes:
    """The bytes of the sentencepiece model ``data.spm_model``, checked to load."""
    path = Path(src)
    if path.is_dir():
        raise XindaError(f"{path}: is a directory, not a sentencepiece model (data.spm_model)")
    if not path.is_file():
        raise XindaError(f"{path}: sentencepiece model not found (data.spm_model)")
    with os_errors_named(path, "cannot read"):
        data = path.read_bytes()
    try:  # (the model_proto= argument skips empty bytes without a word)
        spm.SentencePieceProcessor().LoadFromSerializedProto(data)
    except RuntimeError:
        raise XindaError(f"{path}: not a valid sentencepiece model (data.spm_model)") from None
    return data


def build_spm(cfg: DataConfig, out_dir: Path, train_text: Pair,
              given: bytes | None = None) -> dict[str, str]:
    """Write the ``given`` sentencepiece model or train the model(s); return side -> file name
    in ``out_dir``."""
    if given is not None:
        _write_model(out_dir / "spm.model", given)
        return {"src": "spm.model", "tgt": "spm.model"}
    if cfg.joint_vocab:
        lines = [line for side in train_text for line in side if line]
        _write_model(out_dir / "spm.model", train_spm(lines, cfg))
        return {"src": "spm.model", "tgt": "spm.model"}
    names = {"src": "spm.src.model", "tgt": "spm.tgt.model"}
    for side, text in zip(SIDES, train_text):
        _write_model(out_dir / names[side], train_spm([line for line in text if line], cfg))
    return names


# ---------------------------------------------------------------- prepare


def _pipelines(cfg: DataConfig, log: Callable[[str], None]) -> dict[str, TextPipeline]:
    """Each side's text pipeline; a warning when Moses has no rules for its language."""
    pipes = {}
    for side, pretok, suffix, moses_lang in (
            ("src", cfg.pretok_src, cfg.src_lang, cfg.moses_lang_src),
            ("tgt", cfg.pretok_tgt, cfg.tgt_lang, cfg.moses_lang_tgt)):
        lang = moses_lang or suffix
        if pretok == "moses" and not moses_has_rules(lang):
            setting = f"data.moses_lang_{side}" if moses_lang else f"data.{side}_lang"
            log(f"warning: {setting} {lang!r} is not a language Moses has rules for "
                f"(apostrophes, abbreviations): \"O'Neil's\" becomes \"O ' Neil ' s\"; set "
                f"data.moses_lang_{side}, e.g. en")
        pipes[side] = TextPipeline(cfg.normalize, cfg.lowercase, pretok, lang)
    return pipes


def _check_vocab_sizes(cfg: DataConfig, spm_files: dict[str, str], vocabs: dict[str, Vocab],
                       log: Callable[[str], None]) -> dict[str, int]:
    """Pieces per side; warn about a trained model smaller than ``data.vocab_size``."""
    sizes = {side: vocabs[side].pieces for side in SIDES}
    if not cfg.spm_model:  # a given model is used as it is
        for name, n in {spm_files[side]: sizes[side] for side in SIDES}.items():
            if n < cfg.vocab_size:
                log(f"warning: {name} has {n} pieces, fewer than data.vocab_size "
                    f"{cfg.vocab_size} (the training text is too small)")
    for problem in cfg.unused_spm_settings():
        log(f"warning: {problem}")
    return sizes


def _binarise_eval_split(split: str, raw: Pair, pipes: dict[str, TextPipeline],
                         vocabs: dict[str, Vocab], cfg: DataConfig, out_dir: Path) -> dict:
    """Preprocess, encode and write a valid or test split (every line kept); its stats."""
    src, tgt = (encode_lines(vocabs[side].sp, pipes[side].preprocess_many(lines))
                for side, lines in zip(SIDES, raw))
    truncated = None
    if cfg.long_pairs == "truncate":
        (src, n_src), (tgt, n_tgt) = src.truncate(cfg.max_len), tgt.truncate(cfg.max_len)
        truncated = {"src": n_src, "tgt": n_tgt}
    for side, lines in zip(SIDES, raw):
        atomic_write_text(out_dir / f"{split}.{side}.txt", "".join(f"{x}\n" for x in lines))
    src.save(out_dir, f"{split}.src")
    tgt.save(out_dir, f"{split}.tgt")
    stats = {"pairs": len(src), "src_tokens": int(src.ids.size), "tgt_tokens": int(tgt.ids.size),
             # pieces of characters the vocabulary lacks (not in the training text, or left out
             # by data.character_coverage): the model can neither read nor write them
             "unk": {side: int((arrays.ids == vocabs[side].unk).sum())
                     for side, arrays in zip(SIDES, (src, tgt))}}
    if truncated:
        stats["truncated"] = truncated
    return stats


@contextmanager
def _staging_dir(out_dir: Path) -> Iterator[Path]:
    """A temporary folder inside ``out_dir`` (on the output's disk, not in a memory-backed
    /tmp) where the new dataset is built; gone afterwards. On failure ``out_dir`` keeps what it
    held (and goes again if this made it and nothing else is in it). ``out_dir`` is locked
    meanwhile: a second prepare into it is refused, and the staging folders found there were
    left by a killed run (SIGKILL, the OOM killer) and are removed."""
    made = not out_dir.exists()
    with write_errors(out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
        check_writable(out_dir, folder=True)
    try:
        with locked(out_dir / LOCK, LOCKED):
            for left in out_dir.glob(".staging-*"):
                shutil.rmtree(left, ignore_errors=True)
            with tempfile.TemporaryDirectory(prefix=".staging-", dir=out_dir) as tmp:
                yield Path(tmp)
    except BaseException:
        if made and not any(out_dir.iterdir()):
            out_dir.rmdir()
        raise


def _publish(stage: Path, out_dir: Path) -> None:
    """Move the finished dataset from ``stage`` into ``out_dir``, the manifest last: a reader
    never sees a manifest with files of another run (a crash inside leaves no manifest). The
    files of the dataset it replaces that this one does not have (a test set dropped, one
    vocabulary instead of two) go first."""
    stale = _dataset_files(out_dir) - {path.name for path in stage.iterdir()}
    (out_dir / MANIFEST).unlink(missing_ok=True)
    for name in sorted(stale):
        (out_dir / name).unlink(missing_ok=True)
    for path in sorted(stage.iterdir(), key=lambda p: p.name == MANIFEST):
        os.replace(path, out_dir / path.name)


def _dataset_files(out_dir: Path) -> set[str]:
    """The files the manifest in ``out_dir`` names (none without a readable one): its
    sentencepiece models and each split's arrays and text."""
    try:
        manifest = json.loads((out_dir / MANIFEST).read_text(encoding="utf-8"))
        spm_files, splits = set(manifest["spm"].values()), list(manifest["splits"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()
    names = spm_files | {DROPPED_FILE} | {f"{split}.{side}.{kind}" for split in splits
                                          for side in SIDES
                                          for kind in ("ids.npy", "offsets.npy", "txt")}
    return {name for name in names if isinstance(name, str) and Path(name).name == name}


def _prepare_train(cfg: DataConfig, pipes: dict[str, TextPipeline], stage: Path,
                   spm_model: bytes | None) -> tuple[dict[str, str], dict, dict]:
    """Stream the training corpus: sentencepiece model(s) (``spm_model`` when given), then
    arrays, into ``stage``. Returns the model files, the split's stats and the filter
    report."""
    files = corpus_files(cfg.train, cfg.src_lang, cfg.tgt_lang)
    with worker_pool(cfg.workers) as pool, \
            tempfile.TemporaryDirectory(prefix=".spool-", dir=stage) as tmp:
        spool = spool_train(files, cfg, (pipes["src"], pipes["tgt"]), pool,
                            Path(tmp) / "train.pkl")
        spm_files = build_spm(cfg, stage, spool.sample, spm_model)
        spool.sample = ([], [])
        models = (str(stage / spm_files["src"]), str(stage / spm_files["tgt"]))
        stats, report = binarise_train(spool, models, cfg, stage, pool)
    return spm_files, stats, report


def _build(cfg: DataConfig, pipes: dict[str, TextPipeline], raw: dict[str, Pair],
           cleaned: dict[str, int], stage: Path, log: Callable[[str], None],
           spm_model: bytes | None = None) -> dict:
    """Write the whole dataset into ``stage`` (with the sentencepiece model ``spm_model`` when
    given); return its manifest."""
    spm_files, train_stats, filter_report = _prepare_train(cfg, pipes, stage, spm_model)
    vocabs = {side: Vocab(stage / spm_files[side]) for side in SIDES}
    vocab_sizes = _check_vocab_sizes(cfg, spm_files, vocabs, log)
    log(format_report("train", filter_report))
    if warning := heavy_drop_warning(filter_report, train_stats):
        log(warning)
    splits = {"train": train_stats}
    for split, pair in raw.items():
        splits[split] = _binarise_eval_split(split, pair, pipes, vocabs, cfg, stage)
        splits[split]["control_chars_cleaned"] = cleaned[split]
        unk = splits[split]["unk"]
        note = (f"; {cleaned[split]} lines with control characters cleaned"
                if cleaned[split] else "") + truncated_note(splits[split].get("truncated")) + (
            f"; <unk> pieces: {unk['src']} source, {unk['tgt']} target" + (
                "" if cfg.byte_fallback or cfg.spm_model
                else ", which data.byte_fallback true spells in bytes")
            if any(unk.values()) else "")
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
    atomic_write_text(stage / MANIFEST, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest


def prepare(cfg: DataConfig, log: Callable[[str], None] = print) -> dict:
    """Run the whole ``xinda prepare`` pipeline; write ``cfg.out_dir`` and return the manifest.
    With ``cfg.workers`` > 1 the workers start by spawning, which imports the calling script
    again: a script must call this under ``if __name__ == "__main__":``."""
    if not isinstance(cfg, DataConfig):
        raise XindaError(f"prepare takes a DataConfig (an experiment's .data), not "
                         f"{type(cfg).__name__}")
    prefixes = _split_prefixes(cfg)
    for prefix in prefixes.values():  # a missing file fails at once
        corpus_files(prefix, cfg.src_lang, cfg.tgt_lang)
    spm_model = read_spm_model(cfg.spm_model) if cfg.spm_model else None  # so does a bad model
    raw, cleaned = {}, {}
    for split in list(prefixes)[1:]:  # valid and test sets: small, read whole
        raw[split], cleaned[split] = clean_control(
            read_parallel(prefixes[split], cfg.src_lang, cfg.tgt_lang))
    out_dir, pipes = Path(cfg.out_dir), _pipelines(cfg, log)
    if (out_dir / "config.yaml").is_file():  # what `xinda train` writes in train.out_dir
        raise XindaError(f"{out_dir}: holds a trained model (config.yaml), whose vocabulary "
                         "a new dataset would replace: choose another data.out_dir")
    # out_dir keeps its dataset until the new one is whole; a full disk names it
    with _staging_dir(out_dir) as stage, os_errors_named(out_dir):
        manifest = _build(cfg, pipes, raw, cleaned, stage, log, spm_model)
        _publish(stage, out_dir)
    return manifest
