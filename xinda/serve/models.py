"""Served models: trained model directories, named by their directory name, with their task."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from xinda.apps.generate import model_task
from xinda.decode.translator import Translator
from xinda.device import pick_precision
from xinda.errors import XindaError
from xinda.models.registry import resolve


@dataclass(frozen=True)
class ServedModel:
    name: str
    translator: Translator
    task: str  # "translate" | "couplet" | "poetry"
    arch: str  # "transformer" | "rnn"

    @classmethod
    def of(cls, name: str, translator: Translator) -> ServedModel:
        """``translator`` served as ``name``; its task from its data languages."""
        return cls(name, translator, model_task(translator), resolve(translator.cfg.model).arch)

    def info(self) -> dict:
        """The model's entry in GET /v1/models."""
        data, dec = self.translator.cfg.data, self.translator.cfg.decode
        precision = pick_precision(dec.precision, self.translator.device)  # (auto resolved)
        return {"name": self.name, "task": self.task, "arch": self.arch,
                "src_lang": data.src_lang, "tgt_lang": data.tgt_lang, "precision": precision,
                "int8_scale": dec.int8_scale if precision == "int8" else None,
                "sampling": dec.sampling}


def load_models(model_dirs: Sequence[str | Path], device: str = "cpu",
                precision: str | None = None, int8_scale: str | None = None
                ) -> dict[str, ServedModel]:
    """Load each trained model directory, named by its directory name (names must differ);
    ``precision`` and ``int8_scale`` replace the models' ``decode`` settings (int8: quantised
    now, once)."""
    models: dict[str, ServedModel] = {}
    for model_dir in map(Path, model_dirs):
        name = Path(os.path.abspath(model_dir)).name  # "." named; a link by its own name
        if name in models:
            raise XindaError(f"two model directories are named {name!r}: models are served by "
                             "their directory name")
        translator = Translator.load(model_dir, device=device)
        # one process: the server's worker thread batches the requests (forking a threaded
        # server for decode.workers is not safe)
        given = {"precision": precision, "int8_scale": int8_scale}
        translator.cfg = translator.cfg.model_copy(update={"decode": translator.decode_settings(
            {"workers": 1, **{k: v for k, v in given.items() if v}})})
        if pick_precision(translator.cfg.decode.precision, translator.device) == "int8":
            translator.int8_model()
        models[name] = ServedModel.of(name, translator)
    if not models:
        raise XindaError("no model directory given")
    if int8_scale and not any(m.info()["precision"] == "int8" for m in models.values()):
        raise XindaError("--int8-scale: used only with int8 decoding (--precision int8, or a "
                         "model's decode.precision int8), and no model decodes in int8")
    return models
