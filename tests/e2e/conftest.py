"""End-to-end fixtures: a tiny number-words -> digits corpus, prepared and trained once per
session through the real ``xinda`` command line, plus helpers to run the CLI.

Everything is sized for a small shared CPU machine: a 23k-parameter Transformer, 300 training
pairs, ~60 updates, single-threaded torch in every subprocess.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from subprocesses import subprocess_env, xinda_command

from xinda.demo.numbers import write_demo_corpus

PIPELINE_STEPS = 60
TINY_MODEL = {"arch": "transformer", "d_model": 32, "heads": 2, "ffn_dim": 64,
              "encoder_layers": 1, "decoder_layers": 1, "dropout": 0.1}


def run_xinda(*args: str | Path, input: str | None = None, cwd: Path | None = None,
              ok: bool = True, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run ``xinda ARGS``; with ``ok`` assert exit code 0 (showing stderr if not)."""
    proc = subprocess.run([*xinda_command(), *map(str, args)], check=False, input=input,
                          cwd=cwd, capture_output=True, text=True, encoding="utf-8",
                          timeout=timeout, env=subprocess_env())
    if ok:
        assert proc.returncode == 0, f"xinda {' '.join(map(str, args))} failed:\n{proc.stderr}"
    return proc


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """A user error: exit != 0, no traceback, and stderr ends with ONE ``xinda: error:`` line
    containing every fragment. Returns that line."""
    assert proc.returncode != 0, f"expected failure, got 0; stdout:\n{proc.stdout}"
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines, "no error message on stderr"
    last = lines[-1]
    assert last.startswith("xinda: error: "), proc.stderr
    assert sum(line.startswith("xinda: error:") for line in lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in last, f"{fragment!r} not in {last!r}"
    return last


def make_config(path: Path, raw: dict[str, str], data_dir: Path, model_dir: Path,
                **sections: dict) -> Path:
    """Write an experiment YAML for the number task; ``sections`` update data/model/train/decode."""
    cfg = {
        "data": {"src_lang": "words", "tgt_lang": "digits", "train": raw["train"],
                 "valid": raw["valid"], "test": {"test": raw["test"]},
                 "out_dir": str(data_dir), "vocab_size": 60, "normalize": "none"},
        "model": dict(TINY_MODEL),
        "train": {"out_dir": str(model_dir), "max_tokens": 500, "progress": False,
                  "threads": 1, "device": "cpu", "precision": "fp32", "lr": 3e-3,
                  "warmup_steps": 20, "keep_last": 3, "log_every": 5, "valid_bleu": True},
        "decode": {"beam": 5, "max_len_a": 0.0, "max_len_b": 16, "max_input_len": 40},
    }
    for name, values in sections.items():
        cfg[name].update(values)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


@dataclass
class Prepared:
    root: Path
    raw: dict[str, str]  # split -> file prefix ({prefix}.words / {prefix}.digits)
    data_dir: Path
    config: Path  # prepares data_dir; trains into root / "model"
    result: subprocess.CompletedProcess


@dataclass
class Trained:
    prepared: Prepared
    model_dir: Path
    steps: int
    result: subprocess.CompletedProcess


@pytest.fixture(scope="session")
def prepared(tmp_path_factory) -> Prepared:
    """``xinda prepare`` of a 300/20/20-pair corpus (~11 batches of 500 tokens per epoch)."""
    root = tmp_path_factory.mktemp("e2e")
    raw = write_demo_corpus(root / "raw", {"train": 300, "valid": 20, "test": 20})
    config = make_config(root / "config.yaml", raw, root / "data-bin", root / "model")
    result = run_xinda("prepare", config, cwd=root)
    return Prepared(root, raw, root / "data-bin", config, result)


@pytest.fixture(scope="session")
def trained(prepared: Prepared) -> Trained:
    """``xinda train`` for PIPELINE_STEPS updates. Treat the model directory as read-only;
    copy it to change it (tests share it)."""
    result = run_xinda("train", prepared.config, "--set", f"train.max_steps={PIPELINE_STEPS}",
                       cwd=prepared.root)
    return Trained(prepared, prepared.root / "model", PIPELINE_STEPS, result)


@pytest.fixture(scope="session")
def xinda():
    """``xinda(*args, input=None, cwd=None, ok=True)`` -> CompletedProcess (see run_xinda)."""
    return run_xinda


@pytest.fixture(scope="session")
def one_line_error():
    """``one_line_error(proc, *fragments)`` (see assert_one_line_error)."""
    return assert_one_line_error


@pytest.fixture(scope="session")
def write_config():
    """``write_config(path, raw, data_dir, model_dir, **sections)`` (see make_config)."""
    return make_config


@pytest.fixture(scope="session")
def xinda_popen():
    """``xinda_popen(*args, **popen_kwargs)`` -> a running ``xinda ARGS`` (same env as xinda)."""
    def popen(*args: str | Path, **kwargs) -> subprocess.Popen:
        return subprocess.Popen([*xinda_command(), *map(str, args)], env=subprocess_env(),
                                **kwargs)
    return popen
