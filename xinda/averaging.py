"""Checkpoint averaging (Vaswani et al. 2017, 6.1): the element-wise mean of several
checkpoints' weights, written as one safetensors file (``xinda average``)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from xinda.checkpoint import error_text, write_file
from xinda.errors import XindaError


def _read_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file ``path``; a XindaError when it cannot be read."""
    if not Path(path).is_file():
        raise XindaError(f"{path}: checkpoint not found")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise XindaError(f"{path}: not a readable safetensors weights file ({error_text(err)})"
                         ) from None


def average_checkpoints(paths: list[Path], out: Path) -> None:
    """Element-wise mean of the parameters of several checkpoints (Vaswani et al. 2017, 6.1);
    a tensor of integers (a counter, an index) must be equal in all of them and is kept. The
    mean of float tensors of different precisions takes the widest (bf16 and fp32: fp32)."""
    if isinstance(paths, (str, Path)):
        raise XindaError(f"{paths}: give a list of checkpoints to average, not one path")
    if not paths:
        raise XindaError("no checkpoints to average")
    first = _read_tensors(paths[0])
    total = {name: tensor.double() for name, tensor in first.items()}
    dtypes = {name: tensor.dtype for name, tensor in first.items()}
    for path in paths[1:]:
        weights = _read_tensors(path)
        for name in total.keys() ^ weights.keys():
            raise XindaError(f"{path}: {name} is in only one of it and {paths[0]}: "
                             "checkpoints of different models cannot be averaged")
        for name, tensor in weights.items():
            if tensor.shape != total[name].shape:
                raise XindaError(f"{path}: {name} has shape {tuple(tensor.shape)}, "
                                 f"{tuple(total[name].shape)} in {paths[0]}")
            if not tensor.is_floating_point() and not torch.equal(tensor, first[name]):
                raise XindaError(f"{path}: {name} holds integers that differ from those in "
                                 f"{paths[0]}: they cannot be averaged")
            total[name] += tensor.double()
            dtypes[name] = torch.promote_types(dtypes[name], tensor.dtype)
    averaged = {name: (t / len(paths)).to(dtypes[name])
                if first[name].is_floating_point() else first[name] for name, t in total.items()}
    write_file(Path(out), lambda tmp: save_file(averaged, str(tmp)))
