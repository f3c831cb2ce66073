"""Checkpoints: safetensors weights + a torch file of training state, both written atomically.

Below both ``xinda.train`` (which writes them) and ``xinda.decode`` (which loads weights).

A model directory holds ``checkpoints/step_NNNNNNN.safetensors`` with its
``step_NNNNNNN.state.pt`` (optimizer, RNG, data position; written second, so a checkpoint is
complete only when its state file exists), ``best.safetensors`` (best validation score) and
``averaged.safetensors`` when ``xinda average`` was run.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from xinda.errors import XindaError
from xinda.utils import atomic_save

FORMAT_VERSION = 1
_STEP = re.compile(r"step_(\d+)\.safetensors$")


def checkpoint_dir(model_dir: str | Path) -> Path:
    return Path(model_dir) / "checkpoints"


def save_weights(model: torch.nn.Module, path: str | Path) -> None:
    atomic_save(path, lambda tmp: save_model(model, str(tmp)))


def load_weights(model: torch.nn.Module, path: str | Path) -> None:
    path = Path(path)
    if not path.is_file():
        raise XindaError(f"{path}: checkpoint not found")
    missing, unexpected = load_model(model, str(path), strict=False)
    if missing or unexpected:
        raise XindaError(f"{path}: weights do not fit the model (missing {sorted(missing)[:3]}, "
                         f"unexpected {sorted(unexpected)[:3]})")


def save_checkpoint(model_dir: str | Path, step: int, model: torch.nn.Module,
                    state: dict, keep_last: int) -> Path:
    """Write weights then training state for ``step``; delete all but the newest ``keep_last``."""
    folder = checkpoint_dir(model_dir)
    weights = folder / f"step_{step:07d}.safetensors"
    save_weights(model, weights)
    state = {"format_version": FORMAT_VERSION, **state}
    atomic_save(weights.with_suffix(".state.pt"), lambda tmp: torch.save(state, tmp))
    for old in list_checkpoints(model_dir)[:-keep_last]:
        old.unlink(missing_ok=True)
        old.with_suffix(".state.pt").unlink(missing_ok=True)
    return weights


def list_checkpoints(model_dir: str | Path) -> list[Path]:
    """Complete step checkpoints (weights + state), oldest first."""
    folder = checkpoint_dir(model_dir)
    found = [p for p in folder.glob("step_*.safetensors")
             if _STEP.search(p.name) and p.with_suffix(".state.pt").is_file()]
    return sorted(found, key=lambda p: int(_STEP.search(p.name).group(1)))


def load_state(weights: Path) -> dict:
    """The training state saved beside ``weights``, after checking its format version."""
    path = weights.with_suffix(".state.pt")
    state = torch.load(path, map_location="cpu", weights_only=False)
    check_format(state, path)
    return state


def check_format(state: dict, path: Path) -> None:
    """Raise XindaError unless ``state`` was written in FORMAT_VERSION (the only format so far:
    a newer one needs a newer xinda, anything else is not a xinda training state)."""
    version = state.get("format_version") if isinstance(state, dict) else None
    if version == FORMAT_VERSION:
        return
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise XindaError(f"{path}: checkpoint format {version} is newer than this xinda reads "
                         f"({FORMAT_VERSION}); upgrade xinda")
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


def average_checkpoints(paths: list[Path], out: Path) -> None:
    """Element-wise mean of the parameters of several checkpoints (Vaswani et al. 2017, 6.1)."""
    if not paths:
        raise XindaError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    for path in paths:
        for name, tensor in load_file(str(path)).items():
            total[name] = total.get(name, 0) + tensor.double()
    averaged = {name: (t / len(paths)).float() for name, t in total.items()}
    atomic_save(out, lambda tmp: save_file(averaged, str(tmp)))
