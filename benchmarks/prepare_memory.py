"""Peak memory of ``xinda prepare`` against corpus size: classical-modern (300k pairs) and the
same training data concatenated k times (default 10x).

    python benchmarks/prepare_memory.py [--scales 1,10] [--workers 1] [--no-reuse-spm]
                                        [--code DIR] [--workdir DIR] [--out PATH]

Each scale runs ``python -m xinda.cli prepare`` (this checkout, or ``--code``) as its own
process under ``/usr/bin/time -v`` with recipes/classical-modern.yaml's data settings, once
training sentencepiece and once reusing the 1x model, and prints peak RSS, wall time and pairs,
then the RSS ratio of the largest scale to 1x: PASS when it is below 2 (streaming: memory does
not follow the corpus), FAIL otherwise. Every scale trains sentencepiece on the same number
of pairs (``--spm-sample``, default the 1x corpus, so 1x is the unsampled result). The k-times
corpus repeats every pair, so deduplication keeps 1x's pairs: the digest set (16 bytes +
overhead per distinct pair) is the same size at every scale. Writes
docs/results/prepare_memory.{json,md} (``--out``). Needs ../shared/data (XINDA_SHARED_DATA).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("XINDA_SHARED_DATA", ROOT.parent / "shared" / "data"))
CORPUS = SHARED / "classical-modern"
LANGS = ("lzh", "zh")


def timed(cmd: list[str], log_path: Path, code: Path) -> dict:
    """Run cmd under /usr/bin/time -v in ``code`` (a xinda checkout: ``python -m`` puts the
    working directory first on the path); return wall seconds and peak RSS (MB)."""
    time_file = log_path.with_suffix(".time")
    start = time.time()
    env = {**os.environ, "PYTHONPATH": str(code)}  # that checkout, whatever is installed
    with log_path.open("w") as log:
        proc = subprocess.run(["/usr/bin/time", "-v", "-o", str(time_file), *cmd], check=False,
                              stdout=log, stderr=subprocess.STDOUT, env=env, cwd=code)
    if proc.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{log_path.read_text()[-2000:]}")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", time_file.read_text())
    return {"wall_s": round(time.time() - start, 1),
            "peak_rss_mb": round(int(rss.group(1)) / 1024, 1) if rss else None}


def repeated_corpus(folder: Path, times: int) -> str:
    """The training corpus concatenated ``times`` times (plain text); its prefix."""
    folder.mkdir(parents=True, exist_ok=True)
    for lang in LANGS:
        with (folder / f"train.{lang}").open("wb") as out:
            for _ in range(times):
                with gzip.open(CORPUS / f"train.{lang}.gz", "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
    return str(folder / "train")


def config(work: Path, spm_sample: int, code: Path) -> Path:
    """recipes/classical-modern.yaml's data settings (no data.spm_sample for a checkout from
    before streaming)."""
    cfg = yaml.safe_load((ROOT / "recipes" / "classical-modern.yaml").read_text())
    data = cfg["data"] | {"train": str(CORPUS / "train"), "valid": str(CORPUS / "valid"),
                          "test": {"test": str(CORPUS / "test")}}
    if "spm_sample" in (code / "xinda" / "config.py").read_text():
        data["spm_sample"] = spm_sample
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump({"data": data, "model": cfg["model"]}))
    return path


def run(work: Path, cfg_path: Path, train: str, label: str, args: argparse.Namespace,
        spm_model: Path | None = None) -> dict:
    """One ``xinda prepare`` of ``train``: sentencepiece trained, or ``spm_model`` reused."""
    out = work / f"bin-{label}"
    cmd = [sys.executable, "-m", "xinda.cli", "prepare", str(cfg_path),
           "--set", f"data.train={train}", "--set", f"data.out_dir={out}"]
    if args.workers > 1:
        cmd += ["--workers", str(args.workers)]
    if spm_model:
        cmd += ["--set", f"data.spm_model={spm_model}"]
    result = timed(cmd, work / f"prepare-{label}.log", args.code)
    report = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["filter_report"]
    return {"spm": "reused" if spm_model else "trained", "pairs_read": report["read"],
            "pairs_kept": report["kept"], **result}


def run_scale(work: Path, cfg_path: Path, times: int, args: argparse.Namespace) -> list[dict]:
    train = str(CORPUS / "train") if times == 1 else repeated_corpus(work / f"x{times}", times)
    runs = [run(work, cfg_path, train, f"x{times}", args)]
    if args.reuse_spm:
        runs.append(run(work, cfg_path, train, f"x{times}-reused", args, work / "bin-x1/spm.model"))
    if times > 1:
        shutil.rmtree(work / f"x{times}")
    return [{"scale": times, **r} for r in runs]


def ratios(runs: list[dict]) -> dict[str, float]:
    """Peak RSS of the largest scale / 1x, per sentencepiece mode."""
    out = {}
    for mode in ("trained", "reused"):
        rss = [r["peak_rss_mb"] for r in runs if r["spm"] == mode]
        if len(rss) > 1:
            out[mode] = round(rss[-1] / rss[0], 3)
    return out


def markdown(result: dict) -> str:
    rows = [f"| {r['scale']}x | {r['spm']} | {r['pairs_read']:,} | {r['pairs_kept']:,} | "
            f"{r['peak_rss_mb']:.0f} | {r['wall_s']:.0f} |" for r in result["runs"]]
    verdicts = ", ".join(f"sentencepiece {k}: **{v:.2f}**" for k, v in result["rss_ratio"].items())
    return "\n".join([
        "# `xinda prepare` peak memory against corpus size", "",
        (f"classical-modern training data concatenated k times; data.spm_sample "
         f"{result['spm_sample']:,}, workers {result['workers']}, code {result['code']}, "
         f"{result['machine']}. Peak RSS is /usr/bin/time's maximum resident set size (of the "
         "largest process)."), "",
        "| scale | sentencepiece | pairs read | pairs kept | peak RSS (MB) | wall (s) |",
        "|---|---|---|---|---|---|", *rows, "",
        (f"RSS ratio {result['runs'][-1]['scale']}x / 1x: {verdicts} -> {result['verdict']} "
         "(below 2 means memory does not follow the corpus)."), "",
        ("The repeated corpus repeats every pair, so deduplication keeps the 1x pairs and its "
         "digest set does not grow; for distinct pairs it grows ~100 bytes per pair "
         "(xinda/data/filtering.py). 'reused' runs take the 1x run's sentencepiece model "
         "(data.spm_model): what is left is the streaming itself."), ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scales", default="1,10", help="comma-separated; must start with 1")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--spm-sample", type=int, default=300_000)
    ap.add_argument("--reuse-spm", action=argparse.BooleanOptionalAction, default=True,
                    help="also run every scale with the 1x sentencepiece model")
    ap.add_argument("--code", type=Path, default=ROOT,
                    help="xinda checkout to run, e.g. an older commit's `git archive`")
    ap.add_argument("--workdir", type=Path, default=ROOT / "runs" / "bench-prepare-memory")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "prepare_memory")
    args = ap.parse_args()
    if not CORPUS.is_dir():
        print(f"skipped: {CORPUS} not found (set XINDA_SHARED_DATA)")
        return
    args.code = args.code.resolve()
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    cfg_path = config(work, args.spm_sample, args.code)
    runs = []
    for times in (int(x) for x in args.scales.split(",")):
        for r in run_scale(work, cfg_path, times, args):
            runs.append(r)
            print(json.dumps(r), flush=True)
    rss_ratio = ratios(runs)
    verdict = "PASS" if max(rss_ratio.values()) < 2 else "FAIL"
    code = "this checkout" if args.code == ROOT else str(args.code)
    result = {"runs": runs, "rss_ratio": rss_ratio, "verdict": verdict, "code": code,
              "spm_sample": args.spm_sample, "workers": args.workers,
              "machine": f"{os.cpu_count()} CPU cores"}
    print(f"RSS ratio largest/1x: {rss_ratio} -> {verdict}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))


if __name__ == "__main__":
    main()
