"""Typed, validated experiment configuration loaded from YAML.

One experiment = ``data`` (how ``xinda prepare`` builds the binarised corpus), ``model`` (an
architecture name or preset plus overrides, validated by the model registry), ``train`` and
``decode``. Every default is defined here, once. Unknown keys and wrong types are rejected with
the key's dotted path.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from xinda.config_yaml import apply_overrides, config_source, one_line, parse_yaml, unshared
from xinda.errors import XindaError
from xinda.utils import MAX_THREADS, atomic_write_text

Pretok = Literal["moses", "jieba", "char", "none"]  # pre-tokenisers (xinda.data.text)
Normalization = Literal["NFKC", "NFC", "none"]  # Unicode normal forms applied before it
Seed = Annotated[int, Field(ge=0, lt=2**32)]  # what numpy and sentencepiece accept
Beta = Annotated[float, Field(ge=0, lt=1)]  # an Adam moment's decay


def _count_or_auto(value: Any) -> int | str:
    """A count of 0 or more, or "auto" (one message for both, not one per union member)."""
    if value == "auto" or (type(value) is int and value >= 0):
        return value
    raise ValueError(f"{value!r}: give a number of entries (0 or more) or auto")


CountOrAuto = Annotated[int | str, PlainValidator(_count_or_auto)]
DEFAULT_PRESET = "transformer-base"  # the model of a config that names no preset or arch
MAX_ROWS = 1000  # beam, n-best, samples: decoder rows per sentence (memory grows with them)
MAX_DIST_TIMEOUT = 10 * 365 * 86400.0  # seconds: ten years, "forever" (timedelta overflows)
MAX_LENGTH = 1_000_000  # tokens: the longest position table (model.max_positions), |max_len_b|
FLOAT32_TINY = 2.0**-126  # the smallest normal float32: a smaller number is 0 or subnormal


def _is_number(annotation: Any) -> bool:
    """Whether a field's type takes numbers but not booleans (int, float, their unions,
    ``Annotated`` forms and tuples)."""
    if annotation in (bool, Any):
        return False
    args = get_args(annotation)
    return annotation in (int, float) or (any(map(_is_number, args))
                                          and not any(a in (bool, Any) for a in args))


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads true as 1, and YAML reads yes/no/on/off unquoted as booleans
        items = value if isinstance(value, (list, tuple)) else [value]
        flag = next((v for v in items if isinstance(v, bool)), None)
        if flag is not None and _is_number(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"expected a number, got the boolean {flag} (YAML reads "
                             "yes/no/on/off/true/false unquoted as booleans)")
        return value

    def _changed(self) -> set[str]:
        """The fields whose value is not their default (given, and not as the default)."""
        return {name for name, field in type(self).model_fields.items()
                if getattr(self, name) != field.get_default(call_default_factory=True)}


# data settings only sentencepiece training reads (and seed, which is left alone: a seed given
# everywhere is no mistake)
SPM_TRAINING = {"subword", "vocab_size", "joint_vocab", "character_coverage", "spm_sample",
                "byte_fallback"}


class DataConfig(Strict):
    """Raw parallel text -> cleaned, pre-tokenised, subword-encoded, binarised arrays."""

    src_lang: str = Field("en", min_length=1)  # file suffix of the source side
    tgt_lang: str = Field("de", min_length=1)  # file suffix of the target side
    train: str | None = None  # prefix: reads {train}.{src_lang}[.gz] and {train}.{tgt_lang}[.gz]
    valid: str | None = None  # prefix of the validation split
    test: dict[str, str] = Field(default_factory=dict)  # name -> prefix, e.g. {test2016: ...}
    # where arrays, sentencepiece models and manifest.json go
    out_dir: str = Field("data-bin", min_length=1)
    normalize: Normalization = "NFKC"  # Unicode normalisation
    lowercase: bool = False
    pretok_src: Pretok = "none"  # pre-tokenisation before sentencepiece
    pretok_tgt: Pretok = "none"
    # the language of Moses's rules (non-breaking prefixes such as "Mr.", apostrophes) for
    # pretok moses, when a side's file suffix is not its language code (.doc, .sum): e.g. en
    moses_lang_src: str | None = Field(None, min_length=1)  # default: src_lang
    moses_lang_tgt: str | None = Field(None, min_length=1)  # default: tgt_lang
    subword: Literal["bpe", "unigram"] = "bpe"  # sentencepiece model type
    vocab_size: int = Field(8000, ge=16, lt=2**31)  # per model (joint: one for both sides)
    joint_vocab: bool = True  # one shared sentencepiece model (enables tied embeddings)
    character_coverage: float = Field(1.0, ge=0.98, le=1)  # sentencepiece's range
    # characters outside the vocabulary as UTF-8 byte pieces, not <unk> (256 of vocab_size;
    # for Chinese, whose rare characters came out as " ⁇ ")
    byte_fallback: bool = False
    spm_model: str | None = None  # reuse an existing (joint) sentencepiece model instead
    max_len: int = Field(250, ge=1)  # drop training pairs with more subword tokens on a side
    long_pairs: Literal["drop", "truncate"] = "drop"  # or cut a side over max_len to max_len
    max_len_ratio: float = Field(3.0, gt=1)  # drop pairs whose length ratio exceeds this
    # ... when their longer side has more pieces than this: a short pair's ratio is noise
    # (走着瞧 | Wait and see: 1 and 4 pieces). Pieces, so the ratio depends on pre-tokenising:
    # BPE on unsegmented Chinese (pretok none) merges phrases (我不喜欢。 2 pieces, "I don't
    # like that." 7), and Tatoeba zh-en loses 36 of 27,055 pairs at 3.0 (jieba: 9)
    ratio_min_len: int = Field(5, ge=0)
    dedup: bool = True  # drop exact duplicate training pairs
    # sentence pairs sampled (seeded by seed) for sentencepiece training; all when fewer
    spm_sample: int = Field(1_000_000, ge=1)
    chunk_size: int = Field(50_000, ge=1, le=2**40)  # pairs read, preprocessed, encoded at a time
    workers: int = Field(1, ge=1, le=MAX_THREADS)  # processes that preprocess and encode chunks
    seed: Seed = 1

    @field_validator("test", mode="before")
    @classmethod
    def _named_tests(cls, value: object) -> object:
        if value is None:  # "test:" with nothing after it: no test set
            return {}
        if not isinstance(value, dict):  # (before: "Input should be a valid dictionary")
            example = value if isinstance(value, str) else "data/test"
            raise ValueError(  # noqa: TRY004 - pydantic reports ValueErrors, not TypeErrors
                f"give each test set a name: test: {{test: {example}}} (a mapping of names "
                "to file prefixes)")
        return value

    @model_validator(mode="after")
    def _two_sides(self) -> DataConfig:
        if self.src_lang == self.tgt_lang:
            raise ValueError(f"src_lang and tgt_lang are both {self.src_lang!r}: both sides "
                             f"would be read from the same files ({{split}}.{self.src_lang})")
        for side in ("src", "tgt"):  # (before: silently unused)
            if getattr(self, f"moses_lang_{side}") and getattr(self, f"pretok_{side}") != "moses":
                raise ValueError(f"moses_lang_{side} applies only with pretok_{side} moses (it "
                                 f"is {getattr(self, f'pretok_{side}')})")
        return self

    def unused_spm_settings(self):
        """Sentencepiece training settings given with spm_model, which it ignores (``prepare``
        warns: recipes set them, and a model may be reused with any recipe)."""
        if self.spm_model:
            for name in sorted(self._changed() & SPM_TRAINING):
                yield (f"data.{name} {getattr(self, name)} has no effect with data.spm_model: "
                       "the given sentencepiece model is used as it is, for both sides")


class TrainConfig(Strict):
    model_config = ConfigDict(allow_inf_nan=False)  # (and Strict's): no infinity or NaN

    out_dir: str = Field("runs/exp", min_length=1)  # the self-contained model directory
    seed: Seed = 1
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int = Field(0, ge=0, le=MAX_THREADS)  # torch intra-op threads; 0 = torch's default
    max_tokens: int = Field(4096, ge=1)  # tokens per batch, max(src, tgt) incl. padding
    update_freq: int = Field(1, ge=1)  # gradient accumulation: batches per update
    max_epochs: int = Field(100, ge=1)
    max_steps: int = Field(0, ge=0)  # 0 = no limit
    # wall-clock budget of the training loop (validation included), counted over resumes
    # too; 0 = no limit
    max_seconds: float = Field(0, ge=0)
    optimizer: Literal["adam", "sgd"] = "adam"
    # peak learning rate; for noam a scale: peak = lr * (d_model * warmup)^-0.5
    lr: float = Field(5e-4, gt=0)
    betas: tuple[Beta, Beta] = (0.9, 0.98)
    eps: float = Field(1e-8, gt=0)  # 0 would divide 0 by 0 where a gradient is 0 (see below)
    momentum: float = Field(0.0, ge=0, lt=1)  # SGD only (1 and more: it diverges)
    weight_decay: float = Field(0.0, ge=0)
    # every schedule restarts at its peak after each growth (`xinda grow`; train/schedule.py)
    schedule: Literal["inverse_sqrt", "noam", "step", "constant"] = "inverse_sqrt"
    warmup_steps: int = Field(4000, ge=0)
    decay_every: int = Field(1000, ge=1)  # step schedule: multiply by decay_factor every N steps
    decay_factor: float = Field(0.5, gt=0, le=1)
    min_lr: float = Field(0.0, ge=0)  # the lowest rate after the warm-up
    label_smoothing: float = Field(0.1, ge=0, lt=1)
    # output layer + loss computed this many target positions at a time (no (tokens x vocab)
    # tensor of the whole batch); 0 = the whole batch at once
    loss_chunk: int = Field(256, ge=0)
    clip_norm: float = Field(0.0, ge=0)  # 0 = no clipping
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 where fast
    # entries of oneDNN's and ideep's caches of CPU kernels (xinda.device.limit_onednn_caches):
    # few, since the batch shapes change at every update; "auto": by CPU (64 with AMX, else 8:
    # xinda.device.onednn_cache_size); 0 = leave the defaults (1024)
    onednn_cache: CountOrAuto = "auto"
    # glibc: keep freed memory in the heap for the next update instead of returning it to the
    # OS and faulting it in again (xinda.device.keep_freed_heap; for the whole process, for good)
    keep_heap: bool = True
    save_every: int = Field(0, ge=0)  # checkpoint every N updates (0: only per epoch)
    keep_last: int = Field(5, ge=1)  # step checkpoints kept on disk
    run_validation: bool = True  # validation loss (and BLEU) at each epoch end
    valid_every: int = Field(0, ge=0)  # also every N updates inside an epoch (0: epoch ends)
    valid_bleu: bool = True
    valid_beam: int = Field(1, ge=1, le=MAX_ROWS)  # validation BLEU's beam (1: greedy)
    patience: int = Field(0, ge=0)  # early stopping: epochs not better (BLEU tie: by loss); 0=off
    log_every: int = Field(50, ge=1)  # updates between CSV log rows
    progress: bool = True  # tqdm progress bar
    # torchrun (xinda.train.distributed): seconds a rank waits for the others at a collective,
    # e.g. while rank 0 validates or saves, before it stops with "lost contact"
    dist_timeout: float = Field(600.0, gt=0, le=MAX_DIST_TIMEOUT)

    @field_validator("schedule", mode="before")
    @classmethod
    def _noam_reset_is_noam(cls, value):
        # "noam_reset" (written by `xinda grow` before every schedule restarted after a
        # growth) is noam, restarted the same way
        return "noam" if value == "noam_reset" else value

    @field_validator("eps")
    @classmethod
    def _eps_in_float32(cls, value: float) -> float:
        # Adam adds eps in float32: 1e-300 is 0 there (1e-40 subnormal, 0 if flushed): NaN loss
        if value < FLOAT32_TINY:
            raise ValueError(f"{value:g} is below float32's smallest normal number "
                             f"{FLOAT32_TINY:.3g}: 0 in the optimizer's float32, a NaN loss")
        return value

    @model_validator(mode="after")
    def _schedule_fits(self) -> TrainConfig:
        if self.schedule == "inverse_sqrt" and not self.warmup_steps:
            raise ValueError("schedule inverse_sqrt needs warmup_steps >= 1: its decay "
                             "lr * sqrt(warmup / step) starts where the warm-up ends (for a "
                             "constant rate use schedule: constant)")
        if self.schedule != "noam" and self.min_lr > self.lr:  # (noam's lr is a scale)
            raise ValueError(f"min_lr {self.min_lr:g} is above the peak lr {self.lr:g}: the "
                             "rate would jump up after the warm-up")
        for problem in self._unused_settings():
            raise ValueError(problem)
        return self

    def _unused_settings(self):
        """Settings of the other optimizer or schedule, which would be silently ignored."""
        changed = self._changed()
        only = {"momentum": ("optimizer", "sgd"), "betas": ("optimizer", "adam"),
                "eps": ("optimizer", "adam"), "decay_every": ("schedule", "step"),
                "decay_factor": ("schedule", "step")}
        for name, (key, needed) in only.items():
            if name in changed and getattr(self, key) != needed:
                yield f"{name} applies only with {key} {needed} (it is {getattr(self, key)})"


class DecodeConfig(Strict):
    model_config = ConfigDict(allow_inf_nan=False)  # (and Strict's): no infinity or NaN
    BEAM_ONLY: ClassVar[tuple[str, ...]] = ("beam", "nbest", "coverage", "stop")  # sampling: unused
    SAMPLING_ONLY: ClassVar[tuple[str, ...]] = ("temperature", "top_k", "top_p", "seed", "samples")

    beam: int = Field(5, ge=1, le=MAX_ROWS)
    # GNMT length penalty ((5+|y|)/6)^alpha; 0 = none; above 10 it overflows on long outputs
    alpha: float = Field(1.0, ge=0, le=10)
    coverage: float = Field(0.0, ge=0)  # GNMT coverage penalty weight beta; 0 = none
    max_len_a: float = Field(1.5, ge=0)  # max output tokens = a * src_len + b, both with EOS
    max_len_b: int = Field(10, ge=-MAX_LENGTH, le=MAX_LENGTH)
    batch_size: int = Field(64, ge=1)  # sentences per batch (sorted by length)
    max_input_len: int = Field(250, ge=1)  # longer inputs are truncated with a warning
    nbest: int = Field(1, ge=1, le=MAX_ROWS)
    # beam search ends a sentence after `beam` finished hypotheses ("beam", fairseq) or once a
    # step's best candidate ends in EOS and `nbest` are finished ("best", OpenNMT-py, CTranslate2)
    stop: Literal["beam", "best"] = "beam"
    # auto: bf16 where it is fast; int8: dynamic int8 linear layers on CPU (xinda.models.quantize)
    precision: Literal["fp32", "bf16", "int8", "auto"] = "fp32"
    # whenever precision is int8: activations quantised by the range of the whole batch
    # (fastest; an output can change with its batch mates) or of each row (about 1.15x slower;
    # not by the batch mates' ranges: xinda.models.quantize)
    int8_scale: Literal["batch", "row"] = "batch"
    # glibc, on CPU: keep freed memory in the heap for the next step's tensors instead of
    # faulting it in again from the OS (xinda.device.keep_freed_heap; beam 5 ~10 % faster);
    # it holds for the whole process from then on (a later keep_heap false does not undo it)
    keep_heap: bool = True
    # CPU processes that decode batches side by side, one thread each (xinda.decode.workers);
    # 1: decode in this process, with its threads
    workers: int = Field(1, ge=1, le=MAX_THREADS)
    # sampling instead of beam search (xinda.decode.sampling; `xinda translate --sampling`)
    sampling: bool = False
    temperature: float = Field(1.0, gt=0)  # divides the log-probabilities (-> 0: greedy)
    top_k: int = Field(0, ge=0)  # sample among the k most probable tokens; 0 = all
    top_p: float = Field(1.0, gt=0, le=1)  # nucleus: smallest set with probability >= top_p
    samples: int = Field(1, ge=1, le=MAX_ROWS)  # samples per input sentence
    seed: int = Field(1, ge=0, lt=2**63)  # seeds the sampling generator (a torch.Generator)

    def unused_settings(self):
        """Settings that decode.sampling true would ignore or refuse, which `prepare` and
        `train` refuse in an experiment config (not a validator: a model's saved beam settings
        stay valid when its config.yaml, or `translate --sampling`, switches sampling on)."""
        if self.sampling:
            if beam := [f"decode.{k}" for k in self.BEAM_ONLY if k in self._changed()]:
                yield (f"{', '.join(beam)}: beam-search settings, not used with "
                       "decode.sampling true (decode.samples sets the outputs)")
            if self.workers > 1:
                yield ("decode.workers > 1 decodes batches out of order, and sampling draws "
                       "them from one generator in order: set decode.workers 1 with "
                       "decode.sampling true")

    @model_validator(mode="after")
    def _room_for_output(self) -> DecodeConfig:
        if self.max_len_a == 0 and self.max_len_b <= 1:  # (the EOS takes one)
            raise ValueError(f"max_len_a 0 and max_len_b {self.max_len_b} leave no room for "
                             "an output token: every translation would be empty")
        return self


class ExperimentConfig(Strict):
    data: DataConfig = Field(default_factory=DataConfig)
    # a preset or arch plus fields (xinda.models.registry.resolve); without either: the preset
    model: dict[str, Any] = Field(default_factory=lambda: {"preset": DEFAULT_PRESET})
    train: TrainConfig = Field(default_factory=TrainConfig)
    decode: DecodeConfig = Field(default_factory=DecodeConfig)


SECTIONS = tuple(ExperimentConfig.model_fields)  # data, model, train, decode


def format_validation_error(err: ValidationError, where: str, section: str = "") -> str:
    """One line: ``where`` (a file), the dotted key path (under ``section``, e.g. "model") and
    pydantic's message for the first error."""
    first = err.errors()[0]
    loc, given = list(first["loc"]), first.get("input")
    if first["type"] == "invalid_key":  # (pydantic names a key True as 1)
        loc[-1] = given
    path = ".".join([section] * bool(section) + [str(p) for p in loc])
    message = first["msg"].removeprefix("Value error, ")
    if isinstance(given, bool) and first["type"] == "invalid_key":
        message += f" (YAML reads yes/no/on/off unquoted as {given}: quote the key)"
    elif isinstance(given, bool) and first["type"] in ("string_type", "literal_error"):
        message += f" (YAML reads yes/no/on/off unquoted as {given}: quote the value)"
    elif first["type"] == "int_parsing" and re.fullmatch(r"[-+]?[\d.]+e[-+]?\d+", str(given)):
        message += f" (YAML reads {given} as text, not a number: write it out, e.g. 4000)"
    elif path.endswith("[key]") and not isinstance(given, str):
        message += f" (quote a key that YAML reads as a number: '{given}')"
    head = f"{where}: " if where else ""
    return one_line(f"{head}{path}: {message}" if path else f"{head}{message}")


