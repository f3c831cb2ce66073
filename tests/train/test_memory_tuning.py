"""Training tunes CPU memory: oneDNN kernel caches capped (unless the environment sets them), glibc
keeps freed heap memory."""

import os
import platform
import sys

from xinda.device import ONEDNN_CACHE_VARIABLES, keep_freed_heap, limit_onednn_caches


def test_limit_sets_both_capacities(monkeypatch):
    for name in ONEDNN_CACHE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    limit_onednn_caches(8)
    assert [os.environ[name] for name in ONEDNN_CACHE_VARIABLES] == ["8", "8"]


def test_environment_wins(monkeypatch):
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "100")
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    limit_onednn_caches(8)
    assert os.environ["LRU_CACHE_CAPACITY"] == "100"
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "8"


def test_keep_freed_heap_sets_glibc_options():
    assert keep_freed_heap() is (sys.platform == "linux" and platform.libc_ver()[0] == "glibc")
