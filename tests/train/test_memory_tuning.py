"""Training tunes CPU memory: oneDNN kernel caches capped (unless the environment sets them), glibc
keeps freed heap memory; and precision "auto" picks what the device runs fast (xinda.device)."""

import os
import platform
import subprocess
import sys

import pytest

from xinda.device import ONEDNN_CACHE_VARIABLES, keep_freed_heap, limit_onednn_caches


def test_limit_sets_both_capacities():
    """Both variables start unset (tests/conftest.py removes them around every test)."""
    limit_onednn_caches(8)
    assert [os.environ[name] for name in ONEDNN_CACHE_VARIABLES] == ["8", "8"]


def test_environment_wins(monkeypatch):
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "100")
    limit_onednn_caches(8)
    assert os.environ["LRU_CACHE_CAPACITY"] == "100"
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "8"


@pytest.mark.parametrize(("amx", "setting", "expected"), [
    (True, "auto", "64"), (False, "auto", "8"), (True, 16, "16"), (False, 0, None)])
def test_auto_cache_size_follows_the_cpu(monkeypatch, amx, setting, expected):
    """AMX kernels are costly to build: 64 entries there (8 rebuilt them at every layer), 8
    elsewhere; a number is taken as given, 0 leaves oneDNN's defaults (variable unset)."""
    from xinda import device

    monkeypatch.setattr(device, "cpu_has_amx", lambda: amx)
    device.tune_training_memory(setting, keep_heap=False)
    assert [os.environ.get(name) for name in ONEDNN_CACHE_VARIABLES] == [expected] * 2


def test_the_config_takes_auto_or_a_count():
    from pydantic import ValidationError

    from xinda.config import TrainConfig

    assert TrainConfig().onednn_cache == "auto"
    assert TrainConfig(onednn_cache=32).onednn_cache == 32
    for bad in (-1, "big"):
        with pytest.raises(ValidationError):
            TrainConfig(onednn_cache=bad)


def test_cpu_flags_come_from_cpuinfo():
    from xinda.device import _cpu_flags, cpu_has_amx, cpu_has_fast_bf16

    flags = _cpu_flags()
    assert cpu_has_amx() == ("amx_bf16" in flags)
    assert cpu_has_fast_bf16() == bool({"avx512_bf16", "amx_bf16"} & flags)
    if sys.platform == "linux":
        assert "fpu" in flags or platform.machine() != "x86_64"  # every x86 CPU has one


GLIBC = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"

# In a fresh process: bytes of a 16 MB malloc that glibc serves by mmap (mallinfo2's hblkhd)
HEAP_PROBE = """
import ctypes, ctypes.util, sys
from xinda.device import keep_freed_heap
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype, libc.malloc.restype = MallInfo2, ctypes.c_void_p
if sys.argv[1] == "keep":
    assert keep_freed_heap()
before = libc.mallinfo2().hblkhd
libc.malloc(16 << 20)
print(libc.mallinfo2().hblkhd - before)
"""


def test_keep_freed_heap_reports_whether_it_applies():
    assert keep_freed_heap() is GLIBC


@pytest.mark.skipif(not GLIBC, reason="mallopt and mallinfo2 are glibc's")
def test_keep_freed_heap_serves_large_blocks_from_the_heap():
    """A 16 MB block comes from mmap by default (above the 128 kB threshold), from the heap
    once ``keep_freed_heap`` has run."""
    def mapped(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", HEAP_PROBE, mode], capture_output=True,
                             text=True, check=True)
        return int(out.stdout)

    assert mapped("default") >= 16 << 20
    assert mapped("keep") == 0


@pytest.mark.parametrize(("major", "expected"), [(7, "fp16"), (8, "bf16"), (9, "bf16")])
def test_auto_precision_on_a_gpu_is_bf16_only_in_hardware(monkeypatch, major, expected):
    """Before: torch's is_bf16_supported() counts emulation, so a T4 or V100 (compute
    capability 7) trained in slow emulated bf16 instead of fp16 (found by review)."""
    import torch

    from xinda.device import pick_precision

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, 0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert pick_precision("auto", torch.device("cuda")) == expected


@pytest.mark.parametrize("name", ["auto", "cuda"])
def test_a_cuda_device_leaves_cudnn_out_of_attention(monkeypatch, name):
    """On an H200, torch 2.11 ran SDPA through cuDNN at 9 ms of CPU per call: picking a CUDA
    device (training, gpu_throughput) turns that backend off; a CPU device leaves it alone."""
    import torch

    from xinda.device import pick_device

    was = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        assert pick_device("cpu").type == "cpu"
        assert torch.backends.cuda.cudnn_sdp_enabled()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        assert pick_device(name).type == "cuda"
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)


def test_checking_a_cuda_device_leaves_cudnn_out_of_attention(monkeypatch):
    """The same for decoding (``Translator.load``, translate, serve), which checks --device:
    monkeypatched so that a CPU-only build passes the check of "cuda"."""
    import torch

    from xinda import device as device_module

    was = torch.backends.cuda.cudnn_sdp_enabled()
    real_empty = torch.empty
    monkeypatch.setattr(device_module.torch, "empty",
                        lambda *a, device=None, **k: real_empty(*a, **k))
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        device_module.check_device("cpu")
        assert torch.backends.cuda.cudnn_sdp_enabled()
        device_module.check_device("cuda")
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
