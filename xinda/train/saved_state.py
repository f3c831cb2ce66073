"""The training state of a checkpoint, checked before ``--resume`` or ``xinda grow`` uses it.

The JSON document of a checkpoint (``step_N.state.json``) carries no checksum of its own: a
hand edit or a damaged copy that still parses (``"step": "x"``, a missing ``"optimizer"``) is
a one-line error naming the file here, before anything is written (it was a TypeError or
KeyError deep in the loop, and ``xinda grow`` left a half-written model directory).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch

from xinda.errors import XindaError
from xinda.train.progress import Progress

log = logging.getLogger("xinda")
_KINDS = {"int": (int,), "float": (int, float), "str": (str,)}  # Progress field types


def checked_state(state: dict, where: Path,
                  optimizer: torch.optim.Optimizer | None = None) -> dict:
    """``state`` (``checkpoint.load_state``'s) once it holds what resuming and growing read,
    of the right types; else a XindaError naming ``where`` (its JSON document). An optimizer
    state for other parameters than ``optimizer``'s is dropped with a warning."""
    if problem := _state_problem(state):
        raise XindaError(f"{where}: {problem}: a damaged or edited checkpoint (delete its "
                         "step_N files to continue from the one before)")
    if optimizer is not None and state["optimizer"] is not None:
        saved = [len(group.get("params", ())) for group in state["optimizer"]["param_groups"]]
        model = [len(group["params"]) for group in optimizer.param_groups]
        if saved != model:
            log.warning("%s: its optimizer state is for %s parameters, the model has %s (saved "
                        "by an older xinda, whose model had other parameters): the optimizer "
                        "starts afresh", where, saved, model)
            state["optimizer"] = None
    return state


def _state_problem(state) -> str:
    """What is wrong with ``state``, or ""."""
    if not isinstance(state, dict):
        return "the training state is not a JSON object"
    for key in ("optimizer", "scaler", "rng", "progress"):
        if key not in state:
            return f"the training state has no {key!r}"
    optimizer = state["optimizer"]  # None after `xinda grow`
    if optimizer is not None and not (isinstance(optimizer, dict)
                                      and isinstance(optimizer.get("state"), dict)
                                      and _dicts(optimizer.get("param_groups"))):
        return "'optimizer' is not an optimizer state (its 'state' and 'param_groups')"
    if not isinstance(state["scaler"], dict):
        return f"'scaler' is {state['scaler']!r}, not an object"
    if not _generator(state["rng"]):
        return "'rng' is not a random generator state"
    if (bpu := state.get("batches_per_update")) is not None and not _count(bpu, 1):
        return f"'batches_per_update' is {bpu!r}, not a positive whole number"
    return _ranks_problem(state.get("ranks")) or progress_problem(state["progress"])


def _ranks_problem(ranks) -> str:
    """What is wrong with the ranks' generator states (absent: None), or ""."""
    if ranks is None:
        return ""
    if not (isinstance(ranks, dict) and _count(ranks.get("world_size"), 1)
            and isinstance(ranks.get("rng"), list)
            and all(isinstance(r, dict) and all(map(_generator, r.values()))
                    for r in ranks["rng"])):
        return "'ranks' is not the ranks' random generator states"
    return ""


def progress_problem(progress) -> str:
    """What is wrong with a checkpoint's ``progress`` (``Progress`` as a dict), or ""."""
    if not isinstance(progress, dict):
        return "'progress' is not an object"
    fields = {f.name: f.type for f in dataclasses.fields(Progress)}
    for name, value in progress.items():
        if name not in fields:
            return f"progress.{name} is not a field of a training progress"
        kind, optional = fields[name].removesuffix(" | None"), fields[name].endswith("None")
        if value is None and optional:
            continue
        if kind.startswith("list["):
            ok = isinstance(value, list) and all(_of(v, kind[5:-1]) for v in value)
            ok = ok and (name != "log_window" or len(value) == 4)
        else:
            ok = _of(value, kind) and (kind != "int" or value >= 0)
        if not ok:
            return f"progress.{name} is {value!r}, not {_WORDS.get(kind, kind)}"
    return ""


_WORDS = {"int": "a whole number >= 0", "float": "a number", "str": "a string",
          "list[int]": "a list of whole numbers", "list[float]": "a list of 4 numbers"}


def _of(value, kind: str) -> bool:
    return isinstance(value, _KINDS[kind]) and not isinstance(value, bool)


def _count(value, least: int) -> bool:
    return _of(value, "int") and value >= least


def _dicts(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


def _generator(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == torch.uint8
