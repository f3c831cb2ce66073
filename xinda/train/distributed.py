"""Data-parallel training with torch.distributed, launched by ``torchrun``.

``torchrun --nproc_per_node N -m xinda.cli train CONFIG`` starts N processes (ranks) with
``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` in their environment; ``Ranks.from_env`` then joins
the process group (gloo on CPU, NCCL on CUDA with device ``cuda:LOCAL_RANK``) and the trainer
wraps its model in DistributedDataParallel. Without that environment (or with one rank) it is
one process and no process group, exactly as before.

How the work is shared (see ``Trainer.train_epoch``):

- Every rank builds the same batch list of an epoch (same seed). One update takes the next
  ``ranks x update_freq`` batches and deals them out round-robin: rank r gets batches r, r+W,
  r+2W, ... of the group. So W ranks with ``update_freq`` F train on exactly the batches of one
  process with ``update_freq`` W x F, and ``Progress.batch`` (the next batch of the epoch) means
  the same for every number of ranks. The effective batch is ``max_tokens x ranks x
  update_freq`` tokens.
- No batch is dropped: when the epoch's last group is short, a rank left without a batch runs
  one with its loss multiplied by 0, so that every rank takes part in the gradient all-reduce.
- Gradients are normalised by the target tokens of the whole group (every rank computes that
  count from the sentence lengths it already has), and each rank's loss is multiplied by W
  because DDP averages gradients over ranks: the update is the one of a single process that
  accumulates the same batches.
- Random numbers: the model is initialised from ``train.seed`` on every rank; then rank 0 keeps
  that stream (it is the single process's) and rank r > 0 reseeds from (seed, r). Each rank's
  generator state is saved in every checkpoint, so ``--resume`` with the same number of ranks is
  exact; with another number, data position and weights are restored and the new ranks' streams
  are derived from (seed, rank, step).
- Only rank 0 writes (checkpoints, log.csv, curves, train_stats.json, the config copy) and
  validates; the others wait for it at their next collective. Rank 0 reads the checkpoint on
  ``--resume`` and sends it to the others (its tensors with ``dist.broadcast``, not pickled), so
  the model directory need not be shared.
- A rank that dies makes the others' next collective fail (at once when its connections close,
  else after ``train.dist_timeout`` seconds): each survivor stops with one line naming its rank,
  and torchrun ends the job. ``--resume`` continues from the last checkpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
import torch.distributed as dist
from pydantic import BaseModel
from torch.nn.parallel import DistributedDataParallel

from xinda import checkpoint as ckpt
from xinda.device import cpu_cores, oversubscription_warning, pick_device
from xinda.errors import XindaError

T = TypeVar("T")

log = logging.getLogger("xinda")

# train settings a machine may set for itself; the ranks must agree on all the others
NODE_LOCAL = frozenset({"out_dir", "threads", "device", "onednn_cache", "keep_heap", "progress",
                        "dist_timeout"})


def settings_fingerprint(model: BaseModel, train: BaseModel) -> str:
    """A digest of what every rank must train with alike: the model's settings and the train
    settings but ``NODE_LOCAL`` (another seed or max_tokens gives each rank other batches:
    data repeated and skipped, or a hang)."""
    shared = {"model": model.model_dump(mode="json"),
              "train": train.model_dump(mode="json", exclude=set(NODE_LOCAL))}
    return hashlib.sha256(json.dumps(shared, sort_keys=True).encode()).hexdigest()


@dataclass
class Ranks:
    """This process's place among the ranks of a data-parallel job (one rank: no job)."""

    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    owns_group: bool = False  # this object initialised the process group (and destroys it)

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, device: str, timeout: float) -> Ranks:
        """Join torchrun's process group when ``WORLD_SIZE`` > 1, else one plain process (on
        CPU, with a warning when this machine's ranks x threads exceed its cores)."""
        world = env_int("WORLD_SIZE", 1)
        where = pick_device(device)
        if where.type == "cpu" and env_int("LOCAL_RANK", 0) == 0:  # once per machine
            warn_if_crowded(env_int("LOCAL_WORLD_SIZE", 1))  # torchrun sets it
        if world <= 1:
            return cls(device=where)
        rank, local = env_int("RANK"), env_int("LOCAL_RANK", 0)
        if where.type == "cuda":
            if local >= torch.cuda.device_count():
                raise XindaError(f"rank {rank}: LOCAL_RANK {local} but this machine shows "
                                 f"{torch.cuda.device_count()} GPU(s) (CUDA_VISIBLE_DEVICES?): "
                                 "start at most one process per GPU")
            where = torch.device("cuda", local)
            torch.cuda.set_device(where)
        owns = not dist.is_initialized()
        if owns:
            join_group("nccl" if where.type == "cuda" else "gloo", rank, timeout)
        if rank > 0:  # one copy of the progress messages: rank 0's (warnings from all)
            log.setLevel(logging.WARNING)
        return cls(rank, world, where, owns)

    # ------------------------------------------------------------------ collectives
    def sum(self, *values: float) -> list[float]:
        """Each value summed over the ranks (the values themselves with one rank)."""
        if not self.enabled:
            return list(values)
        total = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(total)
        return total.tolist()

    def any(self, *flags: bool) -> list[bool]:
        """For each flag, whether it is set on any rank (so that all ranks decide alike)."""
        return [bool(total) for total in self.sum(*map(float, flags))]

    def from_main(self, value):
        """Rank 0's ``value``, on every rank (pickled between the ranks of this job only)."""
        if not self.enabled:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0, device=self.device)
        return box[0]

    def main_only(self, work: Callable[[], T]) -> T:
        """``work()`` run by rank 0, its result on every rank; a XindaError it raises is raised
        on every rank (the others would wait for rank 0, then report lost contact), once the
        ranks have left the process group together (NCCL warns at exit otherwise). Any other
        exception (an OSError, a bug) is raised as it is on rank 0 and named on the others."""
        outcome, failure = None, None
        if self.is_main:
            try:
                outcome = (work(), None)
            except XindaError as err:
                outcome = (None, str(err))
            except Exception as err:  # noqa: BLE001 - re-raised below, after the others know
                failure, outcome = err, (None, f"rank 0 failed: {type(err).__name__}: {err}")
        value, error = self.from_main(outcome)
        if error is not None:
            self.close()
            if failure is not None:
                raise failure
            raise XindaError(error)
        return value

    def state_from_main(self, read: Callable[[], dict | None]) -> dict | None:
        """``main_only(read)`` for a training state: its tensors travel as tensors
        (``dist.broadcast`` on this rank's device, one by one), the rest is pickled, so that a
        large optimizer state is never pickled whole. The tensors arrive on the CPU."""
        if not self.enabled:
            return read()
        tensors: dict[str, torch.Tensor] = {}

        def layout() -> tuple | None:  # rank 0: the state without its tensors, their shapes
            state = read()
            if state is None:
                return None
            document, found = ckpt.split_state(state)
            tensors.update(found)
            return document, {name: (t.shape, t.dtype) for name, t in found.items()}

        shared = self.main_only(layout)
        if shared is None:
            return None
        document, shapes = shared
        for name, (shape, dtype) in shapes.items():  # the same order on every rank
            buffer = (tensors[name].to(self.device) if self.is_main
                      else torch.empty(shape, dtype=dtype, device=self.device))
            dist.broadcast(buffer, src=0)
            tensors[name] = buffer.cpu()
        return ckpt.state_from_parts(document, tensors, Path("the state sent by rank 0"))

    def gather(self, value) -> list:
        """Every rank's ``value``, in rank order (on every rank)."""
        if not self.enabled:
            return [value]
        out = [None] * self.world
        dist.all_gather_object(out, value)
        return out

    def check_same(self, values: dict[str, str]) -> None:
        """Refuse, on every rank, a job whose ranks hold other ``values`` (what -> digest) than
        rank 0 (each machine reads its own copy of the data and the config: a mismatch would
        hang or train on other data)."""
        gathered = self.gather(values)
        for what in values:
            if other := [r for r, v in enumerate(gathered) if v[what] != gathered[0][what]]:
                self.close()
                raise XindaError(f"rank {self.rank}: rank(s) {', '.join(map(str, other))} read "
                                 f"other {what} than rank 0: give every machine the same copy "
                                 "(and the same --set options)")

    def close(self) -> None:
        """Leave the process group together: a rank that tears its gloo connections down
        while another still uses them can abort that one ("terminate called without an
        active exception")."""
        if self.owns_group and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

    # ------------------------------------------------------------------ model and data
    def wrap(self, model: torch.nn.Module, find_unused: bool) -> torch.nn.Module:
        """``model`` in DistributedDataParallel (its weights copied from rank 0), or itself."""
        if not self.enabled:
            return model
        ids = [self.device.index] if self.device.type == "cuda" else None
        # buffers are constants (sinusoid tables): not sent at every forward
        newer = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
        buffers = {"forward_sync_buffers" if newer else "broadcast_buffers": False}
        return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=find_unused,
                                       **buffers)

    def share(self, group: list) -> tuple[list, float]:
        """This rank's batches of an update's ``group`` (r, r+W, ...) and its loss weight:
        W (DDP averages), or 0 with the group's first batch when none is left for it."""
        mine = group[self.rank::self.world]
        return (mine, float(self.world)) if mine else (group[:1], 0.0)

    @staticmethod
    def no_sync(net: torch.nn.Module, sync: bool):
        """Accumulate gradients locally (no all-reduce) unless ``sync``."""
        if sync or not isinstance(net, DistributedDataParallel):
            return contextlib.nullcontext()
        return net.no_sync()

    # ------------------------------------------------------------------ random numbers
    def seed_rank(self, seed: int, step: int = 0) -> None:
        """Rank r > 0: its own generator stream, from (seed, r, step); rank 0 keeps its own."""
        if self.rank > 0:
            torch.manual_seed(int(np.random.SeedSequence([seed, self.rank, step])
                                  .generate_state(1)[0]))

    def rng_state(self) -> dict:
        state = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def set_rng_state(self, state: dict) -> None:
        torch.set_rng_state(state["cpu"])
        if "cuda" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda"], self.device)

    def save_rng(self) -> dict | None:
        """Every rank's generator states (collected on all ranks), for a checkpoint; None for
        one process on CPU (its CPU generator is saved anyway). One process on a GPU saves its
        CUDA generator here, which draws the dropout masks there."""
        states = self.gather(self.rng_state())
        needed = self.enabled or self.device.type == "cuda"
        return {"world_size": self.world, "rng": states} if needed else None

    def restore_rng(self, saved: dict | None, cpu_rng: torch.Tensor, seed: int,
                    step: int) -> None:
        """Rank r's generators as saved; rank 0 from ``cpu_rng`` when no state of several ranks
        was saved; otherwise (another number of ranks) derived from (seed, rank, step)."""
        states = (saved or {}).get("rng") or []
        if self.rank < len(states) and (saved["world_size"] == self.world or self.rank == 0):
            self.set_rng_state(states[self.rank])
        elif self.rank == 0:
            torch.set_rng_state(cpu_rng)
        else:
            self.seed_rank(seed, step)
        saved_world = (saved or {}).get("world_size", 1)
        if saved_world != self.world and self.is_main:
            log.warning("resuming with %d rank(s) a run saved with %d: weights, optimizer and "
                        "data position are restored; the random numbers of ranks > 0 are new, "
                        "so the run is not bitwise the one it would have been", self.world,
                        saved_world)


