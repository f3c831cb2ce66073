"""Model registry: architecture name -> (config class, builder), and named presets.

A model spec in YAML is either ``{preset: NAME, <overrides>}`` or ``{arch: NAME, <fields>}``;
``resolve`` validates it into the architecture's typed config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from xinda.config import DEFAULT_PRESET, format_validation_error
from xinda.data.vocab import VocabInfo
from xinda.errors import XindaError
from xinda.models.base import Seq2SeqModel


@dataclass(frozen=True)
class Architecture:
    config: type[BaseModel]
    build: Callable[[Any, VocabInfo], Seq2SeqModel]
    description: str


ARCHITECTURES: dict[str, Architecture] = {}
PRESETS: dict[str, dict[str, Any]] = {}
PRESET_NOTES: dict[str, str] = {}


def register_architecture(name: str, config: type[BaseModel], description: str):
    def wrap(build):
        ARCHITECTURES[name] = Architecture(config, build, description)
        return build
    return wrap


def register_preset(name: str, note: str = "", **fields: Any) -> None:
    """Register a named model config; ``note`` is the one-line description `xinda models` shows."""
    PRESETS[name] = dict(fields)
    PRESET_NOTES[name] = note


def _load_families() -> None:
    import xinda.models.rnn
    import xinda.models.transformer  # noqa: F401  (registers itself)


def resolve(spec: dict[str, Any], where: str = "") -> BaseModel:
    """Validate a model spec (preset + overrides, or arch + fields) into its config. Errors name
    the key as ``model.KEY``, after ``where`` (the config file) when given."""
    _load_families()
    head = f"{where}: " if where else ""
    if not isinstance(spec, dict):
        raise XindaError(f"{head}model: expected a mapping (preset or arch and fields), got "
                         f"{type(spec).__name__} {spec!r:.40}")
    spec = dict(spec)
    if "preset" not in spec and "arch" not in spec:  # e.g. only `--set model.dropout=0.3`
        spec["preset"] = DEFAULT_PRESET
    fields: dict[str, Any] = {}
    if "preset" in spec:
        name = spec.pop("preset")
        if not isinstance(name, str) or name not in PRESETS:
            raise XindaError(f"{head}model.preset: unknown preset {name!r}; known: "
                             f"{', '.join(PRESETS)}")
        fields.update(PRESETS[name])
        if spec.get("arch", fields["arch"]) != fields["arch"]:
            raise XindaError(f"{head}model.arch: {spec['arch']!r} conflicts with preset "
                             f"{name!r}, a {fields['arch']} model (drop one of them)")
        if set(ARCHITECTURES[fields["arch"]].config.model_fields) <= set(spec):
            raise XindaError(f"{head}model: preset {name!r} beside every field (as a trained "
                             "model's config.yaml writes them), which would override all of "
                             "the preset's: give the preset and only the fields to change, "
                             "or the fields alone")
    fields.update(spec)
    arch = fields.get("arch")
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise XindaError(f"{head}model.arch: unknown architecture {arch!r}; known: "
                         f"{', '.join(ARCHITECTURES)}")
    try:
        return ARCHITECTURES[arch].config.model_validate(fields)
    except ValidationError as err:
        raise XindaError(format_validation_error(err, where, "model")) from None


def build_model(spec: dict[str, Any] | BaseModel, vocab: VocabInfo) -> Seq2SeqModel:
    cfg = spec if isinstance(spec, BaseModel) else resolve(spec)
    return ARCHITECTURES[cfg.arch].build(cfg, vocab)


def list_presets() -> list[tuple[str, str, BaseModel]]:
    _load_families()
    return [(name, fields["arch"], resolve({"preset": name})) for name, fields in PRESETS.items()]
