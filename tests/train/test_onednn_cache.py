"""Training caps oneDNN's kernel caches unless the environment already does."""

import os

from xinda.device import ONEDNN_CACHE_VARIABLES, limit_onednn_caches


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
