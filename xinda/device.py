"""Device and numeric precision: bf16 autocast where the hardware runs it fast."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from pathlib import Path

import torch

from xinda.errors import XindaError
from xinda.utils import MAX_THREADS


def pick_device(name: str) -> torch.device:
    """``train.device``: auto (CUDA where there is a GPU), cpu or cuda (refused without one);
    a CUDA device without cuDNN attention (``skip_cudnn_attention``)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    elif name == "cuda" and not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no GPU is visible"
        raise XindaError(f"train.device cuda: no CUDA device here ({why}); use auto or cpu")
    device = torch.device(name)
    if device.type == "cuda":
        skip_cudnn_attention()
    return device


def skip_cudnn_attention() -> None:
    """Leave cuDNN out of the kernels CUDA's ``scaled_dot_product_attention`` may pick (flash,
    memory-efficient and math remain). Torch 2.11 picks cuDNN on an H200, where each call took
    9 ms of CPU (a profile; it seems to plan for every new shape, and batches bring new
    ones): without it, transformer-base trained at 6.5x the tokens/s (synthetic 8k-token
    batches, a new shape at almost every update) and
    decoded beam 5 at 9.4x the sentences/s (docs/results/gpu_*-2026-11-26-h200*; one GPU and
    torch version: ``torch.backends.cuda.enable_cudnn_sdp(True)`` after this undoes it)."""
    torch.backends.cuda.enable_cudnn_sdp(False)


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux's /proc/cpuinfo; none elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    return frozenset(word for line in text.splitlines() if line.startswith("flags")
                     for word in line.partition(":")[2].split())


def cpu_has_fast_bf16() -> bool:
    """AVX-512 BF16 or AMX: bf16 matmuls are ~2.5x fp32 there; elsewhere bf16 is emulated."""
    return bool({"avx512_bf16", "amx_bf16"} & _cpu_flags())


def cpu_has_amx() -> bool:
    """Intel's AMX tiles (Xeon 4th generation on): oneDNN's bf16 kernels use them."""
    return "amx_bf16" in _cpu_flags()


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def oversubscription_warning(processes: int, threads: int, cores: int) -> str | None:
    """A warning when ``processes`` x ``threads`` exceed ``cores``, else None. PyTorch's OpenMP
    threads spin while they wait for work, so the surplus threads take cores from working
    ones: two 2-thread training jobs on 2 cores ran at 0.52x of one job's tokens/s in all,
    against 1.17x with a thread each (``benchmarks/cpu_sharing.py``)."""
    if processes * threads <= cores:
        return None
    fair = max(cores // processes, 1)
    return (f"{processes} process(es) x {threads} threads > {cores} CPU cores: threads that "
            f"wait for a core slow every process down; set train.threads={fair} or "
            "OMP_WAIT_POLICY=PASSIVE")


def pick_precision(name: str, device: torch.device) -> str:
    """Resolve "auto": bf16 on GPUs and CPUs that support it, fp32 otherwise."""
    if name != "auto":
        return name
    if device.type == "cuda":
        # bf16 in hardware from compute capability 8 (A100 on); torch's is_bf16_supported()
        # also counts emulation (T4, V100: slow), where fp16 is the fast half precision
        return "bf16" if torch.cuda.get_device_capability(device)[0] >= 8 else "fp16"
    return "bf16" if cpu_has_fast_bf16() else "fp32"


def autocast(precision: str, device: torch.device):
    """The autocast context of a precision: off for fp32, also inside another autocast (and
    for int8, whose layers say their own types)."""
    if precision in ("fp32", "int8"):
        return torch.autocast(device.type, enabled=False)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


# oneDNN (the CPU bf16 matmuls) caches up to 1024 primitives and ideep up to 1024 computations,
# each holding buffers sized for its shapes. Training meets new shapes at every batch, so the
# two caches grow by gigabytes. Both read their capacity from these variables at first use.
ONEDNN_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def limit_onednn_caches(capacity: int) -> None:
    """Cap oneDNN's primitive cache and ideep's LRU cache at ``capacity`` entries, unless the
    environment sets them already. Takes effect only before the process's first oneDNN op."""
    for name in ONEDNN_CACHE_VARIABLES:
        os.environ.setdefault(name, str(capacity))


# glibc's mallopt parameters, and the largest mmap threshold it accepts (64-bit)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX = -1, -3, 32 << 20


@functools.cache
def keep_freed_heap(trim_threshold: int = 1 << 30) -> bool:
    """glibc: serve allocations up to 32 MB from the heap and give freed heap memory back to
    the OS only beyond ``trim_threshold`` bytes. By default a training step's freed tensors
    go back to the OS and are faulted in again, page by page, at the next step (50-100k page
    faults per step of transformer-small). False where mallopt is not available."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)
                and mallopt(M_TRIM_THRESHOLD, trim_threshold))


def onednn_cache_size(setting: int | str) -> int:
    """``train.onednn_cache``: "auto" is 64 entries on a CPU with AMX, whose kernels are
    costly to build (8 had them rebuilt at every layer: +24-31 % tokens/s for +460 MB of RSS
    on an Intel Xeon, docs/results/onednn-*-intel-2026-11-26.*), else 8 (AMD EPYC: with a new
    batch shape at every update the default 1024 grew to ~1 GB)."""
    if setting == "auto":
        return 64 if cpu_has_amx() else 8
    return int(setting)


def tune_training_memory(onednn_cache: int | str, keep_heap: bool) -> None:
    """``train.onednn_cache`` and ``train.keep_heap``: see the functions above."""
    if size := onednn_cache_size(onednn_cache):
        limit_onednn_caches(size)
    if keep_heap:
        keep_freed_heap()


def check_device(name: str, what: str = "--device") -> None:
    """``--device`` (``what``) must be cpu, cuda or cuda:N, and one this machine has; a CUDA
    device is used without cuDNN attention (``skip_cudnn_attention``)."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):  # (torch's message lists its twenty device types)
        raise XindaError(f"{what} {name}: not a device name; use cpu, cuda or cuda:N") from None
    try:
        if device.type not in ("cpu", "cuda") or (device.type == "cpu" and device.index):
            raise ValueError("xinda runs on cpu, cuda or cuda:N")
        torch.empty(0, device=device)
    except Exception as err:  # noqa: BLE001 - torch raises several types for devices it lacks
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise XindaError(f"{what} {name}: not available here ({reason})") from None
    if device.type == "cuda":
        skip_cudnn_attention()


def set_threads(threads: int) -> None:
    """``--threads``: torch's CPU threads (0: its default)."""
    if not 0 <= threads <= MAX_THREADS:
        raise XindaError(f"--threads must be 0 (torch's default) to {MAX_THREADS}, got {threads}")
    if threads:
        try:
            torch.set_num_threads(threads)
        except (RuntimeError, ValueError) as err:
            raise XindaError(f"--threads {threads}: {err}") from None
