"""Fuzz: the config loader (``load_config``, ``apply_overrides``) on random YAML documents,
raw random text and bytes, and random ``--set`` strings.

Properties: loading gives an ``ExperimentConfig`` or a one-line ``XindaError``; a YAML file
means the same as validating its data directly; a loaded config saved with ``save_config``
loads back unchanged; ``--set KEY=VALUE`` sets exactly ``KEY`` to ``yaml(VALUE)``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import UnionType
from typing import Annotated, Literal, Union, get_args, get_origin

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from xinda.config import ExperimentConfig, apply_overrides, load_config, save_config
from xinda.errors import XindaError

SECTIONS = {name: sorted(field.annotation.model_fields)
            for name, field in ExperimentConfig.model_fields.items()
            if hasattr(field.annotation, "model_fields")}  # data, train, decode
KEYS = st.one_of(st.sampled_from([f"{s}.{f}" for s, fs in SECTIONS.items() for f in fs]),
                 st.sampled_from(["model.preset", "model.d_model", "data.test.t1", "data",
                                  "train", "model", "data.src_lang.x", "", ".", "a..b"]),
                 st.text(max_size=12))
TRICKY_SCALARS = st.sampled_from([  # YAML that parses but may not convert, or does not parse
    "2001-13-01", "2001-02-30", "!!int x", "!!float x", "!!bool x", "!!timestamp x",
    "!!binary xx", "!!python/object:os.system x", "!!set {a}", "[", "{", "]", "*a", "&a",
    "&a [*a]", ".nan", "-.inf", "~", "0x1F", "0o17", "1_000", "1e999", "'", '"', "? a", "- a",
    "a: b: c", "\t", "%YAML 1.1", "---\n---", "@", "`", "!", "|", ">",
])
DATE_LIKE = st.from_regex(r"\d{4}-\d{1,2}-\d{1,2}([Tt ]\d{1,2}:\d\d:\d\d)?", fullmatch=True)
RAW_VALUES = st.one_of(TRICKY_SCALARS, DATE_LIKE, st.text(max_size=20))

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10))
YAML_DATA = st.recursive(  # any YAML-able (JSON-like) data
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12,
)
# documents shaped like a config: real section and field names with random values, so that
# validation gets past the first unknown key
CONFIG_TREES = st.one_of(
    st.fixed_dictionaries({}, optional={
        section: st.dictionaries(st.sampled_from(fields), YAML_DATA | RAW_VALUES, max_size=4)
        for section, fields in SECTIONS.items()
    } | {"model": st.dictionaries(st.sampled_from(["preset", "arch", "d_model"]), YAML_DATA,
                                  max_size=2)}),
    YAML_DATA,
)


def _write(data: str | bytes) -> tuple[tempfile.TemporaryDirectory, Path]:
    tmp = tempfile.TemporaryDirectory()
    path = Path(tmp.name) / "config.yaml"
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return tmp, path


def _load(data: str | bytes, user_error, overrides: list[str] = ()) -> ExperimentConfig | None:
    """load_config of a file holding ``data``: the config, or None after a one-line error."""
    tmp, path = _write(data)
    with tmp:
        try:
            return load_config(path, overrides)
        except XindaError as err:
            assert user_error(err).startswith(str(path))
            return None


def _validate(tree) -> ExperimentConfig | None:
    try:
        return ExperimentConfig.model_validate(tree)
    except ValidationError:
        return None


def _as_yaml(cfg: ExperimentConfig | None) -> str | None:
    """Configs compared as YAML: a NaN float (train.eps: .nan) is not equal to itself."""
    return None if cfg is None else yaml.safe_dump(cfg.model_dump(mode="json"))


@given(tree=CONFIG_TREES)
def test_a_yaml_document_means_its_data(tree, user_error):
    """A file holding yaml.safe_dump(tree) is accepted iff tree validates, to the same config."""
    expected = _validate({} if tree is None else tree) if isinstance(tree, dict | None) else None
    assert _as_yaml(_load(yaml.safe_dump(tree), user_error)) == _as_yaml(expected)


@given(tree=CONFIG_TREES)
def test_a_loaded_config_saves_and_loads_back_unchanged(tree, user_error):
    cfg = _load(yaml.safe_dump(tree), user_error)
    if cfg is None:
        return
    with tempfile.TemporaryDirectory() as tmp:
        save_config(cfg, Path(tmp) / "saved.yaml")
        again = load_config(Path(tmp) / "saved.yaml")
    assert _as_yaml(again) == _as_yaml(cfg)


@given(text=st.one_of(st.text(), RAW_VALUES,
                 st.lists(st.tuples(KEYS, RAW_VALUES), max_size=4).map(
                     lambda kv: "\n".join(f"{k}: {v}" for k, v in kv))))
def test_random_text_as_a_config_file(text, user_error):
    _load(text, user_error)


@given(data=st.binary(max_size=40))
def test_random_bytes_as_a_config_file(data, user_error):
    _load(data, user_error)


@given(overrides=st.lists(st.one_of(st.text(max_size=30),
                                    st.tuples(KEYS, RAW_VALUES).map("=".join)), max_size=4))
def test_random_set_strings(overrides, user_error):
    try:
        cfg = load_config(None, overrides)
    except XindaError as err:
        user_error(err)
        return
    assert isinstance(cfg, ExperimentConfig)


@given(key=st.sampled_from([f"{s}.{f}" for s, fs in SECTIONS.items() for f in fs]),
       raw=RAW_VALUES)
def test_set_puts_the_parsed_value_at_its_dotted_key(key, raw, user_error):
    try:
        value = yaml.safe_load(raw)
    except Exception:  # noqa: BLE001 - any YAML failure must become a one-line XindaError
        with pytest.raises(XindaError) as info:
            apply_overrides({}, [f"{key}={raw}"])
        user_error(info.value)
        return
    section, field = key.split(".")
    try:
        tree = apply_overrides({section: {"kept": 1}, "other": 2}, [f" {key} ={raw}"])
    except XindaError as err:  # only where YAML 1.1 reads a number unlike a person: 010, 1:30
        assert "YAML 1.1 reads" in user_error(err)
        assert type(value) in (int, float)
        assert ":" in raw or raw.strip().lstrip("+-").startswith("0")
        return
    # compared as YAML: .nan is not equal to itself, and &a [*a] is a list that holds itself
    assert yaml.safe_dump(tree) == yaml.safe_dump({section: {"kept": 1, field: value},
                                                   "other": 2})


@pytest.mark.parametrize(("text", "fragment"), [
    ("train:\n  lr: 2001-13-01\n",
     "invalid YAML: line 2, column 7: cannot convert '2001-13-01': ValueError: month"),
    ("train: {warmup_steps: !!int x}", "invalid YAML: line 1, column 23: cannot convert 'x'"),
    ("!!bool x", "invalid YAML: line 1, column 1: cannot convert 'x': KeyError: 'x'"),
    ("!!timestamp x", "invalid YAML: line 1, column 1: cannot convert 'x': AttributeError"),
    # before: read silently as 8 and 90 (YAML 1.1; YAML 1.2 reads neither so)
    ("train:\n  seed: 010\n", ("line 2, column 9: YAML 1.1 reads 010 as octal, 8: write the "
                               "number you mean, or quote '010' for text")),
    ("train: {max_seconds: 1:30}", "line 1, column 22: YAML 1.1 reads 1:30 as base 60, 90"),
    ("train: {lr: !!float 010, seed: 010}", "line 1, column 32: YAML 1.1 reads 010 as octal, 8"),
    ("[" * 5000, "invalid YAML: nested too deeply"),
    ("\"a\\nb\": 1", "a\\nb: Extra inputs are not permitted"),
    ("[]", "expected a mapping at the top level"),
    ("false", "expected a mapping at the top level"),
    (b"train: {lr: \xff}", "line 1: not UTF-8 text (invalid byte at offset 12)"),
    # before: no line (found by review)
    (b"train:\n  out_dir: caf\xe9\n", "line 2: not UTF-8 text (invalid byte at offset 21)"),
    ("train:\n  lr: 0.1\ny: \x0c\n", "invalid YAML: line 3: unacceptable character U+000C"),
], ids=["bad-date", "bad-int", "bad-bool", "bad-timestamp", "octal", "base-60", "float-010",
        "deep-nesting", "newline-in-key",
        "list-document", "false-document", "not-utf8", "not-utf8-line-2", "control-character"])
def test_found_by_fuzzing_now_one_line_errors(text, fragment, user_error):
    """Inputs that raised ValueError, KeyError, AttributeError, RecursionError or
    UnicodeDecodeError, gave a two-line message, or were silently read as an empty config."""
    tmp, path = _write(text)
    with tmp, pytest.raises(XindaError) as info:
        load_config(path)
    assert fragment in user_error(info.value)


@pytest.mark.parametrize(("items", "fragment"), [
    (["train.lr=2001-13-01"],
     "--set 'train.lr=2001-13-01': invalid YAML value: line 1, column 1: cannot convert"),
    (["train.seed=0_10"], ("--set 'train.seed=0_10': invalid YAML value: line 1, column 1: "
                          "YAML 1.1 reads 0_10 as octal, 8")),
    (["train.lr=["], ("--set 'train.lr=[': invalid YAML value: line 1, column 2: expected "
                      "the node content, but found '<stream end>'")),
    (["a\nb.c.d=1"], "--set a\\nb.c.d=1: a\\nb: Extra inputs are not permitted"),
    (["train.lr=1", "train.lr.x\x85y=1"], "--set train.lr.x\\x85y: 'lr' is not a section"),
])
def test_found_by_fuzzing_set_strings(items, fragment, user_error):
    with pytest.raises(XindaError) as info:
        load_config(None, items)
    assert fragment in user_error(info.value)


def test_an_empty_or_comment_only_file_is_all_defaults(user_error):
    assert _load("", user_error) == _load("# nothing\n", user_error) == ExperimentConfig()


def _other_values(field) -> list:
    """Candidate values other than ``field``'s default, by its type."""
    default, kind = field.default, field.annotation
    if get_origin(kind) in (Union, UnionType):  # int | Literal["auto"]: a value of each member
        members = [get_args(m)[0] if get_origin(m) is Annotated else m for m in get_args(kind)]
        return [v for m in members for v in
                ([a for a in get_args(m) if a != default] if get_origin(m) is Literal
                 else [1] if m is int else [])] or ["other"]
    if isinstance(default, bool):
        return [not default]
    if getattr(kind, "__origin__", None) is Literal:
        return [v for v in kind.__args__ if v != default]
    if isinstance(default, int):
        return [default + 1, default - 1, 1]
    if isinstance(default, float):
        return [default / 2 if default else 0.5, default + 0.5, 1e-5]
    if isinstance(default, tuple):
        return [tuple(v / 2 for v in default)]
    return ["other", {"t1": "other"}]  # str, str | None, dict[str, str]


def test_a_config_with_every_section_changed_saves_and_loads_back(tmp_path):
    """Fields of data, train and decode differ from their defaults (one at a time, kept when
    the whole still validates: SGD's momentum and the step schedule's decay are refused beside
    Adam's betas and another schedule), and survive ``save_config`` and ``load_config``."""
    tree: dict = {section: {} for section in SECTIONS}
    for section, fields in SECTIONS.items():
        specs = ExperimentConfig.model_fields[section].annotation.model_fields
        for name in fields:
            for value in _other_values(specs[name]):
                tree[section][name] = value
                if _validate(tree) is not None:
                    break
                del tree[section][name]
    cfg = _validate(tree)
    for section, fields in SECTIONS.items():
        unchanged = set(fields) - set(tree[section])
        assert len(unchanged) <= 4, (section, unchanged)
    save_config(cfg, tmp_path / "saved.yaml")
    again = load_config(tmp_path / "saved.yaml")
    assert again == cfg and _as_yaml(again) == _as_yaml(cfg)
    assert _as_yaml(again) != _as_yaml(ExperimentConfig())