def load_config(path: str | Path | None, overrides: list[str] = ()) -> ExperimentConfig:
    """Read a YAML experiment config (or start from defaults) and apply ``--set`` overrides."""
    tree: dict = {}
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise XindaError(f"config: expected a file path, got {type(path).__name__}")
    if path is not None:
        path = Path(path)
        if path.is_dir():
            raise XindaError(f"{path}: is a directory, not a config file")
        if not path.exists():  # (a pipe, <(...), is read like a file)
            raise XindaError(f"{path}: config file not found")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            line = err.object[:err.start].count(b"\n") + 1
            raise XindaError(f"{path}: line {line}: not UTF-8 text (invalid byte at offset "
                             f"{err.start})") from None
        except OSError as err:
            raise XindaError(f"{path}: cannot read: {err.strerror or err}") from None
        tree = parse_yaml(text, f"{path}: invalid YAML")
        if tree is None:  # an empty file (or only comments): all defaults
            tree = {}
        if not isinstance(tree, dict):
            raise XindaError(f"{path}: expected a mapping at the top level")
        # a section left empty (only comments) keeps its defaults
        tree = {k: v for k, v in tree.items() if v is not None or k not in SECTIONS}
    # (a copy: --set on a section must not reach another that a YAML alias shares with it;
    # apply_overrides refuses one string for a list)
    tree = apply_overrides(unshared(tree), overrides)
    try:
        return ExperimentConfig.model_validate(tree)
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(part) for part in first["loc"])
        about = first["msg"] if first["type"] == "value_error" else ""  # (a section's check)
        where = config_source(path, list(overrides), key, about)
        raise XindaError(format_validation_error(err, where)) from None


def save_config(cfg: ExperimentConfig, path: str | Path, model: BaseModel | None = None
                ) -> None:
    """Write ``cfg`` as YAML; with ``model`` (its resolved model config) the model section
    holds every field, not a preset's name: a model folder builds the same model after a
    preset or a default changes."""
    tree = cfg.model_dump(mode="json")
    if model is not None:
        tree["model"] = model.model_dump(mode="json")
    atomic_write_text(path, yaml.safe_dump(tree, sort_keys=False))
