"""The package's structure, checked like behaviour: the import layers of pyproject.toml hold
(and the check does catch an upward import), ruff is clean and every module stays readable in
one sitting."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400  # ../shared/STYLE.md: each module readable in one sitting


def lint_imports(project: Path) -> subprocess.CompletedProcess:
    """Run import-linter on ``project`` (its pyproject.toml and its copy of the package)."""
    env = {**os.environ, "PYTHONPATH": str(project)}
    command = ("from importlinter.cli import lint_imports_command; lint_imports_command()")
    return subprocess.run([sys.executable, "-c", command, "--no-cache", "--no-logo"],
                          check=False, cwd=project, env=env, capture_output=True, text=True,
                          timeout=120)


def test_import_layers_are_kept():
    proc = lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 kept, 0 broken" in proc.stdout


def test_an_upward_import_breaks_the_contract(tmp_path):
    """The contract is not vacuous: training that imports decoding is reported, by module and
    line."""
    shutil.copytree(ROOT / "xinda", tmp_path / "xinda",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    trainer = tmp_path / "xinda" / "train" / "trainer.py"
    trainer.write_text(trainer.read_text(encoding="utf-8")
                       + "\nfrom xinda.decode.translator import Translator  # noqa\n",
                       encoding="utf-8")
    proc = lint_imports(tmp_path)
    assert proc.returncode != 0
    assert "xinda.train is not allowed to import xinda.decode" in proc.stdout, proc.stdout
    assert "xinda.train.trainer -> xinda.decode.translator" in proc.stdout


def test_every_module_is_in_a_layer():
    """A module outside the contract's layers may import anything (before: averaging.py
    imported upward unnoticed; found by review)."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads TOML")
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    layers = contract["tool"]["importlinter"]["contracts"][0]["layers"]
    named = {part.strip() for layer in layers for part in layer.split("|")}
    top = {f"xinda.{p.stem}" for p in (ROOT / "xinda").iterdir()
           if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert top - named == set()


def test_the_readme_layout_names_every_module():
    """The layout says what each module is for: a new one is named there too."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("## Layout"):].split("```")[1]
    missing = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "xinda").rglob("*.py"))
               if p.stem not in ("__init__", "__main__") and p.name not in layout]
    assert missing == []


def test_ruff_is_clean():
    ruff = shutil.which("ruff") or pytest.skip("ruff is not installed (pip install -e .[test])")
    proc = subprocess.run([ruff, "check", "xinda", "tests", "benchmarks"], check=False, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_module_is_longer_than_max_lines():
    lengths = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
               for p in (ROOT / "xinda").rglob("*.py")}
    assert lengths, "no modules found"
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}


def test_training_and_translating_import_no_rouge():
    """rouge-score (and the nltk it loads) only for ROUGE: the GPU image lacks them, and
    every `xinda train` imported them through the metrics module."""
    code = ("import sys, xinda.cli, xinda.evaluate.metrics, xinda.evaluate.validation; "
            "print(sorted({'rouge_score', 'nltk'} & set(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.strip() == "[]"


def test_the_cli_starts_without_the_server_packages():
    """The GPU image has no FastAPI, Starlette or uvicorn: importing them where the CLI starts
    (an API-key header in serve/settings.py) broke every `xinda` command there (found by
    review). Only `xinda serve` needs them."""
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('fastapi', 'starlette', 'uvicorn'):\n"
            "            raise ImportError(name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "import xinda.cli, xinda.train.trainer, xinda.decode.translator\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