def env_int(name: str, default: int | None = None) -> int:
    """An integer that torchrun puts in the environment; a one-line error when it is missing
    (without a default) or not a number."""
    value = os.environ.get(name)
    if value is None and default is not None:
        return default
    if value is None:
        raise XindaError(f"{name} is not set although WORLD_SIZE > 1: start data-parallel "
                         "training with torchrun (README: distributed training)")
    try:
        return int(value)
    except ValueError:
        raise XindaError(f"{name}={value!r} in the environment: not a whole number") from None


def join_group(backend: str, rank: int, timeout: float) -> None:
    """``init_process_group`` from torchrun's environment; a failure to meet the other ranks
    (no MASTER_ADDR, nobody there before ``timeout``) is a one-line XindaError."""
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    except (RuntimeError, ValueError) as err:  # torch's DistStoreError is a RuntimeError
        reason = re.sub(r"^\[[^\]]*\]\s*", "", " ".join(str(err).split())).split(". ")[0][:200]
        raise XindaError(f"rank {rank}: could not join the other ranks ({reason}): start "
                         "data-parallel training with torchrun") from None


@contextlib.contextmanager
def lost_contact(rank: int) -> Iterator[None]:
    """Within a process group, a failed collective (a rank died or timed out: gloo raises a
    RuntimeError naming itself, NCCL a DistError) becomes a one-line XindaError."""
    try:
        yield
    except RuntimeError as err:
        text = " ".join(str(err).split())
        if not dist.is_initialized() or not (isinstance(err, dist.DistError)
                                             or _COLLECTIVE_FAILED.search(text)):
            raise
        reason = re.sub(r"^\[[^\]]*\]\s*", "", text).split(". ")[0][:200]  # no "[file:line]"
        raise XindaError(f"rank {rank}: lost contact with the other ranks ({reason}); the job "
                         "stops: continue it with --resume (once the error another rank may "
                         "have stopped with is fixed)") from None


_COLLECTIVE_FAILED = re.compile(r"gloo|nccl|connection|timed out|timeout", re.IGNORECASE)


def warn_if_crowded(local_ranks: int) -> None:
    """Log a warning when this machine's ``local_ranks`` processes x this process's torch
    threads exceed its CPU cores."""
    crowded = oversubscription_warning(local_ranks, torch.get_num_threads(), cpu_cores())
    if crowded:
        log.warning(crowded)
