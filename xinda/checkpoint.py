"""Checkpoints on disk: safetensors weights, and the training state as safetensors tensors plus a
JSON document, so that loading a checkpoint runs no code (no pickle anywhere). Every file is
written atomically; a checkpoint torn by a crash is detected by its checksums and never loaded.

Below both ``xinda.train`` (which writes them) and ``xinda.decode`` (which loads weights).

A model directory holds ``best.safetensors`` (best validation score), ``averaged.safetensors``
when ``xinda average`` was run, and in ``checkpoints/`` one checkpoint per saved update N
(format 3; format 2 is read too), three files written in this order::

    step_NNNNNNN.safetensors        the model weights
    step_NNNNNNN.state.safetensors  every tensor of the training state, named by its path in the
                                    state: ``optimizer.state.<param index>.<key>`` (Adam's
                                    ``exp_avg``, ``exp_avg_sq``, ``step``), ``rng`` (torch's CPU
                                    generator state)
    step_NNNNNNN.state.json         {"format_version": 3, "step": N,
                                     "files": {name: {"bytes": ..., "sha256": ...}} of the two
                                     files above, "state": everything else (optimizer
                                     param_groups, GradScaler state, progress), each tensor
                                     replaced by {"__tensor__": its name}}

The JSON document is written last, so it is the commit mark: a checkpoint is complete only when
its JSON document parses as a training state and both files have the size and SHA-256 it
records. ``list_checkpoints`` skips any other (a crash while saving, a truncated copy, a flipped
bit) with a logged warning, so ``--resume`` continues from the newest complete one. JSON keys
are strings: the optimizer's per-parameter ``state`` gets its integer keys back on loading (and
tuples such as Adam's ``betas`` come back as lists, which torch accepts). Floats keep their exact
value; an unset best score is written ``-Infinity``, as Python's json module does.

Format 1 (``step_N.state.pt``: a pickle read with ``torch.load(weights_only=False)``) is not
loaded any more, for safety: unpickling a file from someone else can run any code. A directory
holding one is refused with a message naming the file: such a run cannot be resumed or grown
(start a new run), but its weights are safetensors and still translate
(``xinda translate MODEL_DIR --checkpoint MODEL_DIR/checkpoints/step_N.safetensors``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, load_model, save_file, save_model

from xinda.errors import XindaError
from xinda.utils import atomic_save, interrupts_deferred

FORMAT_VERSION, READABLE_FORMATS = 3, (2, 3)  # raised with each field a state gains (3: 2026-11-26)
_STEP = re.compile(r"step_(\d+)\.safetensors")
_STEP_PREFIX = re.compile(r"step_(\d+)\.")  # of any of a checkpoint's three files
_TENSOR = "__tensor__"  # {"__tensor__": name} stands for a tensor of the .state.safetensors file
log = logging.getLogger("xinda")
_warned: set[str] = set()  # skipped checkpoints already reported by this process


def checkpoint_dir(model_dir: str | Path) -> Path:
    return Path(model_dir) / "checkpoints"


def state_json(weights: Path) -> Path:  # step_N.state.json beside step_N.safetensors
    return Path(weights).with_suffix(".state.json")


def state_tensors(weights: Path) -> Path:  # step_N.state.safetensors beside it
    return Path(weights).with_suffix(".state.safetensors")


# ------------------------------------------------------------------ writing and reading files
def write_file(path: Path, save: Callable[[Path], None]) -> None:
    """``save(tmp)``, flushed to disk and renamed over ``path``; a failure to write (disk full,
    no permission, ...) is a XindaError naming ``path`` and the system's reason."""
    def save_synced(tmp: Path) -> None:
        save(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())

    try:
        atomic_save(path, save_synced)
    except (OSError, SafetensorError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else error_text(err)
        raise XindaError(f"{path}: cannot write: {reason}") from None


def error_text(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def save_weights(model: torch.nn.Module, path: str | Path) -> None:
    write_file(Path(path), lambda tmp: save_model(model, str(tmp)))


def load_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Load ``path`` into ``model``; a file that is not safetensors, whose tensors do not fit
    the model (another architecture, vocabulary or size) or are not finite (a damaged file:
    translations came out empty) is a XindaError saying which."""
    path = Path(path)
    if not path.is_file():
        raise XindaError(f"{path}: checkpoint not found")
    try:
        with safe_open(str(path), "pt") as f:
            names = f.keys()  # a safe_open handle is not iterable
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in names}
    except (SafetensorError, OSError, ValueError) as err:
        raise XindaError(f"{path}: not a readable safetensors weights file ({error_text(err)})"
                         ) from None
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    wrong = [f"{name} has shape {shapes[name]} in the file but the model expects "
             f"{expected[name]}" for name in sorted(shapes)
             if name in expected and shapes[name] != expected[name]]
    if wrong:
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise XindaError(f"{path}: weights do not fit the model: {wrong[0]}{more} "
                         "(a different vocabulary or model size?)")
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except (SafetensorError, RuntimeError, OSError) as err:
        raise XindaError(f"{path}: cannot load the weights: {error_text(err)}") from None
    if missing or unexpected:
        raise XindaError(f"{path}: weights do not fit the model (a different architecture?): "
                         f"missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}")
    loaded = model.state_dict()  # (by the file's names: a tied tensor is stored once)
    if bad := [name for name in sorted(shapes) if loaded[name].is_floating_point()
               and not bool(torch.isfinite(loaded[name]).all())]:
        raise XindaError(f"{path}: holds NaN or infinite values in {bad[0]}"
                         f"{f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''}: damaged file?")


# ------------------------------------------------------------------ the training state
def split_state(state: dict) -> tuple[dict, dict[str, torch.Tensor]]:
    """``state`` as a JSON-able document and its tensors: each tensor is stored under its dotted
    path (``optimizer.state.0.exp_avg``) and replaced by ``{"__tensor__": path}``."""
    tensors: dict[str, torch.Tensor] = {}

    def split(value, name: str):
        if isinstance(value, torch.Tensor):
            if name in tensors:
                raise ValueError(f"training state: two tensors are named {name!r}")
            tensors[name] = value.detach().cpu().contiguous()
            return {_TENSOR: name}
        if isinstance(value, dict):
            return {str(k): split(v, f"{name}.{k}" if name else str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [split(v, f"{name}.{i}") for i, v in enumerate(value)]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise TypeError(f"training state: {name} is a {type(value).__name__}, which a "
                        "checkpoint cannot hold")

    return split(state, ""), tensors


def join_state(document, tensors: dict[str, torch.Tensor], where: Path):
    """The inverse of ``split_state``: the document with its tensors put back."""
    if isinstance(document, dict):
        if set(document) == {_TENSOR}:
            if document[_TENSOR] not in tensors:
                raise XindaError(f"{where}: names a tensor {document[_TENSOR]!r} that its "
                                 ".state.safetensors file lacks")
            return tensors[document[_TENSOR]]
        return {k: join_state(v, tensors, where) for k, v in document.items()}
    if isinstance(document, list):
        return [join_state(v, tensors, where) for v in document]
    return document


def save_checkpoint(model_dir: str | Path, step: int, model: torch.nn.Module,
                    state: dict, keep_last: int, off_grid: bool = False) -> Path:
    """Write the weights, the state's tensors, then its JSON document (with the checksums of
    both) for ``step``; delete all but the newest ``keep_last`` checkpoints up to ``step``,
    and first the older ones saved ``off_grid`` (where a run stopped, an epoch's end between
    save_every steps): kept to resume from, they would take the places of the regular grid's
    checkpoints, which averaging takes as samples far enough apart.
    Returns the weights' path. If writing fails, the files of a new step written so far are
    removed again; a step saved a second time (an epoch's end on a ``save_every`` step) is
    written aside and swapped in only when complete, so a failure keeps the first save."""
    folder = checkpoint_dir(model_dir)
    weights = folder / f"step_{step:07d}.safetensors"
    if off_grid:
        state = {**state, "stopped_here": True}  # (the name from before epoch ends were)
    if state_json(weights).exists():
        _resave(weights, step, model, state)
    else:
        try:
            _write_checkpoint(weights, step, model, state)
        except BaseException:
            for path in (weights, state_tensors(weights)):
                with contextlib.suppress(OSError):
                    path.unlink(missing_ok=True)
            raise
    # ranked among the steps up to this one: a newer one is a corrupt one that resuming
    # passed over, and must not take a place of the kept (it goes once the run passes it)
    done = [c for c in list_checkpoints(model_dir, verify=False) if _step_of(c) <= step]
    stopped = [c for c in done[:-1] if _stopped_here(c)]
    done = [c for c in done if c not in stopped]
    for old in stopped + done[:-keep_last]:
        for path in (state_json(old), state_tensors(old), old):  # the commit mark first
            path.unlink(missing_ok=True)
    return weights


def _stopped_here(weights: Path) -> bool:  # saved off the grid (``save_checkpoint``)
    state = (_read_document(weights, False)[0] or {}).get("state")
    return isinstance(state, dict) and bool(state.get("stopped_here"))


def _write_checkpoint(weights: Path, step: int, model: torch.nn.Module, state: dict) -> None:
    """The three files of checkpoint ``weights``, the JSON document (the commit mark) last."""
    document, tensors = split_state(state)
    save_weights(model, weights)
    write_file(state_tensors(weights), lambda tmp: save_file(tensors, str(tmp)))
    files = {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
             for p in (weights, state_tensors(weights))}
    text = json.dumps({"format_version": FORMAT_VERSION, "step": step,
                       "files": files, "state": document}, indent=1)
    write_file(state_json(weights), lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _resave(weights: Path, step: int, model: torch.nn.Module, state: dict) -> None:
    """Save over the complete checkpoint ``weights``: all three files are written in a staging
    folder first, then moved in by three renames with the old commit mark removed before them,
    so that a full disk or a crash while writing leaves the old checkpoint whole. Ctrl-C and
    SIGTERM wait for the renames; a SIGKILL or power cut between them loses this step's."""
    staging = weights.parent / f".{weights.stem}.resave"
    shutil.rmtree(staging, ignore_errors=True)  # left by a crash
    try:
        try:
            _write_checkpoint(staging / weights.name, step, model, state)
        except XindaError as err:  # name the checkpoint's own file
            raise XindaError(str(err).replace(str(staging), str(weights.parent))) from None
        with interrupts_deferred():  # a second Ctrl-C, or SIGTERM, waits for the swap
            state_json(weights).unlink()
            for name in (weights, state_tensors(weights), state_json(weights)):
                os.replace(staging / name.name, name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def finish_resaves(model_dir: str | Path) -> None:
    """Complete the swaps of ``_resave`` that a crash (SIGKILL, power cut) interrupted: a
    staging folder holding its JSON document (written last) holds a whole new checkpoint, whose
    files not yet moved in go now; any other staging folder is an unfinished write, and the
    old checkpoint is whole. Only for the process that trains into ``model_dir``."""
    for staging in checkpoint_dir(model_dir).glob(".step_*.resave"):
        weights = staging.parent / f"{staging.name[1:].removesuffix('.resave')}.safetensors"
        if state_json(staging / weights.name).is_file():
            log.warning("finishing the interrupted save of %s", weights)
            state_json(weights).unlink(missing_ok=True)
            for name in (weights, state_tensors(weights), state_json(weights)):
                if (staging / name.name).exists():
                    os.replace(staging / name.name, name)
        shutil.rmtree(staging, ignore_errors=True)


def torn_checkpoints(model_dir: str | Path) -> list[str]:
    """The names of step checkpoints' files in ``model_dir`` that no complete one owns."""
    complete = {_step_of(w) for w in list_checkpoints(model_dir, verify=False)}
    return sorted(p.name for p in checkpoint_dir(model_dir).glob("step_*")
                  if (m := _STEP_PREFIX.match(p.name)) and int(m.group(1)) not in complete)


def _read_document(weights: Path, verify: bool) -> tuple[dict | None, str]:
    """The JSON document of the checkpoint ``weights`` and "", or None and why it is not
    complete. ``verify``: also compare SHA-256 checksums (else sizes only)."""
    meta = state_json(weights)
    if not meta.is_file():
        return None, f"{meta.name} is missing (interrupted while saving?)"
    try:
        document = json.loads(meta.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        return None, f"{meta.name} is not valid JSON ({error_text(err)})"
    version = document.get("format_version") if isinstance(document, dict) else None
    if not (type(version) is int and version >= 1):  # (damaged: skipped, as a torn file is)
        return None, f"{meta.name} is not a xinda training state (format_version: {version!r})"
    check_format(document, meta)  # (format 1, or a newer xinda's: refused)
    files = document.get("files")
    for path in (weights, state_tensors(weights)):
        record = files.get(path.name) if isinstance(files, dict) else None
        if not isinstance(record, dict) or not {"bytes", "sha256"} <= set(record):
            return None, f"{meta.name} records no size and checksum of {path.name}"
        if not path.is_file():
            return None, f"{path.name} is missing"
        size = path.stat().st_size
        if size != record["bytes"]:
            return None, f"{path.name} has {size} bytes, {record['bytes']} were written"
        if verify and _sha256(path) != record["sha256"]:
            return None, f"{path.name} does not match its SHA-256 checksum"
    return document, ""


def list_checkpoints(model_dir: str | Path, verify: bool = True) -> list[Path]:
    """Complete step checkpoints, oldest first (the weights' paths). Incomplete ones are skipped
    with a warning (once per process); ``verify=False`` checks sizes, not checksums."""
    folder = checkpoint_dir(model_dir)
    _refuse_format_1(folder)
    found = []
    for weights in folder.glob("step_*.safetensors"):
        if not _STEP.fullmatch(weights.name):
            continue
        document, problem = _read_document(weights, verify)
        if document is not None:
            found.append(weights)
        elif f"{weights}: {problem}" not in _warned:
            _warned.add(f"{weights}: {problem}")
            log.warning("skipping incomplete checkpoint %s: %s", weights, problem)
    return sorted(found, key=_step_of)


def _step_of(weights: Path) -> int:
    return int(_STEP.fullmatch(weights.name).group(1))


def load_state(weights: Path) -> dict:
    """The training state saved beside ``weights`` (with its ``format_version``), after checking
    its format and the checksums of its files."""
    weights = Path(weights)
    _refuse_format_1(weights.parent, weights)
    document, problem = _read_document(weights, verify=True)
    if document is None:
        raise XindaError(f"{weights}: incomplete checkpoint: {problem}")
    if not isinstance(document.get("state"), dict):  # (damaged by hand)
        raise XindaError(f"{state_json(weights)}: not a xinda training state (its \"state\" "
                         "is not an object)")
    try:
        tensors = load_file(str(state_tensors(weights)))
    except (SafetensorError, OSError) as err:
        raise XindaError(f"{state_tensors(weights)}: unreadable ({error_text(err)})") from None
    state = state_from_parts(document["state"], tensors, state_json(weights))
    return {"format_version": document["format_version"], **state}


def state_from_parts(document, tensors: dict[str, torch.Tensor], where: Path):
    """The training state of ``split_state``'s parts, with the optimizer's integer keys back."""
    state = join_state(document, tensors, where)
    optimizer = state.get("optimizer") if isinstance(state, dict) else None
    if isinstance(optimizer, dict) and isinstance(optimizer.get("state"), dict):
        try:
            optimizer["state"] = {int(k): v for k, v in optimizer["state"].items()}
        except ValueError:
            raise XindaError(f"{where}: the optimizer's state has a key that is not a "
                             "parameter's index") from None
    return state


def _format_1_message(path: Path) -> str:
    weights = path.parent / path.name.replace(".state.pt", ".safetensors")
    return (f"{path}: checkpoint format 1 (a pickled torch file) is no longer loaded, for "
            "safety: unpickling a file can run code. Start a new run (another train.out_dir), "
            f"or translate with its weights, which still load: --checkpoint {weights}")


def _refuse_format_1(folder: Path, weights: Path | None = None) -> None:
    """Raise XindaError if ``folder`` (or just ``weights``) has a format-1 state."""
    pickles = ([weights.with_suffix(".state.pt")] if weights is not None
               else sorted(folder.glob("step_*.state.pt"), reverse=True))
    for path in pickles:  # the newest one is named
        if path.is_file():
            raise XindaError(_format_1_message(path))


def check_format(state: dict, path: Path) -> None:
    """Raise XindaError unless ``state``'s format is one of READABLE_FORMATS (a newer one needs a
    newer xinda, format 1 is refused for safety, anything else is not a xinda training state)."""
    version = state.get("format_version") if isinstance(state, dict) else None
    if type(version) is int and version in READABLE_FORMATS:
        return
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise XindaError(f"{path}: checkpoint format {version} is newer than this xinda reads "
                         f"({FORMAT_VERSION}); upgrade xinda")
    if version == 1 and type(version) is int:
        raise XindaError(_format_1_message(path))
    raise XindaError(f"{path}: not a xinda training state of format {FORMAT_VERSION} "
                     f"(format_version: {version!r})")


def default_weights(model_dir: str | Path) -> Path:
    """The weights a translator loads: averaged, else best, else the newest checkpoint."""
    model_dir = Path(model_dir)
    for name in ("averaged.safetensors", "best.safetensors"):
        if (model_dir / name).is_file():
            return model_dir / name
    ckpts = list_checkpoints(model_dir)
    if not ckpts:
        raise XindaError(f"{model_dir}: no trained weights (no best.safetensors or checkpoints)")
    return ckpts[-1]
